"""``python -m bench proxy``: what ``qwenctl proxy`` adds to a streamed chat request.

A spawned daemon, a ScriptedOpenAI upstream and the proxy as a real process. Time to first
byte (first SSE chunk) of a streamed request, through the proxy and straight to the same
upstream, alternating request by request in one run: for a new conversation (session.open +
turn + prompt sections) and for turns of one growing conversation. Then the throughput of 32
concurrent streamed conversations (5 turns each) through the proxy against the same load
sent straight upstream. Goal: ≤ 5 ms added at p50 on loopback.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx2 as httpx

from bench.common import percentile, save
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SYSTEM = "You are BenchBot."
REPLY = Reply(content="A streamed answer of a few words, sent in small chunks. " * 4,
              chunk_chars=16)
N = int(os.environ.get("BENCH_PROXY_N", "150"))


def start_proxy(d: SpawnedDaemon, upstream: str, cwd: str) -> tuple[subprocess.Popen[bytes],
                                                                     str, str]:
    env = {**d.env, "QWENCTXD_SOCKET": str(d.socket)}
    log = d.root / "proxy.log"
    proc = subprocess.Popen([sys.executable, "-m", "qwenctl", "proxy", "--no-autostart",
                             "--listen", "127.0.0.1:0", "--upstream", upstream, "--cwd", cwd],
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"listening on (http://\S+/v1)", log.read_text(errors="replace"))
        if m:
            key = subprocess.run([sys.executable, "-m", "qwenctl", "proxy", "key"], env=env,
                                 capture_output=True, text=True, check=True).stdout.strip()
            return proc, m.group(1), key
        time.sleep(0.05)
    raise TimeoutError(log.read_text())


def ttfb(client: httpx.Client, url: str, key: str, messages: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", url + "/chat/completions", headers={
            "authorization": f"Bearer {key}"}, json={"model": "bench", "stream": True,
                                                     "messages": messages}) as r:
        it = r.iter_raw()
        next(it)
        first = time.perf_counter() - t0
        for _ in it:
            pass
    return first * 1000


def stats(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(samples), 3),
            "p90_ms": round(percentile(samples, 0.9), 3),
            "p99_ms": round(percentile(samples, 0.99), 3)}


async def conversations(url: str, key: str, n_conv: int, turns: int) -> float:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as c:
        async def one(i: int) -> None:
            msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
            for t in range(turns):
                msgs.append({"role": "user", "content": f"conv {i} {time.time_ns()} turn {t}"})
                async with c.stream("POST", url + "/chat/completions", headers={
                        "authorization": f"Bearer {key}"}, json={
                        "model": "bench", "stream": True, "messages": msgs}) as r:
                    async for _ in r.aiter_raw():
                        pass
                msgs.append({"role": "assistant", "content": REPLY.content})

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n_conv)))
        return n_conv * turns / (time.perf_counter() - t0)


def main() -> None:
    with ScriptedOpenAI(default=REPLY) as stub:
        d = SpawnedDaemon()  # no side-query model: no extraction competing for the CPU
        d.start()
        proj = d.root / "proj"
        proj.mkdir()
        (proj / "QWEN.md").write_text("Bench project instructions.\n")
        proc, purl, key = start_proxy(d, stub.base_url, str(proj))
        try:
            results = run(stub.base_url, purl, key)
        finally:
            proc.terminate()
            proc.wait(10)
            d.cleanup()
    path = save("proxy", results)
    for k, v in results.items():
        print(f"{k}: {v}")
    print(f"saved {path}")


def run(direct_url: str, proxy_url: str, key: str) -> dict[str, Any]:
    out: dict[str, Any] = {"n": N}
    with httpx.Client(timeout=60) as c:
        for _ in range(10):  # warm up both paths
            m = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "warm"}]
            ttfb(c, direct_url, "x", m)
            ttfb(c, proxy_url, key, [*m[:1], {"role": "user", "content": f"w{time.time_ns()}"}])
        direct, proxied = [], []
        for i in range(N):  # a new conversation per request
            m = [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": f"question {i} {time.time_ns()}"}]
            direct.append(ttfb(c, direct_url, "x", m))
            proxied.append(ttfb(c, proxy_url, key, m))
        out["new_conversation_direct"] = stats(direct)
        out["new_conversation_proxy"] = stats(proxied)
        out["new_conversation_added_p50_ms"] = round(
            statistics.median(proxied) - statistics.median(direct), 3)
        direct, proxied = [], []
        msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for i in range(N):  # one conversation, growing turn by turn
            msgs.append({"role": "user", "content": f"turn {i}"})
            direct.append(ttfb(c, direct_url, "x", msgs))
            proxied.append(ttfb(c, proxy_url, key, msgs))
            msgs.append({"role": "assistant", "content": REPLY.content})
        out["same_conversation_direct"] = stats(direct)
        out["same_conversation_proxy"] = stats(proxied)
        out["same_conversation_added_p50_ms"] = round(
            statistics.median(proxied) - statistics.median(direct), 3)
    direct_rps = asyncio.run(conversations(direct_url, "x", 32, 5))
    proxy_rps = asyncio.run(conversations(proxy_url, key, 32, 5))
    out["concurrent32_direct_req_per_s"] = round(direct_rps, 1)
    out["concurrent32_proxy_req_per_s"] = round(proxy_rps, 1)
    out["concurrent32_ratio"] = round(proxy_rps / direct_rps, 3)
    return out
