"""Against Qwen Code (issue 17): what the real CLI pays before its first model request, and
what qwenctxd pays for the same project tree, side by side in one run.

One scratch HOME and project (bench.sessions' tree: ``~/.qwen/QWEN.md``, a git project with
QWEN.md at the root and in the cwd ``proj/pkg``), used by both sides:

- Qwen Code 0.24 (the cached npm CLI, ``~/.cache/qwenctxd-e2e/qwen-code``): time from starting
  ``qwen -p`` (tests/e2e/qwen_cli.py's command line) to the arrival of its first
  ``/chat/completions`` request at a loopback scripted model (``ScriptedOpenAI``, which
  stamps each request on arrival with the same monotonic clock), ``RUNS`` runs.
- qwenctxd: a fresh daemon per run (start-up not timed), then its first ``prompt.system`` for
  the cwd (cold: nothing parsed or cached yet), then a session in the same cwd and
  ``WARM_TURNS`` warm ``session.turn`` calls through ``SessionHistory`` (``known``), each
  followed by a recorded reply (not timed).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import save
from bench.sessions import TOOLS, make_project
from qwenctxd.client import SessionHistory
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

RUNS = 5
WARM_TURNS = 60


def qwen_binary() -> Path:
    path = Path.home() / ".cache" / "qwenctxd-e2e" / "qwen-code" / "node_modules" / ".bin" / "qwen"
    if not path.exists():
        raise SystemExit(f"the Qwen Code CLI is not cached at {path} (run tests/e2e/prepare.sh)")
    return path


def qwen_first_request(home: Path, cwd: Path) -> float:
    """Seconds from starting ``qwen -p`` to its first model request."""
    import subprocess

    from tests.e2e.qwen_cli import QwenCli

    with ScriptedOpenAI(default=Reply(content="done")) as stub:
        cli = QwenCli(home=home, cwd=cwd, base_url=stub.base_url)
        cmd = [str(qwen_binary()), "--auth-type", "openai", "-m", cli.model, "-p", "say done"]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=cwd, env=cli.env(), capture_output=True, text=True,
                              timeout=180, stdin=subprocess.DEVNULL)
        reqs = stub.chat_requests
    if not reqs:
        raise SystemExit(f"qwen made no model request (exit {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    return min(r.received_at for r in reqs) - t0


def qwenctxd_side(d: SpawnedDaemon, cwd: Path) -> tuple[float, list[float]]:
    """(cold prompt.system seconds, warm session.turn seconds) on a freshly started daemon."""
    with d.client(timeout=60) as c:
        t0 = time.perf_counter()
        c.call("prompt.system", {"cwd": str(cwd), "model": "bench-model"})
        cold = time.perf_counter() - t0
        sid = c.call("session.open", {"cwd": str(cwd), "model": "bench-model", "tools": TOOLS,
                                      "window_tokens": 1_000_000})["session_id"]
        view = SessionHistory(sid)
        warm: list[float] = []
        for n in range(WARM_TURNS + 5):
            t0 = time.perf_counter()
            p = view.turn(c, {"kind": "user", "text": f"question {n}"})
            if n >= 5:
                warm.append(time.perf_counter() - t0)
            c.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": f"answer {n}"},
                "usage": {"prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 5}})
    return cold, warm


def main() -> dict[str, Any]:
    qwen_s: list[float] = []
    cold_s: list[float] = []
    warm_s: list[float] = []
    for _ in range(RUNS):
        d = SpawnedDaemon()
        try:
            cwd = make_project(d.home)
            qwen_s.append(qwen_first_request(d.home, cwd))
            d.start()
            cold, warm = qwenctxd_side(d, cwd)
            cold_s.append(cold)
            warm_s.extend(warm)
        finally:
            d.cleanup()
    r = {"runs": RUNS, "qwen_first_request_s": statistics.median(qwen_s),
         "qwen_first_request_all_s": qwen_s,
         "prompt_system_cold_ms": statistics.median(cold_s) * 1000,
         "prompt_system_cold_all_ms": [x * 1000 for x in cold_s],
         "session_turn_warm_p50_ms": statistics.median(warm_s) * 1000}
    print(f"qwen -p start to first model request: median {r['qwen_first_request_s']:.3f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in qwen_s)})")
    print(f"qwenctxd cold prompt.system: median {r['prompt_system_cold_ms']:.2f} ms; warm "
          f"session.turn (known) p50 {r['session_turn_warm_p50_ms']:.3f} ms")
    print(f"ratio: qwen start-up / cold prompt.system = "
          f"{r['qwen_first_request_s'] * 1000 / r['prompt_system_cold_ms']:.0f}x, "
          f"/ warm session.turn = "
          f"{r['qwen_first_request_s'] * 1000 / r['session_turn_warm_p50_ms']:.0f}x")
    save("vs_qwen", r)
    return r


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
