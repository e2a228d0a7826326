"""Deadlines against a hung endpoint: the longest time each feature held a call, beside its deadline.

One spawned daemon (``SpawnedDaemon``, scratch HOME) whose model endpoint is a ``ScriptedOpenAI``
that accepts every request and never answers in time (each reply delayed 60 s).
``model.timeout_s`` = ``TIMEOUT_S``; ``[model.deadlines]`` sets ``recap_s`` to a different value
so an explicit per-feature deadline is measured too. For each feature, ``ROUNDS`` calls through
the socket, timed client-side:

* ``session.compress`` (manual compression), ``session.recap``, ``session.project_summary``,
  ``memory.recall`` (selector → lexical fallback), ``memory.forget_candidates`` (→ term match);
* an automatic compaction inside ``session.turn`` (the tool-results turn that crosses the auto
  threshold; only rounds where a compaction actually ran are counted);
* background runs: ``memory.extract`` and ``speculation.start`` — timed from scheduling until
  ``daemon.drain`` / ``speculation.status`` shows the run finished.

Reported per feature: the configured deadline, the longest hold, the ratio hold / deadline (the
goal: ≤ 1 plus the socket and process overhead; before issue 12, a 6 s timeout let
``session.compress`` hold 120 s). Same run, same machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

TIMEOUT_S = 2.0
RECAP_S = 1.0
ROUNDS = 3
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read",
                                             "parameters": {"type": "object", "properties": {
                                                 "file_path": {"type": "string"}}}}}]


def _tool_round(d: SpawnedDaemon, sid: str, n: int, size: int) -> tuple[dict[str, Any], float]:
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"read {n}"})
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}", "type": "function",
        "function": {"name": "read_file", "arguments": "{}"}}]}})
    started = time.monotonic()
    p = d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": f"c{n}", "name": "read_file", "content": "x = 1\n" * size}]})
    took = time.monotonic() - started
    d.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                     "content": "ok"}})
    return p, took


def _timed(fn: Callable[[], Any]) -> float:
    started = time.monotonic()
    try:
        fn()
    except Exception:  # noqa: BLE001 - a ModelUnavailable answer is a defined result too
        pass
    return time.monotonic() - started


def main() -> None:
    stub = ScriptedOpenAI(strict_chat=True, default=Reply(content="late", delay_s=60)).start()
    d = SpawnedDaemon()
    cfg = d.home / ".config" / "qwenctxd"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(
        f'[model]\nbase_url = "{stub.base_url}"\nmodel = "stub-model"\napi_key = "k"\n'
        f"timeout_s = {TIMEOUT_S}\n\n[model.deadlines]\nrecap_s = {RECAP_S}\n")
    d.start()
    holds: dict[str, list[float]] = {}
    try:
        proj = d.home / "proj"
        (proj / ".git").mkdir(parents=True)
        deadlines = d.call("daemon.status")["model"]["deadlines"]
        root = Path(d.call("memory.status", {"cwd": str(proj)})["roots"]["project"])
        root.mkdir(parents=True, exist_ok=True)
        (root / "deploys.md").write_text("---\nname: Deploy process\ndescription: how we deploy "
                                         "(canary first)\ntype: project\n---\n\nCanary first.\n")
        for r in range(ROUNDS):
            sid = d.call("session.open", {"cwd": str(proj), "model": "stub-model",
                                          "tools": TOOLS, "window_tokens": 20_000})["session_id"]
            for n in range(12):
                p, took = _tool_round(d, sid, 100 * r + n, 1_000)
                if any(e["type"] == "compression_failed" for e in p["events"]):
                    holds.setdefault("compress (auto, in session.turn)", []).append(took)
                    break
            calls: dict[str, tuple[str, dict[str, Any]]] = {
                "compress": ("session.compress", {"session_id": sid, "mode": "full"}),
                "recap": ("session.recap", {"session_id": sid}),
                "project_summary": ("session.project_summary", {"session_id": sid}),
                "recall": ("memory.recall", {"cwd": str(proj), "query": "how do we deploy"}),
                "forget": ("memory.forget_candidates", {"cwd": str(proj),
                                                        "query": "forget deploys"}),
            }
            for name, (method, params) in calls.items():
                holds.setdefault(name, []).append(
                    _timed(lambda m=method, p=params: d.call(m, p)))

            def extract(sid: str = sid) -> None:
                d.call("memory.extract", {"session_id": sid})
                d.call("daemon.drain", {"timeout_s": 60})

            holds.setdefault("extract", []).append(_timed(extract))

            def speculate(sid: str = sid) -> None:
                spec = d.call("speculation.start", {"session_id": sid, "suggestion": "add a test"})
                while d.call("speculation.status", {"speculation_id": spec["speculation_id"]}
                             )["status"]["state"] in ("pending", "running"):
                    time.sleep(0.02)

            holds.setdefault("speculation", []).append(_timed(speculate))
        failed = d.call("daemon.status")["background"]
    finally:
        d.stop()
        d.cleanup()
        stub.stop()
    print(f"endpoint: every reply delayed 60 s; model.timeout_s = {TIMEOUT_S:g}, "
          f"model.deadlines.recap_s = {RECAP_S:g}; {ROUNDS} rounds")
    print(f"{'feature':34} {'deadline s':>10} {'longest hold s':>15} {'hold/deadline':>14}")
    for name, values in holds.items():
        key = name.split(" ")[0]
        deadline = float(deadlines.get(key, TIMEOUT_S))
        longest = max(values)
        print(f"{name:34} {deadline:10.2f} {longest:15.2f} {longest / deadline:14.2f}")
    print(f"background: failed={failed['failed']} by kind={failed['failed_by_kind']}")


if __name__ == "__main__":
    main()
