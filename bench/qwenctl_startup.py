"""qwenctl start-up: ``qwenctl status`` wall time next to a bare ``python -c pass``.

Issue: "`qwenctl status` wall time (process start to exit) side by side with `python -c pass`.
Goal: ≤ 150 ms over the bare interpreter start (lazy imports; rich imported only on a TTY)".

A spawned daemon (scratch HOME, no model) answers; each sample is one fresh process, timed
from spawn to exit with its output piped (so never a TTY): ``python -m qwenctl status
--json``, ``python -m qwenctl status`` (the plain table) and ``python -c pass``. The three
run interleaved, in a rotating order, ``RUNS`` times each after ``WARMUP`` untimed rounds, so
machine noise and page-cache state hit all of them alike. The verdict takes the median of each
qwenctl command minus the median of the bare interpreter. ``python -X importtime`` of the
``--json`` run gives the heaviest imports (listed when the goal is missed) and shows whether
rich was imported by a piped run.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import percentile, save
from qwenctxd.testing.spawn import SpawnedDaemon

RUNS = 25
WARMUP = 3
GOAL_MS = 150.0
TOP = 12

COMMANDS: dict[str, list[str]] = {
    "status_json": [sys.executable, "-m", "qwenctl", "status", "--json"],
    "status_piped": [sys.executable, "-m", "qwenctl", "status"],
    "python_pass": [sys.executable, "-c", "pass"],
}


def run_once(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{argv} exited {r.returncode}: {r.stderr.decode()[-500:]}")
    return elapsed * 1000


def import_profile(env: dict[str, str], args: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """(imports by self time, heaviest first; was rich imported) for ``qwenctl ARGS``."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "qwenctl", *args], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True)
    rows = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:"):].split("|", 2)
        rows.append({"module": name.strip(), "self_ms": int(self_us) / 1000,
                     "cumulative_ms": int(cumulative_us) / 1000,
                     "depth": (len(name) - len(name.lstrip())) // 2})
    rich = any(x["module"] == "rich" or x["module"].startswith("rich.") for x in rows)
    return sorted(rows, key=lambda x: -x["self_ms"]), rich


def main() -> None:
    d = SpawnedDaemon()
    try:
        d.start(timeout=20)
        env = dict(d.env)
        samples: dict[str, list[float]] = {k: [] for k in COMMANDS}
        names = list(COMMANDS)
        for i in range(WARMUP + RUNS):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                ms = run_once(COMMANDS[name], env)
                if i >= WARMUP:
                    samples[name].append(ms)
        imports, rich_json = import_profile(env, ["status", "--json"])
        _, rich_piped = import_profile(env, ["status"])
    finally:
        d.cleanup()

    stats = {k: {"median_ms": statistics.median(v), "p10_ms": percentile(v, 0.1),
                 "p90_ms": percentile(v, 0.9), "min_ms": min(v), "runs": len(v)}
             for k, v in samples.items()}
    base = stats["python_pass"]["median_ms"]
    over = {k: stats[k]["median_ms"] - base for k in ("status_json", "status_piped")}
    met = all(v <= GOAL_MS for v in over.values())
    top_cumulative = sorted((x for x in imports if x["depth"] == 1),
                            key=lambda x: -x["cumulative_ms"])[:TOP]

    print(f"{'command':<34}{'median':>10}{'p10':>9}{'p90':>9}{'over bare':>12}")
    labels = {"status_json": "qwenctl status --json",
              "status_piped": "qwenctl status (piped)",
              "python_pass": "python -c pass (baseline)"}
    for k, st in stats.items():
        extra = f"{over[k]:>+10.1f}ms" if k in over else f"{'-':>12}"
        print(f"{labels[k]:<34}{st['median_ms']:>8.1f}ms{st['p10_ms']:>7.1f}ms"
              f"{st['p90_ms']:>7.1f}ms{extra}")
    print(f"goal: ≤ {GOAL_MS:.0f} ms over the bare interpreter -> "
          + ("met" if met else "NOT met")
          + f" (worst: +{max(over.values()):.1f} ms, {RUNS} runs each, interleaved)")
    print(f"rich imported: piped status {'yes' if rich_piped else 'no'}, "
          f"--json {'yes' if rich_json else 'no'}")
    if not met:
        print("heaviest imports of `qwenctl status --json` (python -X importtime):")
        print("  top-level, by cumulative time:")
        for x in top_cumulative:
            print(f"    {x['cumulative_ms']:>7.1f} ms  {x['module']}")
        print("  by self time:")
        for x in imports[:TOP]:
            print(f"    {x['self_ms']:>7.1f} ms  {x['module']}")
    path = save("qwenctl_startup", {
        "goal_ms_over_bare": GOAL_MS, "met": met, "runs": RUNS, "warmup": WARMUP,
        "python": sys.executable, "stats": stats, "over_bare_ms": over,
        "rich_imported": {"status_piped": rich_piped, "status_json": rich_json},
        "imports_top_self": imports[:TOP], "imports_top_cumulative": top_cumulative,
    })
    print(f"saved {path}")


if __name__ == "__main__":
    main()
