"""Full compression: the side query, its failure statuses and the post-compact history.

Model calls go over real HTTP to the scripted OpenAI stub; files restored after compaction are
real files in a temporary workspace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.compaction.invariants import problems
from qwenctxd.compaction.post_compact import (
    build_post_compact_history,
    compress,
    is_binary,
)
from qwenctxd.compaction.prompts import (
    ACK_TEXT,
    RESUME_TRAILER,
    SNAPSHOT_SECTIONS,
    SUMMARY_REQUEST,
    compression_system_prompt,
)
from qwenctxd.compaction.summary import slim_for_compaction, strip_analysis, summarize
from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model import ModelClient
from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.tokens import history_tokens

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAcCBlCwAAAABJRU5ErkJggg=="
SNAPSHOT = (
    "<state_snapshot>\n<primary_request_and_intent>Fix the parser.</primary_request_and_intent>\n"
    "<next_step>Add tests.</next_step>\n</state_snapshot>"
)
REPLY = f"<analysis>\nThe user asked to fix the parser; draft notes.\n</analysis>\n{SNAPSHOT}"


def _client(stub: ScriptedOpenAI) -> ModelClient:
    return ModelClient(
        ModelEndpoint(
            base_url=stub.base_url, model="stub-model", fast_model="stub-fast", timeout_s=5
        )
    )


def _call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _tool(cid: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": content}


def _small_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Please fix the parser."},
        {"role": "assistant", "content": "Looking at it now."},
        {"role": "user", "content": "Thanks."},
    ]


# -- pure helpers ---------------------------------------------------------------------------------


def test_strip_analysis_closed_unclosed_and_multiple() -> None:
    assert strip_analysis("<analysis>draft</analysis>\n<state_snapshot>x</state_snapshot>") == (
        "<state_snapshot>x</state_snapshot>"
    )
    assert strip_analysis("<state_snapshot>x</state_snapshot>\n<analysis>cut off mid") == (
        "<state_snapshot>x</state_snapshot>"
    )
    text = "<analysis>a</analysis>keep1 <analysis>b\n</analysis>\nkeep2<analysis>tail"
    assert strip_analysis(text) == "keep1 keep2"
    assert strip_analysis("<analysis>only a draft</analysis>  \n") == ""
    assert strip_analysis("  plain  ") == "plain"


def test_slim_for_compaction_placeholders_and_no_mutation() -> None:
    history = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": PNG}},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/x-[evil]\r\nmime;base64,AA"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": "ok",
            "reasoning_content": "hidden",
            "tool_calls": [_call("c1", "read_file", file_path="a.py")],
        },
    ]
    before = json.dumps(history)
    slim = slim_for_compaction(history)
    assert json.dumps(history) == before
    parts = slim[0]["content"]
    assert parts[1] == {"type": "text", "text": "[image: image/png]"}
    assert parts[2]["text"] == "[image: image/x-evil  mime]"
    assert "reasoning_content" not in slim[1]
    assert slim[1]["tool_calls"][0]["id"] == "c1"


def test_binary_detection() -> None:
    assert is_binary(bytes(range(32)) * 16)
    assert not is_binary("héllo wörld ✓\n\ttabs".encode())
    assert not is_binary(b"")


def test_compression_prompt_has_nine_sections_in_order() -> None:
    prompt = compression_system_prompt()
    positions = [prompt.index(f"<{tag}>...</{tag}>") for tag, _ in SNAPSHOT_SECTIONS]
    assert positions == sorted(positions) and len(positions) == 9
    assert "<analysis>" in prompt and RESUME_TRAILER not in prompt


# -- failure statuses -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_analysis_only_is_empty_summary_and_history_unchanged(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    openai_stub.push(Reply(content="<analysis>I drafted but never wrote the snapshot"))
    history = _small_history()
    client = _client(openai_stub)
    try:
        result = await compress(
            client, history, trigger="manual", workspace_root=tmp_path,
            tokens_before=10_000, estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "failed_empty_summary"
    assert result.history is history
    assert result.tokens_after == result.tokens_before == 10_000


@pytest.mark.asyncio
async def test_length_finish_is_output_truncated(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content=REPLY, finish_reason="length"))
    client = _client(openai_stub)
    try:
        outcome = await summarize(client, _small_history(), trigger="auto")
    finally:
        await client.aclose()
    assert outcome.status == "failed_output_truncated"
    assert outcome.summary_text == SNAPSHOT


@pytest.mark.asyncio
async def test_output_at_cap_is_truncated(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content=REPLY, usage={"prompt_tokens": 10, "completion_tokens": 20_000}))
    client = _client(openai_stub)
    try:
        outcome = await summarize(client, _small_history(), trigger="auto")
    finally:
        await client.aclose()
    assert outcome.status == "failed_output_truncated"
    assert outcome.output_tokens == 20_000


@pytest.mark.asyncio
async def test_model_500_is_model_error_and_history_unchanged(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    openai_stub.push(Reply(fault="http_500"))
    history = _small_history()
    snapshot = json.dumps(history)
    client = _client(openai_stub)
    try:
        result = await compress(
            client, history, trigger="auto", workspace_root=tmp_path,
            tokens_before=10_000, estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "failed_model_error"
    assert result.error == "http_500"
    assert result.history is history and json.dumps(history) == snapshot
    assert len(openai_stub.requests) == 1  # one attempt, no retries


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(content=REPLY, fault="cut_stream", chunk_chars=4), "stream_cut"),
        (Reply(content=REPLY, delay_s=3), "timeout"),
        (Reply(content=""), None),
    ],
)
async def test_side_query_failures(
    openai_stub: ScriptedOpenAI, reply: Reply, reason: str | None
) -> None:
    openai_stub.push(reply)
    client = _client(openai_stub)
    try:
        outcome = await summarize(client, _small_history(), trigger="auto", timeout_s=0.5)
    finally:
        await client.aclose()
    if reason is None:  # an empty reply is an empty summary, not a transport error
        assert outcome.status == "failed_empty_summary"
    else:
        assert outcome.status == "failed_model_error" and outcome.error == reason
    assert not outcome.ok and outcome.summary_text == ""


@pytest.mark.asyncio
async def test_short_history_is_noop_without_a_model_call(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    history = [{"role": "user", "content": "hi"}]
    client = _client(openai_stub)
    try:
        result = await compress(
            client, history, trigger="manual", workspace_root=tmp_path,
            tokens_before=100, estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "noop" and result.history is history
    assert openai_stub.requests == []


@pytest.mark.asyncio
async def test_inflated_summary_keeps_history(openai_stub: ScriptedOpenAI, tmp_path: Path) -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    openai_stub.push(Reply(content="<state_snapshot>" + "word " * 4_000 + "</state_snapshot>"))
    client = _client(openai_stub)
    try:
        result = await compress(
            client, history, trigger="manual", workspace_root=tmp_path,
            tokens_before=history_tokens(history), estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "failed_inflated"
    assert result.history is history
    assert result.tokens_after == result.tokens_before


# -- a successful compression ---------------------------------------------------------------------


def _workspace(tmp_path: Path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("SECRET OUTSIDE CONTENT\n")
    (ws / "src" / "parser.py").write_text("def parse():\n    return 'OLD CONTENT'\n")
    (ws / "logo.bin").write_bytes(bytes(range(32)) * 32)
    (ws / "big.txt").write_text("x" * 30_000)
    (ws / "notes.md").write_text("Notes with a fence:\n````\ncode\n````\n")
    return ws, outside


def _working_history(ws: Path, outside: Path) -> list[dict[str, Any]]:
    parser = str(ws / "src" / "parser.py")
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Fix the parser; here is the failing screen."},
                {"type": "image_url", "image_url": {"url": PNG}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "private chain of thought",
            "tool_calls": [
                _call("c1", "read_file", file_path=parser),
                _call("c2", "read_file", file_path=str(outside)),
                _call("c3", "read_file", file_path=str(ws / "logo.bin")),
            ],
        },
        _tool("c1", "def parse():\n    return 'OLD CONTENT'\n"),
        _tool("c2", "SECRET OUTSIDE CONTENT"),
        _tool("c3", "<binary>"),
        {
            "role": "assistant",
            "content": "Reading the rest.",
            "tool_calls": [
                _call("c4", "read_file", path="big.txt"),
                _call("c5", "read_file", file_path=str(ws / "missing.py")),
                _call("c6", "edit", file_path=parser, old_string="OLD", new_string="NEW"),
                _call("c7", "read_file", file_path="../outside.txt"),
                _call("c8", "write_file", file_path="notes.md", content="..."),
            ],
        },
        _tool("c4", "x" * 30_000),
        _tool("c5", "error: no such file"),
        _tool("c6", "ok"),
        _tool("c7", "SECRET OUTSIDE CONTENT"),
        _tool("c8", "ok"),
        {"role": "assistant", "content": "Fixed the parser."},
        {"role": "user", "content": "Great, now add tests."},
    ]


@pytest.mark.asyncio
async def test_successful_compression(strict_openai_stub: ScriptedOpenAI, tmp_path: Path) -> None:
    stub = strict_openai_stub
    ws, outside = _workspace(tmp_path)
    history = _working_history(ws, outside)
    snapshot = json.dumps(history)
    # The file changes on disk after the model read it: the restored copy must be the new one.
    (ws / "src" / "parser.py").write_text("def parse():\n    return 'NEW CONTENT'\n")
    stub.push(Reply(content=REPLY, usage={"prompt_tokens": 900, "completion_tokens": 60}))
    client = _client(stub)
    try:
        result = await compress(
            client, history, trigger="manual", focus="Focus on the parser API.",
            workspace_root=ws, tokens_before=50_000, estimate_history=history_tokens,
            plan_reminder="<system-reminder>Plan mode is active.</system-reminder>",
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "compressed", result
    assert json.dumps(history) == snapshot  # input untouched

    # The request: streamed, one attempt, capped output, thinking off, slimmed history.
    [req] = stub.requests
    body = req.body
    assert validate_chat_body(body) == []
    assert body["stream"] is True
    assert body["max_tokens"] == 20_000
    assert "enable_thinking" not in body  # the default "openai" profile sends no provider knob
    assert body["tool_choice"] if body.get("tools") else "tool_choice" not in body
    assert stub.rejected == []
    assert body["model"] == "stub-fast"
    sent = json.dumps(body["messages"])
    assert "data:image" not in sent and "[image: image/png]" in sent
    assert "private chain of thought" not in sent and "reasoning_content" not in sent
    system = body["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith(compression_system_prompt())
    assert "Additional instructions:\nFocus on the parser API." in system["content"]
    assert SUMMARY_REQUEST in json.dumps(body["messages"][-1])

    # The new history: summary + trailer, ack, one merged attachment message.
    new = result.history
    assert problems(new) == []
    assert [m["role"] for m in new] == ["user", "assistant", "user"]
    assert new[0]["content"] == f"{SNAPSHOT}\n\n{RESUME_TRAILER}"
    assert "<analysis>" not in new[0]["content"] and result.summary == SNAPSHOT
    assert new[1] == {"role": "assistant", "content": ACK_TEXT}
    attach = new[2]["content"]
    assert isinstance(attach, list)  # carries the user's image
    text = "\n".join(p["text"] for p in attach if p["type"] == "text")
    assert "NEW CONTENT" in text and "OLD CONTENT" not in text
    assert "SECRET OUTSIDE" not in text
    assert f"## {ws / 'notes.md'}\n\n`````\n" in text  # fence longer than the 4 inside
    assert "logo.bin" not in text and "missing.py" not in text
    assert f"- {ws / 'big.txt'}" in text and "x" * 100 not in text
    assert "Plan mode is active." in text
    assert [p for p in attach if p["type"] == "image_url"] == [
        {"type": "image_url", "image_url": {"url": PNG}}
    ]
    assert "user-provided image" in text
    info = result.info
    assert info.files_embedded == [str(ws / "notes.md"), str(ws / "src" / "parser.py")]
    assert info.files_referenced == [str(ws / "big.txt")]
    assert info.images == 1
    assert result.tokens_after == history_tokens(new) < 50_000


def test_images_newest_three_oldest_first(tmp_path: Path) -> None:
    def img(n: int) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,IMG{n}"}}

    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "see"}, img(1)]},
        {"role": "assistant", "content": None, "tool_calls": [_call("s1", "screenshot", w=1)]},
        _tool("s1", [{"type": "text", "text": "shot"}, img(2)]),
        {"role": "assistant", "content": None, "tool_calls": [_call("s2", "screenshot", w=2)]},
        _tool("s2", [img(3)]),
        {"role": "user", "content": [img(4)]},
        {"role": "assistant", "content": None, "tool_calls": [_call("s3", "screenshot", w=3)]},
        _tool("s3", [img(5)]),
        {"role": "assistant", "content": "done"},
    ]
    new, info = build_post_compact_history(
        "<state_snapshot>s</state_snapshot>", original_history=history, workspace_root=tmp_path
    )
    assert info.images == 3
    # nothing current: the attachments ride in the summary message, the ack stays last
    assert [m["role"] for m in new] == ["user", "assistant"]
    parts = new[0]["content"]
    urls = [p["image_url"]["url"][-4:] for p in parts if p["type"] == "image_url"]
    assert urls == ["IMG3", "IMG4", "IMG5"]
    labels = [p["text"] for p in parts if p["type"] == "text" and p["text"].startswith("Image ")]
    assert labels[0].startswith("Image 1: screenshot args=") and '"w": 2' in labels[0]
    assert labels[1] == "Image 2: user-provided image"
    assert problems(new) == []


# -- the pending tool call ------------------------------------------------------------------------


def _pending_history(ws: Path) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Read the config and tell me the port."},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [_call("p0", "glob", pattern="*.toml")],
        },
        _tool("p0", "config.toml"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("p1", "read_file", file_path=str(ws / "config.toml"))],
        },
    ]


@pytest.mark.asyncio
async def test_pending_tool_call_kept_for_auto(
    strict_openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    (tmp_path / "config.toml").write_text("port = 8080\n")
    history = _pending_history(tmp_path)
    strict_openai_stub.push(Reply(content=REPLY))
    client = _client(strict_openai_stub)
    try:
        result = await compress(
            client, history, trigger="auto", workspace_root=tmp_path,
            tokens_before=50_000, estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "compressed"
    [req] = strict_openai_stub.requests
    assert validate_chat_body(req.body) == []  # the running call got a placeholder result
    assert "p1" in json.dumps(req.body["messages"])
    new = result.history
    assert [m["role"] for m in new] == ["user", "assistant", "user", "assistant"]
    assert new[-1]["tool_calls"] == history[-1]["tool_calls"]
    assert "port = 8080" in new[2]["content"]
    assert problems(new, allow_pending_tail=True) == []
    assert problems(new) != []  # the tail really is pending


@pytest.mark.asyncio
async def test_pending_tool_call_kept_for_manual_too(
    strict_openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    """C2: a manual compression while a call is pending keeps the call, so it can be answered."""
    history = _pending_history(tmp_path)  # config.toml does not exist: nothing to attach
    strict_openai_stub.push(Reply(content=REPLY))
    client = _client(strict_openai_stub)
    try:
        result = await compress(
            client, history, trigger="manual", workspace_root=tmp_path,
            tokens_before=50_000, estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "compressed"
    new = result.history
    assert [m["role"] for m in new] == ["user", "assistant"]
    assert new[-1]["tool_calls"] == history[-1]["tool_calls"]  # the ack carries the call
    assert new[-1]["content"].startswith(ACK_TEXT)
    assert problems(new, allow_pending_tail=True) == []


@pytest.mark.asyncio
async def test_current_input_survives_compression(
    strict_openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    """C2: this turn's results (and the call they answer) stay verbatim after the summary, and
    only the past goes into the summary request."""
    (tmp_path / "config.toml").write_text("port = 8080\n")
    history = [*_pending_history(tmp_path), _tool("p1", "CURRENT RESULT port = 8080")]
    strict_openai_stub.push(Reply(content=REPLY))
    client = _client(strict_openai_stub)
    try:
        result = await compress(
            client, history, trigger="auto", workspace_root=tmp_path,
            tokens_before=50_000, estimate_history=history_tokens,
        )  # fmt: skip
    finally:
        await client.aclose()
    assert result.status == "compressed"
    [req] = strict_openai_stub.requests
    assert "CURRENT RESULT" not in json.dumps(req.body["messages"])
    new = result.history
    assert [m["role"] for m in new] == ["user", "assistant", "user", "assistant", "tool"]
    assert new[-1]["content"] == "CURRENT RESULT port = 8080"
    assert new[-2]["tool_calls"] == history[-2]["tool_calls"]
    assert problems(new) == []


def test_pending_call_folds_into_ack_without_attachments(tmp_path: Path) -> None:
    pending = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("p9", "run_shell_command", command="ls")],
    }
    new, info = build_post_compact_history(
        "summary", original_history=[pending], workspace_root=tmp_path, pending_tool_call=pending
    )
    assert [m["role"] for m in new] == ["user", "assistant"]
    assert new[1]["content"] == ACK_TEXT and new[1]["tool_calls"] == pending["tool_calls"]
    assert info.files_embedded == [] and info.images == 0
    assert problems(new, allow_pending_tail=True) == []


def test_budget_overflow_becomes_reference(tmp_path: Path) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text(name * 2_000)  # 2 500 tokens each
    history = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call(f"r{i}", "read_file", file_path=n)
                for i, n in enumerate(["a.txt", "b.txt", "c.txt"])
            ],
        }
    ]
    _, info = build_post_compact_history(
        "s", original_history=history, workspace_root=tmp_path, token_budget=3_500, max_files=2
    )
    # Newest first (c, then b), two files at most; b no longer fits the budget.
    assert info.files_embedded == [str(tmp_path / "c.txt")]
    assert info.files_referenced == [str(tmp_path / "b.txt")]
