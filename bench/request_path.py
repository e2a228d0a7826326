"""The request path against an earlier tree, in the same run: ping, warm turn, cold prompt.

A redesign of the request path must not cost speed. This bench exports a baseline revision of
this repository (``QWENCTXD_BASELINE_REV``, default: the last commit before the request-path
redesign) with ``git archive`` and runs the daemon from it and from this checkout, in
alternating rounds on the same interpreter and dependencies (``PYTHONPATH`` picks the tree), so
machine noise falls on both alike:

* ping — ``daemon.ping`` round trips on one connection, p50 / p99;
* warm turn — ``session.turn`` of a user message plus its recorded reply on a session that has
  grown to 100 turns, p50 / p99;
* cold prompt — the first ``prompt.system`` of a fresh daemon (15 instruction files up the
  cwd's chain), median of the rounds.

The figures are ratios current / baseline; "within noise" means each ratio's distance from 1
is no larger than the spread between the baseline's own rounds.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import percentile, save
from qwenctxd.client import Client
from qwenctxd.testing.spawn import SpawnedDaemon

REPO = Path(__file__).resolve().parents[1]
#: the last commit before issue 26 (the request-path redesign) started landing
DEFAULT_BASELINE = "40e629c"
ROUNDS = 4
PINGS = 2000
WARM_TURNS = 100


def export_tree(rev: str) -> Path:
    """``rev`` of this repository exported into a scratch directory."""
    out = Path(tempfile.mkdtemp(prefix="qcb-base-", dir="/tmp"))
    archive = out / "tree.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), rev],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(out / "tree", filter="data")
    archive.unlink()
    return out


def _daemon(tree: Path) -> SpawnedDaemon:
    return SpawnedDaemon(env={"PYTHONPATH": os.pathsep.join(
        [str(tree), str(tree / "clients" / "qwenctl")])})


def _project(root: Path) -> Path:
    """A cwd 15 levels deep with an instruction file on every level (cold prompt input)."""
    cwd = root / "proj"
    (cwd / ".git").mkdir(parents=True)
    for depth in range(15):
        (cwd / "QWEN.md").write_text(f"# level {depth}\nKeep it short at level {depth}.\n")
        cwd = cwd / f"d{depth}"
        cwd.mkdir()
    return cwd


def one_round(tree: Path) -> dict[str, Any]:
    d = _daemon(tree)
    try:
        cwd = _project(d.root)
        d.start()
        with Client(d.socket) as c:
            t = time.perf_counter()
            c.call("prompt.system", {"cwd": str(cwd)})
            cold_ms = (time.perf_counter() - t) * 1000
            pings = []
            for _ in range(PINGS):
                t = time.perf_counter()
                c.call("daemon.ping")
                pings.append((time.perf_counter() - t) * 1e6)
            sid = c.call("session.open", {"cwd": str(cwd), "model": "m"})["session_id"]
            turns = []
            for i in range(WARM_TURNS):
                t = time.perf_counter()
                c.call("session.turn", {"session_id": sid, "kind": "user",
                                        "text": f"question {i}: what does module {i} do?"})
                turns.append((time.perf_counter() - t) * 1000)
                c.call("session.record_model", {"session_id": sid, "message": {
                    "role": "assistant", "content": f"module {i} parses the input, twice."}})
        warm = turns[WARM_TURNS // 5:]  # the first turns build caches
        return {"cold_prompt_ms": cold_ms,
                "ping_p50_us": statistics.median(pings), "ping_p99_us": percentile(pings, 0.99),
                "turn_p50_ms": statistics.median(warm), "turn_p99_ms": percentile(warm, 0.99)}
    finally:
        d.cleanup()


def _spread(values: list[float]) -> float:
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def main() -> dict[str, Any]:
    rev = os.environ.get("QWENCTXD_BASELINE_REV", DEFAULT_BASELINE)
    base_dir = export_tree(rev)
    current = REPO
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    try:
        for _ in range(ROUNDS):
            runs["baseline"].append(one_round(base_dir / "tree"))
            runs["current"].append(one_round(current))
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
    keys = ["ping_p50_us", "ping_p99_us", "turn_p50_ms", "turn_p99_ms", "cold_prompt_ms"]
    summary: dict[str, Any] = {"baseline_rev": rev, "rounds": runs}
    print(f"request path: this tree vs {rev}, {ROUNDS} alternating rounds "
          f"(medians of the rounds)")
    print(f"{'figure':<18} {'baseline':>10} {'current':>10} {'ratio':>7} {'noise':>7}  verdict")
    for key in keys:
        b = [r[key] for r in runs["baseline"]]
        c = [r[key] for r in runs["current"]]
        ratio = statistics.median(c) / statistics.median(b)
        noise = max(_spread(b), 0.05)
        verdict = "within noise" if abs(ratio - 1) <= noise else (
            "faster" if ratio < 1 else "SLOWER")
        summary[key] = {"baseline": statistics.median(b), "current": statistics.median(c),
                        "ratio": ratio, "noise": noise, "verdict": verdict}
        print(f"{key:<18} {statistics.median(b):>10.1f} {statistics.median(c):>10.1f} "
              f"{ratio:>7.2f} {noise:>7.2f}  {verdict}")
    save("request_path", summary)
    return summary


if __name__ == "__main__":
    main()
