"""The proxy's history mapping, as pure functions: parsing the client's ``messages`` and
cutting them into daemon steps. Hypothesis drives random valid chat histories."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qwenctl.proxy.conversation import NO_RESULT, BadRequest, fingerprint, parse, steps
from qwenctl.proxy.keys import base_url, bearer_ok, decode_project, encode_project
from qwenctl.proxy.reply import StreamAccumulator

words = st.text(alphabet="abc xyz", min_size=1, max_size=12)


@st.composite
def histories(draw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(words)})
    n = 0
    for _ in range(draw(st.integers(1, 6))):
        for _ in range(draw(st.integers(1, 2))):  # sometimes two user messages in a row
            msgs.append({"role": "user", "content": draw(words)})
        calls = [f"call_{n + i}" for i in range(draw(st.integers(0, 2)))]
        n += len(calls)
        msgs.append({"role": "assistant", "content": draw(words) if not calls else None,
                     **({"tool_calls": [{"id": c, "type": "function", "function": {
                         "name": "f", "arguments": "{}"}} for c in calls]} if calls else {})})
        answered = draw(st.lists(st.sampled_from(calls), unique=True)) if calls else []
        for c in answered:
            msgs.append({"role": "tool", "tool_call_id": c, "content": draw(words)})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": draw(words)})
    return msgs


@settings(max_examples=200, deadline=None)
@given(histories())
def test_steps_alternate_and_answer_exactly_the_pending_calls(msgs: list[dict[str, Any]]) -> None:
    conv = parse(msgs)
    out = steps(conv.dialogue, [])
    assert out[-1].kind in ("user", "tool_results")
    pending: list[str] = []
    prev = None
    for s in out:
        if s.kind == "assistant":
            assert prev in ("user", "tool_results")  # a reply always follows a turn
            pending = [c["id"] for c in (s.message or {}).get("tool_calls") or []]
        elif s.kind == "tool_results":
            assert prev == "assistant" and pending
            assert [r["tool_call_id"] for r in s.results] == pending
            pending = []
        else:
            assert prev != "user"  # consecutive user messages were merged
            pending = []
        prev = s.kind
    # a call the client never answered gets the placeholder; answered ones keep their result
    answered = {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}
    for s in out:
        for r in s.results:
            assert r["content"] == answered.get(r["tool_call_id"], NO_RESULT)


@given(histories())
def test_conversation_id_depends_on_system_and_first_user_only(msgs: list[dict[str, Any]]) -> None:
    conv = parse(msgs)
    longer = parse([*msgs, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}])
    assert conv.conversation_id("/p") == longer.conversation_id("/p")
    assert conv.conversation_id("/p") != conv.conversation_id("/q")


def test_assistant_fingerprint_ignores_reserialisation() -> None:
    ours = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    theirs = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{ }"}}]}
    assert fingerprint(ours) == fingerprint(theirs)
    assert fingerprint({"role": "user", "content": "a"}) != fingerprint(
        {"role": "user", "content": "b"})


@pytest.mark.parametrize(("messages", "param"), [
    ([], "messages"),
    ([{"role": "user", "content": "x", "extra": 1}], "messages[0].extra"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     "messages[1].role"),
    ([{"role": "system", "content": "only system"}], "messages"),
])
def test_bad_messages_name_the_field(messages: list[Any], param: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse(messages)
    assert exc.value.param == param


@given(st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]),
               min_size=1, max_size=40))
def test_project_prefix_round_trips(name: str) -> None:
    path = "/" + name.replace("/", "_")
    token = encode_project(path)
    assert "/" not in token and "=" not in token
    assert decode_project(token) == str(__import__("pathlib").Path(path).resolve())


def test_keys_and_urls() -> None:
    assert bearer_ok("Bearer k1", "k1") and bearer_ok("bearer k1", "k1")
    assert not bearer_ok("Bearer k2", "k1") and not bearer_ok(None, "k1")
    assert not bearer_ok("Basic k1", "k1")
    assert base_url("127.0.0.1:8788") == "http://127.0.0.1:8788/v1"
    assert base_url("0.0.0.0:9", "/a", "/a") == "http://127.0.0.1:9/v1"
    assert decode_project("!!") is None and decode_project(encode_project("/x")) == "/x"


def test_stream_accumulator_joins_deltas_split_anywhere() -> None:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
        b'"function":{"name":"f","arguments":"{\\"a\\""}}]}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":":1}"}}]}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    blob = b"".join(events)
    for cut in range(1, len(blob), 7):
        acc = StreamAccumulator()
        acc.feed(blob[:cut])
        acc.feed(blob[cut:])
        msg = acc.message()
        assert msg["content"] == "Hello"
        assert msg["tool_calls"] == [{"id": "c1", "type": "function",
                                      "function": {"name": "f", "arguments": '{"a":1}'}}]
    partial = StreamAccumulator()
    partial.feed(b"".join(events[:4]))
    cut_msg = partial.message()
    assert "tool_calls" not in cut_msg
    assert cut_msg["content"].startswith("Hello\n\n[reply cut off:")


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.text(max_size=12), max_size=12),
       thoughts=st.lists(st.text(max_size=6), max_size=4),
       odd=st.sampled_from([None, {"content": 5}, {"content": None}, "x", {"tool_calls": 3}]),
       crlf=st.booleans(), cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=6))
def test_stream_accumulator_reads_any_framing_and_skips_odd_events(
        texts: list[str], thoughts: list[str], odd: Any, crlf: bool, cuts: list[int]) -> None:
    """Whatever the chunking (an event split anywhere, CRLF or LF framing), the reply is the
    joined deltas; an event of another shape is skipped without losing the others."""
    nl = "\r\n" if crlf else "\n"

    def event(obj: Any) -> str:
        return f"data: {json.dumps(obj)}{nl}{nl}"

    body = [event({"choices": [{"index": 0, "delta": {"reasoning_content": t}}]})
            for t in thoughts]
    body += [event({"choices": [{"index": 0, "delta": {"content": t}}]}) for t in texts]
    if odd is not None:
        body.insert(len(body) // 2, event({"choices": [{"index": 0, "delta": odd}]}))
    body.append(event({"choices": [{"index": 1, "delta": {"content": "other choice"}}]}))
    body.append(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 4}}))
    body.append(f"data: [DONE]{nl}{nl}")
    blob = "".join(body).encode()
    acc = StreamAccumulator()
    last = 0
    for cut in sorted(c % (len(blob) + 1) for c in cuts):
        acc.feed(blob[last:cut])
        last = cut
    acc.feed(blob[last:])
    msg = acc.message()
    assert msg["content"] == "".join(texts)
    assert msg.get("reasoning_content", "") == "".join(thoughts)
    assert acc.done and acc.finish_reason == "stop" and acc.complete
    assert acc.usage == {"prompt_tokens": 3, "completion_tokens": 4}
    assert acc.bytes == len(blob)


def test_the_chat_fast_path_takes_exactly_the_chat_routes_paths() -> None:
    """What goes straight to the chat exchange is what the chat routes would match; anything
    else (models, a nested /p/ token, a near miss) stays with the router."""
    from qwenctl.proxy.app import chat_project

    token = encode_project("/work/repo")
    assert chat_project("/v1/chat/completions") == ""
    assert chat_project(f"/p/{token}/v1/chat/completions") == token
    for other in ("/v1/models", f"/p/{token}/v1/models", "/v1/chat/completions/",
                  "/p//v1/chat/completions", "/p/a/b/v1/chat/completions",
                  "/x/v1/chat/completions", "/v1/chat/completionsx"):
        assert chat_project(other) is None, other
