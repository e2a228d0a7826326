"""The connection layer against a baseline tree, same run: ping (loadgen), warm turns, and
cold/warm ``prompt.system`` (a fresh daemon per tree and round on bench/instructions' fixture).

``python -m bench connection`` needs ``BENCH_BASELINE_TREE`` (a checkout or ``git archive``
of the commit to compare with, e.g. ``git archive main | tar -x -C /tmp/base``). Both daemons
run side by side and are measured in alternating rounds; the figures are ratios new/baseline.
Goal (issues 13/19: per-request tasks, cancellation, bounds): no regression (ratios ~1, within
this VM's noise).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import loadgen_binary, median_of, run_loadgen, save
from bench.instructions import Fixture, timed_call
from bench.sessions import TOOLS, build_history, make_project, timed_ping, timed_turn
from qwenctxd.testing.spawn import SpawnedDaemon

PING = '{"jsonrpc":"2.0","method":"daemon.ping","id":1}'
ROUNDS = 3
TURNS = 30
PROMPT_ROUNDS = 8  # fresh daemons per tree, alternating which tree goes first
PROMPT_CALLS = 1000


def spawn(tree: Path | None) -> SpawnedDaemon:
    d = SpawnedDaemon()
    make_project(d.home)
    if tree is None:
        return d.start(timeout=20)
    # python -m puts the working directory first on sys.path: run from the baseline tree
    return d.start(timeout=20, argv_prefix=("env", "-C", str(tree)))


def warm_turn_ms(d: SpawnedDaemon) -> tuple[list[float], list[float]]:
    cwd = d.home / "proj" / "pkg"
    opened = {"cwd": str(cwd), "model": "bench-model", "window_tokens": 1_000_000,
              "tools": TOOLS}
    turns, pings = [], []
    with d.client() as c:
        sid = c.call("session.open", opened)["session_id"]
        build_history(c, sid)
        for n in range(TURNS):
            ms, _ = timed_turn(c, sid, n)
            turns.append(ms)
            pings.append(timed_ping(c))
        c.call("session.close", {"session_id": sid})
    return turns, pings


def prompt_ms(tree: Path | None) -> tuple[float, float]:
    """(cold first prompt.system, warm p50 of 1000) on a fresh daemon of ``tree``."""
    d = SpawnedDaemon()
    try:
        fx = Fixture(d.home)
        if tree is None:
            d.start(timeout=20)
        else:
            d.start(timeout=20, argv_prefix=("env", "-C", str(tree)))
        params = {"cwd": str(fx.cwd)}
        with d.client() as c:
            cold, _ = timed_call(c, "prompt.system", params)
            for _ in range(100):
                c.call("prompt.system", params)
            warm = statistics.median(timed_call(c, "prompt.system", params)[0]
                                     for _ in range(PROMPT_CALLS))
        return cold, warm
    finally:
        d.cleanup()


def main() -> dict[str, Any]:
    base_env = os.environ.get("BENCH_BASELINE_TREE")
    if not base_env:
        print("skipped: set BENCH_BASELINE_TREE to a tree of the baseline commit")
        return {}
    binary = loadgen_binary()
    if binary is None:
        raise SystemExit("bench connection needs a C compiler (cc) for the load generator")
    trees = {"baseline": Path(base_env), "new": None}
    daemons = {name: spawn(tree) for name, tree in trees.items()}
    cells: dict[str, list[dict[str, Any]]] = {}
    turn: dict[str, list[float]] = {"baseline": [], "new": []}
    sync_ping: dict[str, list[float]] = {"baseline": [], "new": []}
    try:
        for _ in range(ROUNDS):
            for name, d in daemons.items():
                for conns in (1, 32):
                    cells.setdefault(f"{name}/{conns}", []).append(
                        run_loadgen(binary, str(d.socket), conns, PING))
                t, p = warm_turn_ms(d)
                turn[name] += t
                sync_ping[name] += p
            time.sleep(0.2)
    finally:
        for d in daemons.values():
            d.cleanup()
    cold: dict[str, list[float]] = {"baseline": [], "new": []}
    warm: dict[str, list[float]] = {"baseline": [], "new": []}
    for r in range(PROMPT_ROUNDS):
        order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
        for name, tree in order:
            c_ms, w_ms = prompt_ms(tree)
            cold[name].append(c_ms)
            warm[name].append(w_ms)
    summary: dict[str, Any] = {}
    for name in trees:
        summary[f"{name}/cold_prompt_ms"] = statistics.median(cold[name])
        summary[f"{name}/warm_prompt_p50_ms"] = statistics.median(warm[name])
    summary["ratio_cold_prompt"] = (summary["new/cold_prompt_ms"]
                                    / summary["baseline/cold_prompt_ms"])
    summary["ratio_warm_prompt_p50"] = (summary["new/warm_prompt_p50_ms"]
                                        / summary["baseline/warm_prompt_p50_ms"])
    for key, runs in cells.items():
        summary[key] = {"p50_us": median_of(runs, "p50_us"), "rps": median_of(runs, "rps"),
                        "errors": sum(r["errors"] for r in runs)}
    for name in trees:
        summary[f"{name}/warm_turn_p50_ms"] = statistics.median(turn[name])
        summary[f"{name}/client_ping_p50_ms"] = statistics.median(sync_ping[name])
    for conns in (1, 32):
        summary[f"ratio_ping_p50/{conns}"] = (summary[f"new/{conns}"]["p50_us"]
                                              / summary[f"baseline/{conns}"]["p50_us"])
    summary["ratio_warm_turn_p50"] = (summary["new/warm_turn_p50_ms"]
                                      / summary["baseline/warm_turn_p50_ms"])
    path = save("connection", summary)
    print(f"connection layer: new tree vs baseline {base_env} ({ROUNDS} alternating rounds)")
    print(f"{'tree':<10}{'clients':>8}{'p50 µs':>10}{'req/s':>10}{'errors':>8}")
    for conns in (1, 32):
        for name in trees:
            s = summary[f"{name}/{conns}"]
            print(f"{name:<10}{conns:>8}{s['p50_us']:>10.0f}{s['rps']:>10.0f}{s['errors']:>8}")
        print(f"  ping p50 ratio new/baseline, {conns} client(s): "
              f"{summary[f'ratio_ping_p50/{conns}']:.2f}×")
    for name in trees:
        print(f"{name:<10} warm session.turn p50 {summary[f'{name}/warm_turn_p50_ms']:.2f} ms, "
              f"client ping p50 {summary[f'{name}/client_ping_p50_ms']:.3f} ms")
    print(f"  warm turn p50 ratio new/baseline: {summary['ratio_warm_turn_p50']:.2f}×")
    for name in trees:
        print(f"{name:<10} cold prompt.system median of {PROMPT_ROUNDS} "
              f"{summary[f'{name}/cold_prompt_ms']:.1f} ms, warm p50 "
              f"{summary[f'{name}/warm_prompt_p50_ms']:.3f} ms")
    print(f"  cold prompt ratio new/baseline: {summary['ratio_cold_prompt']:.2f}×, "
          f"warm prompt p50: {summary['ratio_warm_prompt_p50']:.2f}×")
    print(f"saved {path}")
    return summary
