"""Deadlines and failure accounting through the socket, against a hung or failing endpoint.

A spawned daemon with ``model.timeout_s`` = 1 s: an automatic compaction inside
``session.turn`` gives up at its deadline, falls back to micro-compaction and says so; an
extraction against a hung endpoint is counted as failed with its cause in ``daemon.status``,
and ``last_extract_at`` does not move; ``session.compress`` failure carries its cause.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read",
                                             "parameters": {"type": "object", "properties": {
                                                 "file_path": {"type": "string"}}}}}]


@pytest.fixture
def hung() -> Any:
    with ScriptedOpenAI(strict_chat=True, default=Reply(content="late", delay_s=30)) as s:
        yield s


def env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "k", "QWENCTXD_MODEL_TIMEOUT_S": "1"}


def tool_round(d: SpawnedDaemon, sid: str, n: int, size: int) -> dict[str, Any]:
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"read file {n}"})
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}", "type": "function",
        "function": {"name": "read_file", "arguments": "{}"}}]}})
    started = time.monotonic()
    p = d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": f"c{n}", "name": "read_file", "content": "x = 1\n" * size}]})
    p["took_s"] = time.monotonic() - started
    d.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                     "content": "ok"}})
    return p


def test_auto_compaction_gives_up_at_its_deadline_and_falls_back(spawn, hung) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=env(hung)).start()
    proj = d.home / "p"
    (proj / ".git").mkdir(parents=True)
    sid = d.call("session.open", {"cwd": str(proj), "model": "stub-model", "tools": TOOLS,
                                  "window_tokens": 20_000})["session_id"]
    events: list[dict[str, Any]] = []
    for n in range(12):
        p = tool_round(d, sid, n, 1_000)
        events += p["events"]
        assert p["took_s"] < 1 + 3, p["took_s"]  # the 1 s deadline, plus generous slack
        if any(e["type"] == "compression_fallback" for e in events):
            break
    failed = [e for e in events if e["type"] == "compression_failed"]
    assert failed and failed[0]["cause"] == "timeout", events
    fallback = [e for e in events if e["type"] == "compression_fallback"]
    assert fallback and fallback[0]["fallback"] == "micro_compaction", events
    assert fallback[0]["cause"] == "timeout"

    res = d.call("session.compress", {"session_id": sid, "mode": "full"})
    assert res["status"] == "failed_model_error"
    assert [e["cause"] for e in res["events"] if e["type"] == "compression_failed"] == ["timeout"]


def test_a_failed_extraction_counts_as_failed_with_its_cause(spawn, hung) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=env(hung)).start()
    proj = d.home / "p"
    (proj / ".git").mkdir(parents=True)
    sid = d.call("session.open", {"cwd": str(proj), "model": "stub-model", "tools": TOOLS,
                                  "window_tokens": 100_000})["session_id"]
    tool_round(d, sid, 1, 5)
    started = time.monotonic()
    assert d.call("memory.extract", {"session_id": sid})["scheduled"] is True
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"] is True
    assert time.monotonic() - started < 1 + 5
    bg = d.call("daemon.status")["background"]
    assert bg["failed_by_kind"].get("extract", 0) >= 1, bg  # the turn's own run and ours
    failures = [f for f in bg["recent_failures"] if f["kind"] == "extract"]
    assert failures and all(f["cause"] == "timeout" for f in failures), failures
    assert bg["completed"] + bg["failed"] >= len(failures)
    assert bg["last_extract_at"] is None
    model = d.call("daemon.status")["model"]
    assert model["deadlines"]["extract"] == 1 and model["quirks"] == []
