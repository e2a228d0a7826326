"""``qwenctl proxy`` fits every request to its upstream (issue 29): the window is learned from
the server (llama.cpp's ``/props`` here), ``max_tokens`` is capped to what the window leaves,
tool declarations without ``parameters`` are normalised, a history that outgrew the window
loses its oldest turns for that request, and a request whose system prompt and tools alone do
not fit gets HTTP 400 ``context_window_exceeded`` naming the sizes — never the upstream's 500.
The upstream is the strict scripted server: it refuses what llama.cpp refuses (a prompt plus
``max_tokens`` over its window, a function without ``parameters``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from proxy_harness import (
    CLIENT_SYSTEM,
    RunningProxy,
    Upstream,
    client,
    forwarded,
    project,
)

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon

WINDOW = 8192
TOOLS = [
    {"type": "function", "function": {"name": "get_goal", "description": "the current goal"}},
    {"type": "function", "function": {"name": "read_file", "description": "read a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}}}}},
]


@pytest.fixture(scope="module")
def running() -> Iterator[tuple[RunningProxy, ScriptedOpenAI, Upstream, SpawnedDaemon]]:
    script = Upstream()
    with ScriptedOpenAI(strict_chat=True, strict_payload=True, handler=script, props=True,
                        context_window=WINDOW) as stub:
        d = SpawnedDaemon(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k",
                               "OPENAI_MODEL": "stub-model"})
        # the README's llama.cpp set-up: the daemon's own side queries know the window too
        toml = d.home / ".config" / "qwenctxd" / "config.toml"
        toml.parent.mkdir(parents=True)
        toml.write_text(f"[model]\ncontext_window = {WINDOW}\n")
        d.start()
        try:
            proj = project(d.root, "proj", "Be brief.\n")
            proxy = RunningProxy(d, stub.base_url, proj)
            try:
                yield proxy, stub, script, d
            finally:
                proxy.stop()
        finally:
            d.cleanup()


def _ask(proxy: RunningProxy, messages: list[dict], **kw: object) -> object:
    return client(proxy).chat.completions.create(model="stub-model", messages=messages, **kw)


def test_tools_normalised_and_max_tokens_capped(running) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, d = running
    script.replies.append(Reply(content="ok"))
    before = len(forwarded(stub))
    r = _ask(proxy, [{"role": "system", "content": CLIENT_SYSTEM},
                     {"role": "user", "content": "first question"}],
             tools=TOOLS, tool_choice="auto", max_tokens=32_000)
    assert r.choices[0].message.content == "ok"
    body = forwarded(stub)[before]
    assert all(isinstance(t["function"].get("parameters"), dict) for t in body["tools"])
    assert body["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert body["max_tokens"] < WINDOW  # the strict upstream accepted prompt + max_tokens
    assert not stub.rejected, stub.rejected
    # the daemon session is sized for the upstream's window, and says where it came from
    sid = next(s["session_id"] for s in d.call("session.list", {})["sessions"] if s.get("open"))
    ctx = d.call("session.context", {"session_id": sid})
    assert ctx["window_source"] == "upstream" and ctx["window_tokens"] < WINDOW


def test_a_request_that_cannot_fit_gets_a_clear_400(running) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, d = running
    before = len(stub.chat_requests)
    huge_system = CLIENT_SYSTEM + " " + ("Follow every rule with care. " * 1500)  # ~11k tokens
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(proxy, [{"role": "system", "content": huge_system},
                     {"role": "user", "content": "hello"}], tools=TOOLS, tool_choice="auto")
    err = caught.value.body
    assert isinstance(err, dict)
    err = err.get("error", err)
    assert err["type"] == "context_window_exceeded"
    assert err["window"] == WINDOW and err["system_tokens"] > WINDOW and err["tools_tokens"] > 0
    assert str(WINDOW) in err["message"]
    forwarded_now = [r for r in stub.chat_requests[before:]
                     if json.dumps(r.body).count("Follow every rule") > 100]
    assert forwarded_now == []  # nothing that could not fit was sent upstream


def test_a_history_past_the_window_is_trimmed_to_fit(running) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, d = running
    messages: list[dict] = [{"role": "system", "content": CLIENT_SYSTEM}]
    for i in range(12):  # ~12 × 900 tokens of history: more than the 8k window
        messages.append({"role": "user", "content": f"question {i}: " + "lorem ipsum " * 300})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": "the last question"})
    script.replies.append(Reply(content="fits"))
    before = len(forwarded(stub))
    r = _ask(proxy, messages)
    assert r.choices[0].message.content == "fits"
    body = forwarded(stub)[before]
    assert "the last question" in json.dumps(body["messages"][-1])
    assert len(body["messages"]) < len(messages)
    assert not stub.rejected, stub.rejected


def test_proxy_env_prints_the_model_and_the_plain_url(running, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]

    proxy, _stub, _script, _d = running
    ran = qwenctl(proxy, "proxy", "env", cwd=tmp_path)
    ran.check_returncode()
    out = ran.stdout
    lines = out.strip().splitlines()
    assert lines[0] == "export OPENAI_BASE_URL=http://127.0.0.1:8788/v1"
    assert "export OPENAI_MODEL=stub-model" in lines


def test_an_agents_one_shot_side_query_makes_no_session(running) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, d = running
    schema_tool = {"type": "function", "function": {
        "name": "respond_in_schema", "description": "answer as JSON",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}}
    before = {s["session_id"] for s in d.call("session.list", {})["sessions"]}
    script.replies.append(Reply(content="", tool_calls=[{
        "id": "c1", "type": "function",
        "function": {"name": "respond_in_schema", "arguments": '{"answer": "yes"}'}}]))
    n = len(forwarded(stub))
    r = _ask(proxy, [{"role": "system", "content": CLIENT_SYSTEM},
                     {"role": "user", "content": "Is the user's request complete?"}],
             tools=[schema_tool],
             tool_choice={"type": "function", "function": {"name": "respond_in_schema"}})
    assert r.choices[0].message.tool_calls[0].function.name == "respond_in_schema"
    assert len(forwarded(stub)) == n + 1 and forwarded(stub)[-1]["max_tokens"] < WINDOW
    after = {s["session_id"] for s in d.call("session.list", {})["sessions"]}
    assert after == before  # folded: no session of its own


#: answers Qwen Code 0.24 throws away as an invalid stream and asks again for
DISCARDED = {
    "empty": "",
    "blank": " \n ",
    "protocol tag": "<summary>\nThe deploy gate is BLUEHERON.\n</summary>",
    "closing protocol tag": "  </analysis> then the answer",
    "a bare tag start": "<summ",
    "leaked tool-call tags": '{"path": "README.md"}</parameter>\n</function>',
    "upstream placeholder": "(request timeout)",
}


@pytest.mark.parametrize("why", list(DISCARDED))
def test_asking_again_after_a_discarded_answer_stays_in_the_session(  # type: ignore[no-untyped-def]
        running, why: str) -> None:
    """Qwen Code retries a request whose answer it discarded: the same history again. That
    turn is taken back and asked anew in the same session (a regenerate after a real answer
    still forks, see test_proxy_chat)."""
    proxy, stub, script, d = running
    base = [{"role": "system", "content": CLIENT_SYSTEM},
            {"role": "user", "content": f"a question that first gets an answer: {why}"}]
    script.replies += [Reply(content=DISCARDED[why]), Reply(content="the real answer")]
    c = client(proxy)
    first = c.chat.completions.with_raw_response.create(model="stub-model", messages=base)  # type: ignore[arg-type]
    second = c.chat.completions.with_raw_response.create(model="stub-model", messages=base)  # type: ignore[arg-type]
    assert second.parse().choices[0].message.content == "the real answer"
    sid = first.headers["x-qwenctx-session"]
    assert second.headers["x-qwenctx-session"] == sid
    assert [m["role"] for m in forwarded(stub)[-1]["messages"]] == ["system", "user"]
    entries = d.call("session.transcript", {"session_id": sid})["entries"]
    assert [e["role"] for e in entries if e["role"] in ("user", "assistant")][-2:] == [
        "user", "assistant"]


#: first answers that end unfinished: (its fault or finish reason, streamed)
UNFINISHED = {
    "out of budget": ({"finish_reason": "length"}, False),
    "out of budget, streamed": ({"finish_reason": "length"}, True),
    # a one-slot local server (llama-cpp-python's) interrupts a stream when another request
    # arrives: part of the answer, then [DONE] with no finish reason. Seen in CI when the
    # daemon's extraction reached the server during the user's answer
    "interrupted stream": ({"fault": "interrupted"}, True),
}


@pytest.mark.parametrize("case", list(UNFINISHED))
def test_asking_again_after_an_unfinished_answer_stays_in_the_session(  # type: ignore[no-untyped-def]
        running, case: str) -> None:
    """An answer stopped by the token budget (finish_reason "length") or one that ended with no
    finish reason is no answer to Qwen Code: it sends the same history again (with a larger
    budget; its NO_FINISH_REASON retry). That is a retry in the same session, not a
    regenerate."""
    proxy, stub, script, d = running
    how, stream = UNFINISHED[case]
    base = [{"role": "system", "content": CLIENT_SYSTEM},
            {"role": "user", "content": f"a question whose first answer is unfinished: {case}"}]
    script.replies += [Reply(content="The deploy gate is a platform designed to", **how),
                       Reply(content="BLUEHERON.")]
    c = client(proxy)
    first = c.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
        model="stub-model", messages=base, stream=stream)
    if stream:
        chunks = [ch for ch in first.parse() if ch.choices]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks).startswith("The")
        assert {ch.choices[0].finish_reason for ch in chunks} - {None} == (
            {"length"} if "finish_reason" in how else set())
    second = c.chat.completions.with_raw_response.create(model="stub-model", messages=base)  # type: ignore[arg-type]
    assert second.parse().choices[0].message.content == "BLUEHERON."
    sid = first.headers["x-qwenctx-session"]
    assert second.headers["x-qwenctx-session"] == sid
    entries = d.call("session.transcript", {"session_id": sid})["entries"]
    said = [e for e in entries if e["role"] in ("user", "assistant")]
    assert [e["role"] for e in said][-2:] == ["user", "assistant"]
    assert "BLUEHERON." in json.dumps(said[-1])


@pytest.mark.parametrize(("content", "finish", "discarded"), [
    *((text, "stop", True) for text in DISCARDED.values()),
    ("The deploy gate is BLUEHERON.", "length", True),
    ("The deploy gate is BLUEHERON.", None, True),
    ("The gate\n\n[reply cut off: the client disconnected]", "stop", True),
    ("The deploy gate is BLUEHERON.", "stop", False),
    ("<summary-card> is a tag of ours", "stop", False),
    ("Summary: the gate is BLUEHERON", "stop", False),
    ('{"gate": "BLUEHERON"}', "stop", False),
    ("see </parameter></function> in the docs", "stop", False),
    ("(request timeout) happened twice yesterday", "stop", False),
])
def test_unusable_answer_matches_what_qwen_code_discards(
        content: str, finish: str | None, discarded: bool) -> None:
    from qwenctl.proxy.reply import unusable_answer
    assert unusable_answer({"role": "assistant", "content": content}, finish) is discarded
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    # a tool call is an answer whatever the text says, unless it did not finish
    assert unusable_answer({"role": "assistant", "content": content, "tool_calls": [call]},
                           finish) is (finish in ("length", None))


def test_fit_request_caps_answers_with_the_proxys_max_tokens() -> None:
    from qwenctl.proxy.upstream import fit_request

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32_000}
    assert fit_request(body, 8192, cap=96).max_tokens == 96 and body["max_tokens"] == 96
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32_000}
    fit_request(body, None, cap=96)  # window unknown: the cap still holds
    assert body["max_tokens"] == 96
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    assert fit_request(body, 8192, cap=96).max_tokens == 50  # a smaller ask stands
