"""The proxy's request reader: a request that repeats its conversation's earlier messages byte
for byte reads only the new ones, and whatever it reads equals reading the whole request from
scratch (hypothesis drives sequences of growing, edited, re-serialised and malformed
requests across several conversations)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qwenctl.proxy import request_reader
from qwenctl.proxy.conversation import BadRequest, Conversation, parse
from qwenctl.proxy.request_reader import RequestReader

words = st.text(alphabet="ab \u00e9\n\"", min_size=0, max_size=6)
message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, words),
    st.builds(lambda t: {"role": "user", "content": [{"type": "text", "text": t}]}, words),
    st.builds(lambda t: {"role": "assistant", "content": t}, words),
    st.builds(lambda c: {"role": "assistant", "content": None, "tool_calls": [
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        st.sampled_from(["c1", "c2"])),
    st.builds(lambda c, t: {"role": "tool", "tool_call_id": c, "content": t},
              st.sampled_from(["c1", "c2"]), words),
    st.builds(lambda t: {"role": "system", "content": t}, words),
    st.just({"role": "tool", "content": "no call id"}),  # refused
    st.just({"role": "user", "content": "x", "nonsense": 1}),  # refused
)
#: what the next request of a conversation does to the previous one's messages
change = st.one_of(
    st.tuples(st.just("extend"), st.lists(message, min_size=1, max_size=3)),
    st.tuples(st.just("edit"), st.integers(0, 20), message),
    st.tuples(st.just("reserialise"), st.integers(0, 20)),
    st.tuples(st.just("truncate"), st.integers(1, 20)),
)


def body_of(messages: list[dict[str, Any]], *, indent: bool = False) -> bytes:
    body = {"model": "m", "stream": True, "messages": messages}
    return json.dumps(body, indent=1).encode() if indent else msgspec.json.encode(body)


def summary(conv: Conversation) -> tuple[Any, ...]:
    return (conv.system, conv.roles, conv.fps, conv.first_user, conv.dialogue,
            conv.dialogue_from(len(conv.roles) - 1))


def scratch(messages: list[dict[str, Any]]) -> tuple[Any, ...] | tuple[str, str | None]:
    try:
        return summary(parse(messages))
    except BadRequest as exc:
        return ("refused", exc.param)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), change), min_size=1, max_size=12),
       st.lists(message, min_size=1, max_size=4))
def test_reading_on_equals_reading_from_scratch(steps: list[Any],
                                                first: list[dict[str, Any]]) -> None:
    reader = RequestReader()
    convs: list[list[dict[str, Any]]] = [[{"role": "system", "content": f"agent {i}"}, *first]
                                         for i in range(3)]
    indented = [False, False, False]
    read: list[tuple[list[Any], bool] | None] = [None, None, None]  # each one's last read
    for which, (kind, *args) in steps:
        msgs = convs[which]
        reused = reader.reused
        if kind == "extend":
            msgs = [*msgs, *args[0]]
        elif kind == "edit":
            msgs = list(msgs)
            msgs[args[0] % len(msgs)] = args[1]
        elif kind == "reserialise":  # the same messages, written another way
            indented[which] = not indented[which]
        else:
            msgs = msgs[:max(1, len(msgs) - args[0])]
        convs[which] = msgs
        last = read[which]
        goes_on = last is not None and last[1] == indented[which] and len(last[0]) >= 2 \
            and msgs[:len(last[0])] == last[0]  # this request repeats the last one's messages
        expected = scratch(msgs)
        try:
            body, conv = reader.read(body_of(msgs, indent=indented[which]))
        except BadRequest as exc:
            assert expected == ("refused", exc.param)
            read[which] = None
            continue
        read[which] = (msgs, indented[which])
        if goes_on:  # what was read before is not read again
            assert reader.reused == reused + 1
        assert summary(conv) == expected
        assert msgspec.json.decode(msgspec.json.encode(body["messages"])) == msgs
        assert body["model"] == "m" and body["stream"] is True


def test_a_growing_conversation_reads_only_its_new_messages(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reader = RequestReader()
    decoded: list[int] = []
    real = request_reader._decode

    def counting(raw: Any) -> Any:
        decoded.append(1)
        return real(raw)

    monkeypatch.setattr(request_reader, "_decode", counting)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for i in range(50):
        msgs.append({"role": "user", "content": f"question {i}"})
        decoded.clear()
        _body, conv = reader.read(body_of(msgs))
        assert conv.dialogue_from(len(conv.roles) - 1) == [msgs[-1]]
        # model and stream, and only the messages this request adds
        assert len(decoded) == 2 + (len(msgs) if i == 0 else 2)
        msgs.append({"role": "assistant", "content": f"answer {i}"})
    assert reader.reused == 49
    assert conv.dialogue == msgs[1:-1]  # an older message is read again when asked for


def test_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_reader, "MAX_CONVERSATIONS", 3)
    monkeypatch.setattr(request_reader, "MAX_MESSAGES", 40)
    reader = RequestReader()
    for i in range(10):
        for n in range(1, 8):
            reader.read(body_of([{"role": "user", "content": f"c{i}"}] * n))
        assert len(reader._reads) <= 3 and reader._messages <= 40
        assert reader._messages == sum(r.state.count for rs in reader._reads.values()
                                       for r in rs)


@pytest.mark.parametrize(("body", "message"), [
    (b"[1]", "request body must be a JSON object"),
    (b"{nope", "request body is not JSON"),
    (b'{"model": "m"}', "messages must be a non-empty list"),
    (b'{"model": "m", "messages": {"role": "user"}}', "messages must be a non-empty list"),
    (b'{"model": "m", "messages": []}', "messages must be a non-empty list"),
    (b'{"model": "m", "messages": [3]}', "messages[0] must be an object"),
])
def test_bad_bodies_are_refused_with_the_usual_errors(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as exc:
        RequestReader().read(body)
    assert exc.value.message.startswith(message)
