"""Session recap and project summary against the scripted model over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qwenctxd.compaction.prompts import project_summary_prompt, recap_prompt
from qwenctxd.compaction.recap import dialog_messages, parse_recap, project_summary, recap
from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model import ModelClient
from qwenctxd.protocol.errors import ModelUnavailable
from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI

SUMMARY_MD = """# Project Summary

## Overall Goal
Make the parser accept empty input.

## Key Knowledge
- Tests run with `pytest -q`.

## Recent Actions
- Fixed `parse()` in src/parser.py.

## Current Plan
1. [DONE] Fix the parser.
2. [IN PROGRESS] Add tests.
3. [TODO] Update the changelog."""


def _client(stub: ScriptedOpenAI) -> ModelClient:
    return ModelClient(
        ModelEndpoint(
            base_url=stub.base_url, model="stub-model", fast_model="stub-fast", timeout_s=5
        )
    )


def _long_history() -> list[dict[str, Any]]:
    """41 dialog messages (user at even numbers) with tool traffic and reasoning in between."""
    history: list[dict[str, Any]] = []
    for n in range(41):
        if n % 2 == 0:
            history.append({"role": "user", "content": f"user message {n}"})
            continue
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"file_path": f"f{n}.py"})},
        }
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"TOOL DUMP {n}"})
        history.append(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": f"assistant message {n}"}],
                "reasoning_content": f"HIDDEN THOUGHT {n}",
            }
        )
    return history


@pytest.mark.asyncio
async def test_recap_sends_recent_dialog_only(strict_openai_stub: ScriptedOpenAI) -> None:
    stub = strict_openai_stub
    stub.push(Reply(content="<recap>You are fixing the parser.\nNext, add tests.</recap>"))
    client = _client(stub)
    try:
        result = await recap(client, _long_history())
    finally:
        await client.aclose()
    assert result.status == "ok" and result.reason is None
    assert result.text == "You are fixing the parser. Next, add tests."

    [req] = stub.requests
    body = req.body
    assert validate_chat_body(body) == []
    assert body["max_tokens"] == 300 and body["temperature"] == 0.3
    assert body["model"] == "stub-fast"
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": recap_prompt()}
    dialog = messages[1:]
    assert {m["role"] for m in dialog} == {"user", "assistant"}
    assert all(set(m) == {"role", "content"} for m in dialog)
    sent = json.dumps(dialog)
    assert "TOOL DUMP" not in sent and "HIDDEN THOUGHT" not in sent and "tool_calls" not in sent
    # The last 30 dialog messages are 11..40; 11 is an assistant reply, so the slice starts at 12.
    assert dialog[0] == {"role": "user", "content": "user message 12"}
    assert "user message 10" not in sent and "assistant message 11" not in sent
    assert len(dialog) == 29
    assert dialog[-1]["content"].startswith("user message 40")
    assert "<recap>" in dialog[-1]["content"]  # the request rides on the last user turn


def test_dialog_slice_and_merge() -> None:
    history = [
        {"role": "assistant", "content": "stray reply"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
        {"role": "assistant", "content": "first"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "x", "content": "files"},
        {"role": "assistant", "content": "second"},
        {"role": "system", "content": "ignored"},
    ]
    assert dialog_messages(history) == [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": "first\n\nsecond"},
    ]
    assert dialog_messages([{"role": "assistant", "content": "only me"}]) == []


def test_parse_recap() -> None:
    assert parse_recap("<think>hmm</think><recap> A.  B. </recap>") == "A. B."
    assert parse_recap("You are fixing the parser. Next, add tests.") == (
        "You are fixing the parser. Next, add tests."
    )
    assert parse_recap("One. Two. Three. Four.") is None
    assert parse_recap("<recap>One. Two. Three. Four.</recap>") == "One. Two. Three. Four."
    assert parse_recap("<recap>cut off mid") == "cut off mid"
    assert parse_recap("<recap></recap>") is None
    assert parse_recap("") is None


@pytest.mark.asyncio
async def test_recap_without_model_is_unavailable() -> None:
    client = ModelClient(ModelEndpoint())
    try:
        result = await recap(client, [{"role": "user", "content": "hi"}])
    finally:
        await client.aclose()
    assert result.status == "unavailable" and result.reason == "not_configured"
    assert result.text is None
    none = await recap(None, [{"role": "user", "content": "hi"}])
    assert none.status == "unavailable" and none.reason == "not_configured"


@pytest.mark.asyncio
async def test_recap_model_error_is_unavailable(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(fault="http_500"))
    client = _client(openai_stub)
    try:
        result = await recap(client, [{"role": "user", "content": "hi"}])
    finally:
        await client.aclose()
    assert result.status == "unavailable" and result.reason == "http_500"


@pytest.mark.asyncio
async def test_recap_empty_cases(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="Sure! " + "This is a sentence. " * 6))
    client = _client(openai_stub)
    try:
        no_dialog = await recap(client, [{"role": "tool", "tool_call_id": "x", "content": "dump"}])
        rambling = await recap(client, [{"role": "user", "content": "hi"}])
    finally:
        await client.aclose()
    assert no_dialog.status == "empty" and no_dialog.reason == "no_dialog"
    assert rambling.status == "empty" and rambling.text is None
    assert len(openai_stub.requests) == 1


@pytest.mark.asyncio
async def test_project_summary_returns_markdown(strict_openai_stub: ScriptedOpenAI) -> None:
    stub = strict_openai_stub
    stub.push(Reply(content="Here is the summary:\n\n" + SUMMARY_MD))
    history = _long_history()[:6]
    client = _client(stub)
    try:
        text = await project_summary(client, history)
    finally:
        await client.aclose()
    assert text == SUMMARY_MD
    [req] = stub.requests
    assert validate_chat_body(req.body) == []
    assert req.body["stream"] is True and req.body["model"] == "stub-model"
    assert req.body["messages"][0] == {"role": "system", "content": project_summary_prompt()}
    assert "HIDDEN THOUGHT" not in json.dumps(req.body["messages"])


@pytest.mark.asyncio
async def test_project_summary_failure_raises(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(fault="http_500"))
    client = _client(openai_stub)
    try:
        with pytest.raises(ModelUnavailable) as info:
            await project_summary(client, [{"role": "user", "content": "hi"}])
    finally:
        await client.aclose()
    assert info.value.data["reason"] == "http_500"


@pytest.mark.asyncio
async def test_recap_drops_embedded_system_reminders_and_asks_for_the_language(
        strict_openai_stub: ScriptedOpenAI) -> None:
    stub = strict_openai_stub
    stub.push(Reply(content="<recap>你在修解析器。下一步：加测试。</recap>"))
    history = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nRULE BODY\n</system-reminder>"},
            {"type": "text", "text": "修一下解析器"}]},
        {"role": "assistant", "content": "好的。"},
        {"role": "user", "content": "before <system-reminder>MEMORY BODY</system-reminder> after"},
    ]
    client = _client(stub)
    try:
        result = await recap(client, history)
    finally:
        await client.aclose()
    assert result.status == "ok" and result.text == "你在修解析器。下一步：加测试。"
    [req] = stub.requests
    sent = json.dumps(req.body["messages"][1:], ensure_ascii=False)
    assert "RULE BODY" not in sent and "MEMORY BODY" not in sent and "system-reminder" not in sent
    assert "修一下解析器" in sent and "before" in sent and "after" in sent
    assert "language" in req.body["messages"][0]["content"]
    assert dialog_messages([{"role": "user", "content": "<system-reminder>x</system-reminder>"}]
                           ) == []
