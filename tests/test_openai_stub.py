"""The scripted OpenAI stub: wire shapes, script semantics, faults, strict validation, shutdown."""


from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import (
    Reply,
    ScriptedOpenAI,
    refused_base_url,
    validate_chat_body,
)

USER = [{"role": "user", "content": "hi"}]


def _conn(stub: ScriptedOpenAI, timeout: float = 5.0) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", stub.port, timeout=timeout)


def _post(
    conn: http.client.HTTPConnection, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], bytes]:
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


def _chat(stub: ScriptedOpenAI, **extra: Any) -> tuple[int, dict[str, str], bytes]:
    conn = _conn(stub)
    try:
        return _post(conn, {"model": "m", "messages": USER, **extra})
    finally:
        conn.close()


def _sse(raw: bytes) -> list[Any]:
    """The data payloads of an SSE body, JSON-decoded except ``[DONE]``."""
    out: list[Any] = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_shape_and_keep_alive(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push_many([Reply(content="one"), Reply(content="two", usage={"prompt_tokens": 7})])
    conn = _conn(openai_stub)
    try:
        status, headers, raw = _post(conn, {"model": "qwen", "messages": USER})
        first_sock = conn.sock
        status2, _, raw2 = _post(conn, {"model": "qwen", "messages": USER})
        assert conn.sock is first_sock and first_sock is not None  # same TCP connection reused
    finally:
        conn.close()
    assert status == status2 == 200
    assert headers["content-type"] == "application/json"
    body = json.loads(raw)
    assert body["object"] == "chat.completion"
    assert body["model"] == "qwen"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "one"}
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert json.loads(raw2)["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 0,
        "total_tokens": 7,
    }
    assert openai_stub.pending == 0


def test_models_endpoint_lists_models() -> None:
    with ScriptedOpenAI(models=["a", "b"]) as stub:
        conn = _conn(stub)
        try:
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            body = json.loads(resp.read())
        finally:
            conn.close()
    assert resp.status == 200
    assert [m["id"] for m in body["data"]] == ["a", "b"]


def test_stream_with_tool_calls_and_usage(openai_stub: ScriptedOpenAI) -> None:
    call = {"function": {"name": "read_file", "arguments": {"path": "src/app.py"}}}
    openai_stub.push(Reply(content="Let me look.", tool_calls=[call], chunk_chars=5))
    status, headers, raw = _chat(openai_stub, stream=True, stream_options={"include_usage": True})
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Let me look."
    tool_deltas = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert tool_deltas[0]["id"].startswith("call_")
    assert tool_deltas[0]["function"]["name"] == "read_file"
    args = "".join(tc["function"]["arguments"] for tc in tool_deltas)
    assert json.loads(args) == {"path": "src/app.py"}
    assert len(tool_deltas) > 2  # arguments really arrive in pieces
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def test_stream_without_include_usage_has_no_usage_chunk(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="hello"))
    _, _, raw = _chat(openai_stub, stream=True)
    chunks = _sse(raw)[:-1]
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)


def test_script_exhausted_is_http_500(openai_stub: ScriptedOpenAI) -> None:
    status, _, raw = _chat(openai_stub)
    assert status == 500
    assert "script exhausted" in json.loads(raw)["error"]["message"]


def test_default_and_handler_replies() -> None:
    seen: list[dict[str, Any]] = []

    def handler(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return Reply(content=f"echo {body['messages'][-1]['content']}")

    with ScriptedOpenAI(handler=handler) as stub:
        stub.push(Reply(content="queued first"))
        first = json.loads(_chat(stub)[2])
        second = json.loads(_chat(stub)[2])
    assert first["choices"][0]["message"]["content"] == "queued first"
    assert second["choices"][0]["message"]["content"] == "echo hi"
    assert len(seen) == 1

    with ScriptedOpenAI(default=Reply(content="always")) as stub:
        bodies = [json.loads(_chat(stub)[2]) for _ in range(3)]
    assert {b["choices"][0]["message"]["content"] for b in bodies} == {"always"}


def test_handler_exception_becomes_visible_500() -> None:
    def handler(body: dict[str, Any]) -> Reply:
        raise RuntimeError("boom")

    with ScriptedOpenAI(handler=handler) as stub:
        status, _, raw = _chat(stub)
    assert status == 500
    assert "RuntimeError: boom" in json.loads(raw)["error"]["message"]


@pytest.mark.parametrize(("fault", "status"), [("http_500", 500), ("http_400", 400)])
def test_http_error_faults(openai_stub: ScriptedOpenAI, fault: Any, status: int) -> None:
    openai_stub.push(Reply(content="x", fault=fault))
    got, _, raw = _chat(openai_stub)
    assert got == status
    err = json.loads(raw)["error"]
    assert err["message"] and err["type"]


def test_invalid_json_fault(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x", fault="invalid_json"))
    status, _, raw = _chat(openai_stub)
    assert status == 200
    with pytest.raises(ValueError):
        json.loads(raw)


def test_drop_fault_closes_without_response(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x", fault="drop"))
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        _chat(openai_stub)
    assert len(openai_stub.requests) == 1  # recorded even though never answered


def test_cut_stream_fault_has_no_done(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="a fairly long reply " * 4, fault="cut_stream"))
    with pytest.raises(http.client.IncompleteRead) as info:
        _chat(openai_stub, stream=True)
    partial = _sse(info.value.partial)
    assert partial and "[DONE]" not in partial
    assert all(c["choices"][0]["finish_reason"] is None for c in partial)


def test_slow_fault_delays_first_byte(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="late", fault="slow", delay_s=0.4))
    started = time.monotonic()
    status, _, _ = _chat(openai_stub)
    assert status == 200
    assert time.monotonic() - started >= 0.4


def test_reject_json_schema_reply_stays_queued_until_answered(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content='{"ok": true}', fault="reject_json_schema"))
    schema_fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    status, _, _ = _chat(openai_stub, response_format=schema_fmt)
    assert status == 500
    assert openai_stub.pending == 1
    status, _, raw = _chat(openai_stub, response_format={"type": "json_object"})
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == '{"ok": true}'
    assert openai_stub.pending == 0
    types = [r.response_format_type for r in openai_stub.chat_requests]
    assert types == ["json_schema", "json_object"]


def test_server_wide_reject_json_schema() -> None:
    with ScriptedOpenAI(reject_json_schema=True, default=Reply(content="{}")) as stub:
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
        assert _chat(stub, response_format=fmt)[0] == 500
        assert _chat(stub, response_format={"type": "json_object"})[0] == 200


def test_requests_are_recorded_with_headers(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="ok"))
    _chat(openai_stub, temperature=0.2)
    (req,) = openai_stub.wait_for_requests(1, timeout=1)
    assert req.method == "POST" and req.path == "/v1/chat/completions"
    assert req.headers["content-type"] == "application/json"
    assert req.body["temperature"] == 0.2 and req.body["messages"] == USER
    with pytest.raises(TimeoutError):
        openai_stub.wait_for_requests(2, timeout=0.1)


def test_tool_call_ids_are_filled_and_kept(openai_stub: ScriptedOpenAI) -> None:
    calls = [
        {"id": "call_mine", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        {"function": {"name": "b", "arguments": {"k": 1}}},
    ]
    openai_stub.push(Reply(tool_calls=calls))
    body = json.loads(_chat(openai_stub)[2])
    choice = body["choices"][0]
    got = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls"
    assert got[0]["id"] == "call_mine"
    assert got[1]["id"].startswith("call_") and got[1]["id"] != "call_mine"
    assert got[1]["type"] == "function" and json.loads(got[1]["function"]["arguments"]) == {"k": 1}


def test_reply_rejects_unknown_fault() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        Reply(fault="explode")  # type: ignore[arg-type]


def test_refused_base_url_refuses() -> None:
    url = refused_base_url()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass


def test_stop_does_not_hang_with_streaming_client_connected() -> None:
    stub = ScriptedOpenAI().start()
    stub.push(Reply(content="x" * 200, chunk_chars=1, chunk_delay_s=0.2))
    errors: list[BaseException] = []
    streaming = threading.Event()

    def reader() -> None:
        conn = _conn(stub, timeout=10)
        try:
            conn.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                         body=json.dumps({"model": "m", "messages": USER, "stream": True}))
            resp = conn.getresponse()
            resp.read1(1)  # the first streamed byte: the server is mid-stream from here on
            streaming.set()
            resp.read()
        except BaseException as exc:  # the server cuts us off mid-stream
            errors.append(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert streaming.wait(10), errors
    started = time.monotonic()
    stub.stop()
    assert time.monotonic() - started < 2
    thread.join(3)
    assert not thread.is_alive()
    assert errors  # the stream was cut, not completed
    stub.stop()  # idempotent


def test_stop_interrupts_slow_reply_and_idle_keepalive() -> None:
    stub = ScriptedOpenAI().start()
    stub.push(Reply(content="never", fault="slow", delay_s=60))
    idle = _conn(stub)
    idle.connect()  # an idle keep-alive connection the server is blocked reading from
    slow_done = threading.Event()

    def slow() -> None:
        try:
            _chat(stub)
        except (OSError, http.client.HTTPException):
            pass
        finally:
            slow_done.set()

    threading.Thread(target=slow, daemon=True).start()
    stub.wait_for_requests(1, timeout=2)
    started = time.monotonic()
    stub.stop()
    idle.close()
    assert time.monotonic() - started < 2
    assert slow_done.wait(3)


def test_start_twice_is_an_error(openai_stub: ScriptedOpenAI) -> None:
    with pytest.raises(RuntimeError):
        openai_stub.start()


# -- strict chat validation ---------------------------------------------------------------


def _body(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages)}


SYS = {"role": "system", "content": "be brief"}
U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}
CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ],
}
T1 = {"role": "tool", "tool_call_id": "c1", "content": "r1"}
T2 = {"role": "tool", "tool_call_id": "c2", "content": "r2"}


def test_validator_accepts_valid_tool_round_trip() -> None:
    assert validate_chat_body(_body(SYS, U, CALLS, T1, T2, A, U)) == []
    assert validate_chat_body(_body(U)) == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_body(U, U), "two consecutive user messages"),
        (_body(U, A, A), "two consecutive assistant messages"),
        (_body(U, SYS), "system message is only allowed as the first"),
        (_body(U, CALLS, T1, U), "['c2']"),
        (_body(U, CALLS, T1), "never answered"),
        (_body(U, T1), "a tool message must follow an assistant message with tool_calls"),
        (_body(U, A, T1), "matches no pending tool call"),
        (_body(U, CALLS, T1, T1, T2), "matches no pending tool call"),
        (_body(U, {"role": "robot", "content": "x"}), "role 'robot'"),
        (_body(U, {"role": "assistant", "content": None}), "needs content or tool_calls"),
        ({"model": "m", "messages": []}, "messages must be a non-empty list"),
        ({"messages": [U]}, "model must be a non-empty string"),
        ([1, 2], "body must be a JSON object"),
    ],
)
def test_validator_rejects(body: Any, needle: str) -> None:
    problems = validate_chat_body(body)
    assert problems, body
    assert any(needle in p for p in problems), problems


def test_strict_server_rejects_with_400_and_keeps_script() -> None:
    with ScriptedOpenAI(strict_chat=True) as stub:
        stub.push(Reply(content="fine"))
        conn = _conn(stub)
        try:
            status, _, raw = _post(conn, _body(U, U))
            assert status == 400
            assert "two consecutive user messages" in json.loads(raw)["error"]["message"]
            assert stub.pending == 1
            status, _, raw = _post(conn, _body(SYS, U, CALLS, T1, T2))
        finally:
            conn.close()
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == "fine"
