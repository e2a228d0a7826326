"""``qwenctl proxy`` end to end: the ``openai`` SDK as the client, the proxy as a real
process, a spawned daemon, and a ScriptedOpenAI as the upstream model (strict chat checks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from proxy_harness import (
    CLIENT_SYSTEM,
    RunningProxy,
    client,
    forwarded,
    project,
    setup,
    upstream,
)
from qwenctl.proxy.keys import encode_project

from qwenctxd.testing.openai_stub import Reply

__all__ = ["setup", "upstream"]  # fixtures

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def test_plain_and_streamed_replies_pass_through_and_are_recorded(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, proj = setup
    script.replies += [Reply(content="Plain answer here."),
                       Reply(content="Streamed answer, chunk by chunk.", chunk_chars=5)]
    c = client(proxy)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": CLIENT_SYSTEM},
                                  {"role": "user", "content": "hello there"}]
    r = c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "Plain answer here."

    up = forwarded(stub)[-1]
    system = up["messages"][0]["content"]
    assert system.startswith(CLIENT_SYSTEM + "\n\n---\n\n")
    assert "Always answer in haiku." in system
    assert stub.chat_requests[-1].headers["authorization"] == "Bearer upstream-key"
    assert up["messages"][-1]["role"] == "user"
    assert "hello there" in json.dumps(up["messages"][-1]["content"])

    msgs += [{"role": "assistant", "content": "Plain answer here."},
             {"role": "user", "content": "and now stream"}]
    pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="stub-model", messages=msgs, stream=True) if ch.choices]  # type: ignore[arg-type]
    assert "".join(pieces) == "Streamed answer, chunk by chunk."
    assert len([p for p in pieces if p]) >= 5  # arrived in pieces, not one blob
    up2 = forwarded(stub)[-1]
    # the forwarded history is the daemon's: both earlier messages, the reply recorded
    roles = [m["role"] for m in up2["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert up2["messages"][2]["content"] == "Plain answer here."

    sessions = proxy.daemon.call("session.list", {"cwd": str(proj)})["sessions"]
    assert len(sessions) == 1 and sessions[0]["title"] == "hello there"
    path = proxy.daemon.call("session.open", {"cwd": str(proj), "model": "stub-model",
                                              "session_id": sessions[0]["session_id"]})["path"]
    text = Path(path).read_text()
    assert "Streamed answer, chunk by chunk." in text and "Plain answer here." in text


def test_tool_call_round_trip(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, _ = setup
    script.replies += [
        Reply(tool_calls=[{"id": "call_abc", "function": {"name": "read_file",
                                                          "arguments": {"path": "a.py"}}}]),
        Reply(content="The file defines main()."),
    ]
    c = client(proxy)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": CLIENT_SYSTEM},
                                  {"role": "user", "content": "what is in a.py?"}]
    stream = c.chat.completions.create(model="stub-model", messages=msgs, tools=TOOLS,  # type: ignore[arg-type]
                                       stream=True)
    calls: dict[int, dict[str, str]] = {}
    for ch in stream:
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["args"] += (tc.function.arguments or "") if tc.function else ""
    assert calls[0] == {"id": "call_abc", "name": "read_file", "args": '{"path": "a.py"}'}
    assert forwarded(stub)[-1]["tools"] == TOOLS  # the client's tools, unchanged

    msgs += [{"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_abc", "type": "function",
                  "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
             {"role": "tool", "tool_call_id": "call_abc", "content": "def main(): ..."}]
    r = c.chat.completions.create(model="stub-model", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "The file defines main()."
    up = forwarded(stub)[-1]
    assert [m["role"] for m in up["messages"]] == ["system", "user", "assistant", "tool"]
    assert up["messages"][2]["tool_calls"][0]["id"] == "call_abc"
    assert up["messages"][3] == {"role": "tool", "tool_call_id": "call_abc",
                                 "content": "def main(): ..."}


def test_auth_is_required_and_nothing_is_forwarded(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, _script, _ = setup
    before = len(stub.chat_requests)
    bad = client(proxy, api_key="wrong")
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 401
    r = httpx.post(proxy.base_url + "/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(proxy.base_url + "/models").status_code == 401
    assert len(stub.chat_requests) == before
    ok = client(proxy).models.list()
    assert [m.id for m in ok.data] == ["stub-model", "stub-fast"]
    key_file = Path(proxy.env["XDG_CONFIG_HOME"]) / "qwenctxd" / "proxy.key"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_second_project_by_path(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, proj = setup
    other = project(proj.parent, "other", "Other project rule: use tabs.\n")
    script.replies.append(Reply(content="from other"))
    c = client(proxy, base_url=f"{proxy.root}/p/{encode_project(other)}/v1")
    r = c.chat.completions.create(model="stub-model", messages=[  # type: ignore[arg-type]
        {"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "hi other"}])
    assert r.choices[0].message.content == "from other"
    system = forwarded(stub)[-1]["messages"][0]["content"]
    assert "use tabs" in system and "haiku" not in system
    assert len(proxy.daemon.call("session.list", {"cwd": str(other)})["sessions"]) == 1
    assert proxy.daemon.call("session.list", {"cwd": str(proj)})["sessions"] == []
    bad = httpx.post(f"{proxy.root}/p/{encode_project(proj / 'nope')}/v1/chat/completions",
                     headers={"authorization": f"Bearer {proxy.key}"},
                     json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 404 and "names no directory" in bad.json()["error"]["message"]


def test_session_header_and_derived_identity(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, _stub, script, proj = setup
    script.replies += [Reply(content="one"), Reply(content="two"), Reply(content="three")]
    c = client(proxy)
    base = [{"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "q1"}]
    c.chat.completions.create(model="stub-model", messages=base)  # type: ignore[arg-type]
    c.chat.completions.create(model="stub-model", messages=[  # type: ignore[arg-type]
        *base, {"role": "assistant", "content": "one"}, {"role": "user", "content": "q2"}])
    sid = "0b6a3f0e-2a57-4c1e-9a61-7d3c0f7e5b11"
    c.chat.completions.create(model="stub-model", messages=base,  # type: ignore[arg-type]
                              extra_headers={"X-Qwenctx-Session": sid})
    sessions = {s["session_id"]: s for s in
                proxy.daemon.call("session.list", {"cwd": str(proj)})["sessions"]}
    assert len(sessions) == 2 and sid in sessions
    other = next(s for k, s in sessions.items() if k != sid)
    assert other["messages"] >= 4  # q1, one, q2, two: one derived session


def test_upstream_error_passes_through_with_status(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, _ = setup
    script.replies += [Reply(fault="http_500"), Reply(content="recovered")]
    c = client(proxy)
    msgs = [{"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "try"}]
    with pytest.raises(openai.InternalServerError) as exc:
        c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    assert exc.value.status_code == 500
    assert "scripted internal server error" in str(exc.value)
    # the retry maps nothing twice: the upstream sees one user message, and it is answered
    r = c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "recovered"
    assert [m["role"] for m in forwarded(stub)[-1]["messages"]] == ["system", "user"]


def test_bad_input_gets_clear_errors(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, _script, _ = setup
    before = len(stub.chat_requests)
    h = {"authorization": f"Bearer {proxy.key}", "content-type": "application/json"}
    url = proxy.base_url + "/chat/completions"
    r = httpx.post(url, headers=h, content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(url, headers=h, json={"model": "m", "messages": [
        {"role": "user", "content": "x", "colour": "red"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].colour"
    r = httpx.post(url, headers=h, json={"model": "m", "messages": [{"role": "robot"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    r = httpx.post(url, headers=h, json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    big = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (33 << 20) + b'"}]}'
    r = httpx.post(url, headers=h, content=big, timeout=60)
    assert r.status_code == 413
    assert len(stub.chat_requests) == before  # nothing was forwarded
    # and the proxy still serves
    assert httpx.get(proxy.base_url + "/models", headers=h).status_code == 200


def test_regenerated_history_goes_to_a_fresh_session_and_stays_valid(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, proj = setup
    script.replies += [Reply(content="first try"), Reply(content="second try"),
                       Reply(content="next")]
    c = client(proxy)
    base = [{"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "again"}]
    first = c.chat.completions.with_raw_response.create(model="stub-model", messages=base)  # type: ignore[arg-type]
    # the client regenerates: the same history without the reply it got
    second = c.chat.completions.with_raw_response.create(model="stub-model", messages=base)  # type: ignore[arg-type]
    assert second.parse().choices[0].message.content == "second try"
    assert first.headers["x-qwenctx-session"] != second.headers["x-qwenctx-session"]
    assert [m["role"] for m in forwarded(stub)[-1]["messages"]] == ["system", "user"]
    third = c.chat.completions.with_raw_response.create(model="stub-model", messages=[  # type: ignore[arg-type]
        *base, {"role": "assistant", "content": "second try"}, {"role": "user", "content": "go"}])
    assert third.headers["x-qwenctx-session"] == second.headers["x-qwenctx-session"]
    assert [m["role"] for m in forwarded(stub)[-1]["messages"]] == [
        "system", "user", "assistant", "user"]
    ids = {s["session_id"] for s in proxy.daemon.call("session.list", {"cwd": str(proj)})[
        "sessions"]}
    assert {first.headers["x-qwenctx-session"], second.headers["x-qwenctx-session"]} <= ids


def test_a_new_conversation_opens_with_its_first_turn_and_leaves_an_earlier_one_alone(  # type: ignore[no-untyped-def]
        setup) -> None:
    """A new conversation's session is opened with its first turn in one daemon call; when a
    restarted proxy sees an earlier conversation's first message again (a new conversation
    that starts the same way), that session is not touched: the turn goes to a fresh one."""
    proxy, stub, script, proj = setup
    script.replies += [Reply(content="earlier answer"), Reply(content="a new answer")]
    base = [{"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "hello"}]
    first = client(proxy).chat.completions.with_raw_response.create(
        model="stub-model", messages=base)  # type: ignore[arg-type]
    earlier = first.headers["x-qwenctx-session"]
    up = forwarded(stub)[-1]["messages"]
    assert [m["role"] for m in up] == ["system", "user"] and "haiku" in up[0]["content"]
    # another new conversation: one daemon call opens it and takes its turn, one records the
    # reply (daemon.status counts every request, its own included)
    script.replies.insert(0, Reply(content="hi back"))
    before = proxy.daemon.call("daemon.status")["requests"]
    client(proxy).chat.completions.create(model="stub-model", messages=[  # type: ignore[arg-type]
        base[0], {"role": "user", "content": "another question"}])
    assert proxy.daemon.call("daemon.status")["requests"] - before == 3
    proxy.stop()
    again = RunningProxy(proxy.daemon, stub.base_url, proj)
    try:
        second = client(again).chat.completions.with_raw_response.create(
            model="stub-model", messages=base)  # type: ignore[arg-type]
        assert second.parse().choices[0].message.content == "a new answer"
        assert second.headers["x-qwenctx-session"] != earlier
        assert [m["role"] for m in forwarded(stub)[-1]["messages"]] == ["system", "user"]
    finally:
        again.stop()
    rows = {s["session_id"]: s["messages"] for s in
            proxy.daemon.call("session.list", {"cwd": str(proj)})["sessions"]}
    assert rows[earlier] == 2 and rows[second.headers["x-qwenctx-session"]] == 2
    entries = proxy.daemon.call("session.transcript", {"session_id": earlier})["entries"]
    said = [e["text"] for e in entries if e["role"] in ("user", "assistant")]
    assert len(said) == 2 and said[0].endswith("hello") and said[1] == "earlier answer"


def test_daemon_restart_mid_conversation(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, proj = setup
    script.replies += [Reply(content="before"), Reply(content="after")]
    c = client(proxy)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": CLIENT_SYSTEM},
                                  {"role": "user", "content": "remember me"}]
    c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    proxy.daemon.stop()
    proxy.daemon.start()
    msgs += [{"role": "assistant", "content": "before"}, {"role": "user", "content": "still?"}]
    r = c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "after"
    up = forwarded(stub)[-1]["messages"]
    # the resumed session: the earlier exchange from the recorded file, then the new input
    assert [m["role"] for m in up] == ["system", "user", "assistant", "user"]
    assert up[2]["content"] == "before"
    assert len(proxy.daemon.call("session.list", {"cwd": str(proj)})["sessions"]) == 1
