"""Incremental ``session.turn`` (issue 17): turn cost independent of history length.

1. Warm turn vs history length, through the socket: one session built to 200 messages and one
   to 2 000 (bench.sessions' tool-using cycles: user → read_file call → ~1 KB result → text
   reply, all with API usage), then ``WARM_TURNS`` timed user turns each, in alternating
   blocks of ``BLOCK`` (the first ``SETTLE`` of a block untimed): a known-less call (the whole history comes back; what an old client pays) and a call through
   :class:`qwenctxd.client.SessionHistory` (``known``: only the recorded reply and the new
   question). Client-side round trip including decode and, for ``known``, the splice. The
   goal: p50 with ``known`` at 2 000 messages ≤ 1.2× the p50 at 200; the full reply's ratio
   beside it.
2. 64 clients × 200 turns: 64 connections in ``PROCS`` processes (asyncio clients), each its
   own session, 100 cycles of user turn → tool call → ~1 KB tool result turn → text reply
   (200 ``session.turn`` calls, ending at 400 messages). p50 / p99 of ``session.turn`` over
   all calls, the same shape three ways in one run: the daemon before this issue (``git
   archive`` of ``BEFORE_REV``, when given) with known-less clients, this daemon with known-less
   clients, this daemon with ``known``.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import percentile, save
from bench.sessions import TOOLS, code_blob, make_project
from qwenctxd.client import Client, SessionHistory
from qwenctxd.testing.spawn import SpawnedDaemon

SHORT, LONG = 200, 2000
WARM_TURNS = int(os.environ.get("BENCH_WARM_TURNS", "300"))
CLIENTS = 64
TURNS = 200
PROCS = 4
BEFORE_REV = os.environ.get("BENCH_BEFORE_REV", "8dc4f35")
GOAL_RATIO = 1.2
BLOCK, SETTLE = 50, 5  # full and known turns in alternating blocks; the first few not timed


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def cycle(call: Any, view: SessionHistory | None, sid: str, i: int, timings: list[float]) -> None:
    """One tool-using cycle (4 messages) through a sync client; the turns' times are kept."""
    def turn(params: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        if view is None:
            p = call("session.turn", {"session_id": sid, **params})
        else:
            p = view.turn(_Caller(call), params)
        timings.append(ms_since(t0))
        return p

    p = turn({"kind": "user", "text": f"Question {i}: why does module_{i}.py fail its test?"})
    call_id = f"call_{sid[:8]}_{i}"
    call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"file_path": f"/src/m_{i}.py"})}}]},
        "usage": {"prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 30}})
    p = turn({"kind": "tool_results", "tool_results": [
        {"tool_call_id": call_id, "name": "read_file", "content": code_blob(1024)}]})
    call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": f"module_{i}.py divides by zero; guard it."},
        "usage": {"prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 40}})


class _Caller:
    def __init__(self, call: Any) -> None:
        self.call = call


# -- 1. warm turn vs history length ----------------------------------------------------------
def warm_series(c: Client, cwd: Path, messages: int) -> dict[str, Any]:
    sid = c.call("session.open", {"cwd": str(cwd), "model": "bench-model", "tools": TOOLS,
                                  "window_tokens": 10_000_000})["session_id"]
    view = SessionHistory(sid)
    junk: list[float] = []
    for i in range(messages // 4):
        cycle(c.call, view, sid, i, junk)
    full_ms: list[float] = []
    known_ms: list[float] = []
    sizes: dict[str, int] = {}
    for n in range(WARM_TURNS):
        params = {"kind": "user", "text": f"Follow-up {n}: and the edge case?"}
        use_known = (n // BLOCK) % 2 == 1
        t0 = time.perf_counter()
        if use_known:
            raw = c.call("session.turn", view.params(params))
            view.apply(raw)
            if n % BLOCK >= SETTLE:
                known_ms.append(ms_since(t0))
        else:
            raw = c.call("session.turn", {"session_id": sid, **params})
            if n % BLOCK >= SETTLE:
                full_ms.append(ms_since(t0))
            view.apply(raw)  # keep the copy current (not timed)
        sizes["known" if use_known else "full"] = len(json.dumps(raw))
        assert len(view.messages) >= messages
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"Answer {n}: covered by the new guard."},
            "usage": {"prompt_tokens": raw["usage"]["prompt_tokens"], "completion_tokens": 12}})
    pings = []
    for _ in range(200):
        t0 = time.perf_counter()
        c.call("daemon.ping")
        pings.append(ms_since(t0))
    return {"messages": messages, "full_p50_ms": statistics.median(full_ms),
            "known_p50_ms": statistics.median(known_ms),
            "full_p99_ms": percentile(full_ms, 0.99), "known_p99_ms": percentile(known_ms, 0.99),
            "full_reply_bytes": sizes["full"], "known_reply_bytes": sizes["known"],
            "ping_p50_ms": statistics.median(pings)}


def warm() -> dict[str, Any]:
    d = SpawnedDaemon()
    try:
        cwd = make_project(d.home)
        d.start()
        with d.client(timeout=60) as c:
            short = warm_series(c, cwd, SHORT)
            long = warm_series(c, cwd, LONG)
    finally:
        d.cleanup()
    return {"short": short, "long": long,
            "known_ratio": long["known_p50_ms"] / short["known_p50_ms"],
            "full_ratio": long["full_p50_ms"] / short["full_p50_ms"]}


# -- 2. 64 clients × 200 turns -----------------------------------------------------------------
async def _client_loop(sock: str, cwd: str, known: bool, timings: list[float]) -> None:
    from qwenctxd.client import AsyncClient

    async with AsyncClient(sock) as c:
        sid = (await c.call("session.open", {"cwd": cwd, "model": "bench-model", "tools": TOOLS,
                                             "window_tokens": 10_000_000}))["session_id"]
        view = SessionHistory(sid) if known else None
        for i in range(TURNS // 2):
            for kind in ("user", "tool_results"):
                call_id = f"call_{sid[:8]}_{i}"
                params: dict[str, Any] = (
                    {"kind": "user", "text": f"Question {i}: why does module_{i}.py fail?"}
                    if kind == "user" else
                    {"kind": "tool_results", "tool_results": [
                        {"tool_call_id": call_id, "name": "read_file",
                         "content": code_blob(1024)}]})
                t0 = time.perf_counter()
                if view is not None:
                    p = await view.aturn(c, params)
                else:
                    p = await c.call("session.turn", {"session_id": sid, **params})
                timings.append(ms_since(t0))
                msg: dict[str, Any] = (
                    {"role": "assistant", "content": None, "tool_calls": [{
                        "id": call_id, "type": "function", "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"file_path": f"/src/m_{i}.py"})}}]}
                    if kind == "user" else
                    {"role": "assistant", "content": f"module_{i}.py divides by zero."})
                await c.call("session.record_model", {"session_id": sid, "message": msg, "usage": {
                    "prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 30}})
        await c.call("session.close", {"session_id": sid})


def _proc_main(sock: str, cwd: str, known: bool, clients: int, out: str) -> None:
    timings: list[float] = []

    async def run() -> None:
        await asyncio.gather(*[_client_loop(sock, cwd, known, timings) for _ in range(clients)])

    asyncio.run(run())
    Path(out).write_text(json.dumps(timings))


def load_run(pythonpath: str | None, known: bool) -> dict[str, Any]:
    env = {"PYTHONPATH": pythonpath} if pythonpath else None
    d = SpawnedDaemon(env=env)
    try:
        cwd = make_project(d.home)
        d.start()
        outs = [str(d.root / f"t{i}.json") for i in range(PROCS)]
        ctx = multiprocessing.get_context("spawn")
        t0 = time.perf_counter()
        procs = [ctx.Process(target=_proc_main, args=(str(d.socket), str(cwd), known,
                                                       CLIENTS // PROCS, out)) for out in outs]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        wall = time.perf_counter() - t0
        timings = [t for out in outs for t in json.loads(Path(out).read_text())]
    finally:
        d.cleanup()
    assert len(timings) == CLIENTS * TURNS, len(timings)
    return {"p50_ms": statistics.median(timings), "p99_ms": percentile(timings, 0.99),
            "calls": len(timings), "wall_s": wall}


def before_tree() -> str | None:
    """The daemon package at BEFORE_REV, unpacked in a temp dir (None when git cannot)."""
    if not BEFORE_REV:
        return None
    root = Path(tempfile.mkdtemp(prefix="qcd-before-"))
    here = Path(__file__).resolve().parents[1]
    try:
        archive = subprocess.run(["git", "-C", str(here), "archive", BEFORE_REV, "qwenctxd"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return str(root)


def load() -> dict[str, Any]:
    out: dict[str, Any] = {}
    before = before_tree()
    if before is not None:
        try:
            out["before_daemon_full"] = load_run(before, known=False)
        finally:
            shutil.rmtree(before, ignore_errors=True)
    out["after_daemon_full"] = load_run(None, known=False)
    out["after_daemon_known"] = load_run(None, known=True)
    return out


def main() -> dict[str, Any]:
    only = os.environ.get("BENCH_INCREMENTAL", "warm,load").split(",")
    result: dict[str, Any] = {}
    if "warm" in only:
        w = result["warm"] = warm()
        for k in ("short", "long"):
            s = w[k]
            print(f"warm turn @{s['messages']:>5} msgs: full p50 {s['full_p50_ms']:.3f} ms "
                  f"({s['full_reply_bytes'] / 1024:.0f} KB), known p50 {s['known_p50_ms']:.3f} "
                  f"ms ({s['known_reply_bytes'] / 1024:.0f} KB); ping p50 {s['ping_p50_ms']:.3f}")
        ok = "met" if w["known_ratio"] <= GOAL_RATIO else "NOT met"
        print(f"p50 ratio 2000/200: known {w['known_ratio']:.2f}x (goal <= {GOAL_RATIO}x: {ok}), "
              f"full reply {w['full_ratio']:.2f}x")
    if "load" in only:
        ld = result["load"] = load()
        for name, r in ld.items():
            print(f"{CLIENTS} clients x {TURNS} turns, {name}: session.turn p50 "
                  f"{r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms ({r['wall_s']:.1f} s)")
    save("incremental", result)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
