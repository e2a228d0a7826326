"""``qwenctl mcp`` overhead: an MCP tool call against the same daemon call made directly.

One spawned daemon with 200 memories saved through ``memory.save``. Baseline: ``memory.recall``
over the Unix socket with the blocking client. Measured: the ``recall_memory`` tool through
the MCP SDK's own stdio client and ``qwenctl mcp`` (JSON-RPC over pipes, pydantic argument
validation, the worker-thread hop to the daemon client). Calls are interleaved, same queries.
Also the start-up: spawning ``qwenctl mcp`` until ``initialize`` has been answered.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from bench.common import percentile, save
from qwenctxd.testing.spawn import SpawnedDaemon

N_DOCS = 200
N_CALLS = 200
N_STARTS = 5
WORDS = ["release", "freeze", "staging", "cluster", "tabs", "indent", "deploy", "review",
         "token", "migration", "schema", "latency", "cache", "index", "backup", "rollout"]


def seed(d: SpawnedDaemon, cwd: str) -> None:
    with d.client() as c:
        for i in range(N_DOCS):
            a, b, e = WORDS[i % 16], WORDS[(i * 7) % 16], WORDS[(i * 11) % 16]
            c.call("memory.save", {"cwd": cwd, "type": "project", "name": f"{a} {b} note {i}",
                                   "description": f"about {a} and {e}",
                                   "body": f"Remember: the {a} of the {b} depends on {e} ({i})."})


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(xs) * 1e3, "p90_ms": percentile(xs, 0.9) * 1e3}


async def measure(d: SpawnedDaemon, cwd: str) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "qwenctl", "mcp", "--cwd", cwd],
                                   env={**d.env, "QWENCTXD_SOCKET": str(d.socket)})
    starts = []
    for _ in range(N_STARTS):
        t0 = time.perf_counter()
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            starts.append(time.perf_counter() - t0)
    direct, via_mcp = [], []
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        with d.client() as c:
            for i in range(N_CALLS + 20):
                q = f"{WORDS[i % 16]} {WORDS[(i * 5) % 16]}"
                t0 = time.perf_counter()
                c.call("memory.recall", {"cwd": cwd, "query": q})
                t1 = time.perf_counter()
                res = await s.call_tool("recall_memory", {"query": q})
                t2 = time.perf_counter()
                assert not res.is_error
                if i >= 20:  # warm-up
                    direct.append(t1 - t0)
                    via_mcp.append(t2 - t1)
    return {"start": stats(starts), "direct": stats(direct), "mcp": stats(via_mcp)}


def main() -> None:
    d = SpawnedDaemon().start()
    try:
        proj = d.home / "proj"
        (proj / ".git").mkdir(parents=True)
        seed(d, str(proj))
        out = asyncio.run(measure(d, str(proj)))
    finally:
        d.cleanup()
    over = out["mcp"]["p50_ms"] - out["direct"]["p50_ms"]
    ratio = out["mcp"]["p50_ms"] / out["direct"]["p50_ms"]
    print(f"{'':<32}{'p50':>9}{'p90':>9}")
    for key, label in (("direct", "memory.recall (socket, direct)"),
                       ("mcp", "recall_memory (MCP over stdio)"),
                       ("start", "qwenctl mcp start → initialized")):
        print(f"{label:<32}{out[key]['p50_ms']:>7.2f}ms{out[key]['p90_ms']:>7.2f}ms")
    print(f"MCP overhead per call: +{over:.2f} ms p50 ({ratio:.2f}× the direct call), "
          f"{N_DOCS} memories, {N_CALLS} calls each, interleaved")
    path = save("mcp", {**out, "overhead_p50_ms": over, "ratio_p50": ratio,
                        "docs": N_DOCS, "calls": N_CALLS, "starts": N_STARTS})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
