"""The OpenAI ↔ Gemini Content converter of session files: shapes and a round-trip property."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.sessions.gemini_format import (
    to_content,
    to_contents,
    to_message_list,
    to_messages,
    to_openai_usage,
    to_usage_metadata,
)
from qwenctxd.testing.chat_validation import validate_chat_body

PNG = "data:image/png;base64,iVBORw0KGgo="


def test_shapes_qwen_code_writes() -> None:
    names: dict[str, str] = {}
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"file_path":"/a"}'}}
    assert to_content({"role": "assistant", "content": "ok", "tool_calls": [call]}, names) == {
        "role": "model", "parts": [{"text": "ok"}, {"functionCall": {
            "id": "c1", "name": "read_file", "args": {"file_path": "/a"}}}]}
    assert to_content({"role": "tool", "tool_call_id": "c1", "content": "data"}, names) == {
        "role": "user", "parts": [{"functionResponse": {
            "id": "c1", "name": "read_file", "response": {"output": "data"}}}]}
    assert to_content({"role": "tool", "tool_call_id": "c1", "content": "boom",
                       "is_error": True}, names)["parts"][0]["functionResponse"]["response"] == {
        "error": "boom"}
    assert to_content({"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": PNG}}]}) == {
        "role": "user", "parts": [{"text": "see"},
                                  {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]}
    assert to_usage_metadata({"prompt_tokens": 7, "completion_tokens": 3}) == {
        "promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10}
    assert to_openai_usage({"promptTokenCount": 7, "candidatesTokenCount": 3,
                            "thoughtsTokenCount": 2}) == {"prompt_tokens": 7,
                                                          "completion_tokens": 5}


def test_a_user_content_with_responses_and_text_splits_tool_messages_first() -> None:
    content = {"role": "user", "parts": [
        {"functionResponse": {"id": "a", "name": "x", "response": {"output": "1"}}},
        {"functionResponse": {"id": "b", "name": "y", "response": {"output": "2"}}},
        {"text": "and now this"}]}
    assert to_messages(content) == [
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "user", "content": "and now this"}]


def test_legacy_openai_payloads_pass_through() -> None:
    old = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert to_message_list(old) == old


# -- round trip: any valid history comes back identical ------------------------------------------
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
args = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6),
                       st.one_of(st.integers(), text, st.booleans()), max_size=3)
ARG_FORMS = st.sampled_from(["compact", "spaced", "raw"])


@st.composite
def histories(draw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    n = 0
    for _ in range(draw(st.integers(1, 5))):
        parts = draw(st.lists(st.one_of(
            text.map(lambda t: {"type": "text", "text": t}),
            st.just({"type": "image_url", "image_url": {"url": PNG}})), min_size=2, max_size=3))
        msgs.append({"role": "user", "content": draw(st.one_of(text, st.just(parts)))})
        calls = []
        for _ in range(draw(st.integers(0, 2))):
            n += 1
            a = draw(args)
            form = draw(ARG_FORMS)
            arguments = (json.dumps(a, separators=(",", ":"), ensure_ascii=False)
                         if form == "compact" else json.dumps(a) if form == "spaced"
                         else "{not json " + str(n))
            calls.append({"id": f"call_{n}", "type": "function",
                          "function": {"name": draw(st.sampled_from(["read_file", "edit"])),
                                       "arguments": arguments}})
        reply: dict[str, Any] = {"role": "assistant"}
        if calls:
            if draw(st.booleans()):
                reply["content"] = draw(text.filter(bool))
            reply["tool_calls"] = calls
        else:
            reply["content"] = draw(text.filter(bool))
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(text.filter(bool))
        msgs.append(reply)
        for c in calls:
            tool: dict[str, Any] = {"role": "tool", "tool_call_id": c["id"],
                                    "content": draw(text)}
            if draw(st.booleans()):
                tool["name"] = c["function"]["name"]
            if draw(st.booleans()):
                tool["is_error"] = True
            msgs.append(tool)
        if calls:
            msgs.append({"role": "assistant", "content": draw(text.filter(bool))})
    return msgs


@settings(max_examples=150, deadline=None)
@given(histories())
def test_round_trip_through_contents_is_lossless(history: list[dict[str, Any]]) -> None:
    names: dict[str, str] = {}
    per_record = [to_content(m, names) for m in history]
    assert all(c["role"] in ("user", "model") and c["parts"] for c in per_record)
    assert to_message_list(json.loads(json.dumps(per_record))) == history
    # a checkpoint's compressed history (tool results merged per turn) reads back the same
    assert to_message_list(to_contents(history)) == history
    body = {"model": "m", "messages": to_message_list(per_record)}
    assert validate_chat_body(body) == []


def test_display_text_hides_reminders_from_qwen_codes_session_list(tmp_path: Any) -> None:
    from qwenctxd.sessions.jsonl_writer import JsonlWriter

    path = tmp_path / "0b7f0f53-8a34-4d56-9f5a-6c1d8b0d9e01.jsonl"
    with JsonlWriter(path, fsync="never") as w:
        w.append_message("user", {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nskills\n</system-reminder>"},
            {"type": "text", "text": "fix the test"}]})
        w.append_message("user", {"role": "user", "content": "plain"})
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["systemPayload"] == {"displayText": "fix the test"}
    assert len(first["message"]["parts"]) == 2  # the model still sees the reminder
    assert "systemPayload" not in second
