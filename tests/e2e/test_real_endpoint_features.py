"""Every model-backed feature against a real llama.cpp server (SmolLM2-135M, n_ctx 8192).

One daemon, pointed at the server through config.toml (profile ``llamacpp``, the window, short
deadlines), drives a session with client tools (assistant tool calls with empty content, tool
results) through automatic and manual compression, recall, forget, extraction, dream, recap,
project summary and speculation. The model is far too small for useful content, so the suite
asserts structure only: the server rejected no request (its access log has no non-2xx chat
completion), every feature reached a defined result within its deadline, and the history the
daemon hands back stayed a valid conversation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until
from tests.e2e.llama_server import MODEL_ALIAS, LlamaServer

pytestmark = pytest.mark.real_endpoint

DEADLINES = {"compress_s": 25, "recap_s": 20, "project_summary_s": 30, "recall_s": 15,
             "forget_s": 15, "extract_s": 40, "dream_s": 40, "speculation_s": 30,
             "skill_review_s": 30}
SLACK_S = 8.0  # process, socket and scheduling overhead on a loaded 2-core machine
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project.",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}},
                   "required": ["file_path"]}}}]
COMPRESSION_STATUSES = {"compressed", "noop", "failed_empty_summary", "failed_output_truncated",
                        "failed_model_error", "failed_inflated"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with LlamaServer(tmp_path_factory.mktemp("llama") / "server.log") as server:
        yield server


@pytest.fixture
def real_daemon(llama: LlamaServer, tmp_path: Path) -> Iterator[SpawnedDaemon]:
    d = SpawnedDaemon(root=tmp_path / "d")
    cfg = d.home / ".config" / "qwenctxd"
    cfg.mkdir(parents=True)
    deadlines = "\n".join(f"{k} = {v}" for k, v in DEADLINES.items())
    (cfg / "config.toml").write_text(
        f'[model]\nbase_url = "{llama.base_url}"\nmodel = "{MODEL_ALIAS}"\napi_key = "none"\n'
        f'timeout_s = 45\nprofile = "llamacpp"\ncontext_window = {llama.n_ctx}\n\n'
        f"[model.deadlines]\n{deadlines}\n")
    d.start()
    try:
        yield d
    finally:
        d.stop()
        d.cleanup()


def call(d: SpawnedDaemon, method: str, params: Any = None) -> Any:
    """One call with a client timeout far above every deadline (the deadlines are asserted)."""
    with d.client(timeout=300) as c:
        return c.call(method, params)


def timed(d: SpawnedDaemon, method: str, params: dict[str, Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = call(d, method, params)
    return result, time.monotonic() - started


def assert_valid_history(prompt: dict[str, Any]) -> None:
    body = {"model": MODEL_ALIAS, "messages": [{"role": "system", "content": prompt["system"]},
                                               *prompt["messages"]]}
    problems = validate_chat_body(body)
    assert not problems, problems


def tool_turn(d: SpawnedDaemon, sid: str, text: str, n: int) -> dict[str, Any]:
    """A user turn answered by the client's model with one tool call, its result and prose.

    Returns the tool-results turn's prompt with ``events`` of both turns and ``longest_s``, the
    longest time one ``session.turn`` took."""
    p, first = timed(d, "session.turn", {"session_id": sid, "kind": "user", "text": text})
    call_id = f"call_{n}"
    call(d, "session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"file_path": f"src/m{n}.py"})}}]}})
    q, second = timed(d, "session.turn", {
        "session_id": sid, "kind": "tool_results", "tool_results": [{
            "tool_call_id": call_id, "name": "read_file",
            "content": f"def handler_{n}(request):\n    return process(request, retries={n})\n"
            * 20}]})  # fmt: skip
    call(d, "session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": f"handler_{n} retries {n} times; nothing else to do."}})
    return {**q, "events": p["events"] + q["events"], "longest_s": max(first, second)}


def write_memory(d: SpawnedDaemon, cwd: Path) -> Path:
    roots = call(d, "memory.status", {"cwd": str(cwd)})["roots"]
    root = Path(roots["project"])
    root.mkdir(parents=True, exist_ok=True)
    doc = root / "retry-policy.md"
    doc.write_text("---\nname: Retry policy\ndescription: request handlers retry with backoff\n"
                   "type: project\n---\n\nEvery request handler retries up to three times.\n")
    return doc


def wait_drained(d: SpawnedDaemon, budget_s: float) -> dict[str, Any]:
    call(d, "daemon.drain", {"timeout_s": budget_s})
    return call(d, "daemon.status")


def test_every_feature_against_llama_cpp(real_daemon: SpawnedDaemon, llama: LlamaServer,
                                         tmp_path: Path) -> None:
    d = real_daemon
    proj = tmp_path / "proj"
    (proj / ".git").mkdir(parents=True)
    (proj / "src").mkdir()
    (proj / "src" / "m1.py").write_text("def handler_1(request):\n    return request\n")
    write_memory(d, proj)
    sid = call(d, "session.open", {"cwd": str(proj), "model": MODEL_ALIAS, "tools": TOOLS,
                                  "window_tokens": llama.n_ctx})["session_id"]

    # automatic compaction inside session.turn: a defined outcome, within the deadline
    events: list[dict[str, Any]] = []
    for n in range(1, 9):
        p = tool_turn(d, sid, f"Look at handler {n} and tell me about its retries.", n)
        assert p["longest_s"] < DEADLINES["compress_s"] + SLACK_S, p["longest_s"]
        events += p["events"]
        assert_valid_history(p)
    auto = [e for e in events if e["type"] in ("compressed", "compression_failed")]
    assert auto, "the small window never triggered an automatic compaction"
    for e in auto:
        assert e["status"] in COMPRESSION_STATUSES, e
        if e["type"] == "compression_failed":
            assert e.get("cause"), e
            assert any(x["type"] in ("compression_fallback", "hard_fallback", "compression_skipped")
                       for x in events), events

    # manual compression
    res, took = timed(d, "session.compress", {"session_id": sid, "mode": "full"})
    assert res["status"] in COMPRESSION_STATUSES, res
    assert took < DEADLINES["compress_s"] + SLACK_S, took
    p = tool_turn(d, sid, "Summarise what we found so far.", 20)
    assert_valid_history(p)

    # recall (selector): model or the lexical fallback, never an error
    res, took = timed(d, "memory.recall", {"cwd": str(proj), "query": "how do handlers retry"})
    assert res["strategy"] in ("model", "heuristic", "none"), res
    assert took < DEADLINES["recall_s"] + SLACK_S, took

    # forget candidates: model or term matching
    res, took = timed(d, "memory.forget_candidates", {"cwd": str(proj),
                                                      "query": "forget the retry policy"})
    assert isinstance(res["candidates"], list)
    assert took < DEADLINES["forget_s"] + SLACK_S, took

    # recap and project summary: a result or a clean model error, within the deadline
    for method, feature in (("session.recap", "recap_s"),
                            ("session.project_summary", "project_summary_s")):
        started = time.monotonic()
        try:
            out = call(d, method, {"session_id": sid})
            assert isinstance(out.get("text"), str | None), out
        except Exception as exc:  # the client raises RemoteError for -32002 ModelUnavailable
            assert getattr(exc, "code", None) == -32002, exc
        assert time.monotonic() - started < DEADLINES[feature] + SLACK_S

    # extraction and dream: background runs counted as completed or failed with a cause
    before = call(d, "daemon.status")["background"]
    res = call(d, "memory.extract", {"session_id": sid})
    if not res["scheduled"]:
        # the automatic extraction after the last complete reply may have got there first:
        # then it must have run (or failed with a cause) and left nothing new to extract
        assert res["reason"] == "no_new_messages", res
        ran = before["last_extract_at"] is not None or before["failed_by_kind"].get("extract")
        assert ran or any(t["kind"] == "extract" for t in before["in_flight"]), before
    res = call(d, "memory.dream", {"cwd": str(proj), "force": True})
    assert "scheduled" in res, res
    st = wait_drained(d, DEADLINES["extract_s"] + DEADLINES["dream_s"] + 2 * SLACK_S)
    bg = st["background"]
    assert not [t for t in bg["in_flight"] if t["kind"] in ("extract", "dream")], bg
    finished = (bg["completed"] + bg["failed"]) - (before["completed"] + before["failed"])
    assert finished >= 1, bg
    for failure in bg["recent_failures"]:
        assert failure["cause"], failure

    # speculation: a defined outcome within its deadline
    spec = call(d, "speculation.start", {"session_id": sid,
                                         "suggestion": "add a docstring to handler_1"})

    def speculation_done() -> dict[str, Any] | None:
        state = call(d, "speculation.status", {"speculation_id": spec["speculation_id"]})["status"]
        return state if state["state"] not in ("pending", "running") else None

    until(speculation_done, timeout=DEADLINES["speculation_s"] + SLACK_S, interval=0.5,
          what="the speculation finished")
    call(d, "speculation.abort", {"speculation_id": spec["speculation_id"]})

    p = tool_turn(d, sid, "Thanks, that is all.", 30)
    assert_valid_history(p)

    # the server rejected nothing the daemon sent, and every feature's request reached it
    assert llama.rejected() == [], llama.rejected()
    chats = [r for r in llama.responses() if "chat/completions" in r[1]]
    assert chats, llama.log_text()[-2000:]
    model = call(d, "daemon.status")["model"]
    # every feature sent at least one request (the server answers one at a time, so calls
    # that reached their deadline while queued never show in its access log)
    assert model["calls"] >= 7, model
    assert isinstance(model["quirks"], list)
    assert model["profile"] == "llamacpp" and model["context_window"] == llama.n_ctx
