"""PreCompact / PostCompact command hooks around a real compression (stub model, real shells)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.compaction.hooks import (
    HookRun,
    matching_commands,
    run_post_compact,
    run_pre_compact,
    sanitize_instructions,
)
from qwenctxd.compaction.post_compact import CompressionResult, compress
from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model import ModelClient
from qwenctxd.protocol.turn_events import HookRan
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.wait import until_async
from qwenctxd.tokens import history_tokens

SNAPSHOT = "<state_snapshot>\n<current_work>Parser fix.</current_work>\n</state_snapshot>"
REPLY = f"<analysis>private draft</analysis>\n{SNAPSHOT}"
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Fix the parser."},
    {"role": "assistant", "content": "Done, the parser handles empty input now."},
    {"role": "user", "content": "Thanks."},
]


def _client(stub: ScriptedOpenAI) -> ModelClient:
    return ModelClient(
        ModelEndpoint(
            base_url=stub.base_url, model="stub-model", fast_model="stub-fast", timeout_s=5
        )
    )


def _py(tmp_path: Path, name: str, body: str) -> str:
    """A shell command running a small Python script (portable across shells)."""
    script = tmp_path / name
    script.write_text(body)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def _cfg(
    event: str, *commands: str | tuple[str, float], matcher: str | None = None
) -> dict[str, Any]:
    hooks = []
    for c in commands:
        cmd, timeout = c if isinstance(c, tuple) else (c, None)
        hook: dict[str, Any] = {"type": "command", "command": cmd}
        if timeout is not None:
            hook["timeout"] = timeout
        hooks.append(hook)
    group: dict[str, Any] = {"hooks": hooks}
    if matcher is not None:
        group["matcher"] = matcher
    return {event: [group]}


async def _compress(
    stub: ScriptedOpenAI, tmp_path: Path, cfg: dict[str, Any], trigger: str = "auto"
) -> CompressionResult:
    async def pre() -> HookRun:
        return await run_pre_compact(
            cfg, trigger=trigger, session_id="sess-1", cwd=tmp_path,
            transcript_path=tmp_path / "sess-1.jsonl",
        )  # fmt: skip

    async def post(summary: str) -> HookRun:
        return await run_post_compact(
            cfg, trigger=trigger, session_id="sess-1", cwd=tmp_path, summary=summary
        )

    client = _client(stub)
    try:
        return await compress(
            client, list(HISTORY), trigger=trigger,  # type: ignore[arg-type]
            workspace_root=tmp_path, tokens_before=50_000, estimate_history=history_tokens,
            pre_hook=pre, post_hook=post,
        )  # fmt: skip
    finally:
        await client.aclose()


def _live_group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (Linux /proc)."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(entry.name))
    return live


def _system_text(stub: ScriptedOpenAI) -> str:
    [req] = stub.requests
    return req.body["messages"][0]["content"]


@pytest.mark.asyncio
async def test_pre_compact_context_reaches_the_summary_request(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    context = "Keep the <b>API</b> names\x07 exactly.\n\tTabs stay. " + "y" * 5_000
    cmd = _py(
        tmp_path,
        "pre.py",
        "import json, sys\n"
        "event = json.load(sys.stdin)\n"
        "open('stdin.json', 'w').write(json.dumps(event))\n"
        f"print(json.dumps({{'hookSpecificOutput': {{'hookEventName': 'PreCompact', "
        f"'additionalContext': {context!r}}}}}))\n",
    )
    openai_stub.push(Reply(content=REPLY))
    result = await _compress(openai_stub, tmp_path, _cfg("PreCompact", cmd, matcher="auto"))
    assert result.status == "compressed"
    system = _system_text(openai_stub)
    extra = system.split("Additional instructions:\n", 1)[1]
    assert extra.startswith("Keep the \u2039b\u203aAPI\u2039/b\u203a names exactly.\n\tTabs stay.")
    assert "<b>" not in extra and "\x07" not in extra
    assert len(extra) == 4_000
    event = json.loads((tmp_path / "stdin.json").read_text())
    assert event == {
        "hook_event_name": "PreCompact",
        "trigger": "auto",
        "session_id": "sess-1",
        "cwd": str(tmp_path),
        "transcript_path": str(tmp_path / "sess-1.jsonl"),
        "custom_instructions": "",
    }
    [ev] = result.hook_events
    assert isinstance(ev, HookRan) and ev.hook == "PreCompact" and ev.status == "ok"


@pytest.mark.asyncio
async def test_plain_text_output_and_matcher(openai_stub: ScriptedOpenAI, tmp_path: Path) -> None:
    cfg = {
        "PreCompact": [
            {"matcher": "manual", "hooks": [{"type": "command", "command": "echo MANUAL-ONLY"}]},
            {
                "matcher": "auto|manual",
                "hooks": [{"type": "command", "command": "echo plain text"}],
            },
        ]
    }
    openai_stub.push(Reply(content=REPLY))
    result = await _compress(openai_stub, tmp_path, cfg, trigger="auto")
    assert result.status == "compressed"
    system = _system_text(openai_stub)
    assert system.endswith("Additional instructions:\nplain text")
    assert "MANUAL-ONLY" not in system
    assert len(result.hook_events) == 1


@pytest.mark.asyncio
async def test_slow_hook_is_killed_and_compaction_succeeds(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    pidfile = tmp_path / "hook.pid"
    cmd = f"echo $$ > {shlex.quote(str(pidfile))}; sleep 30; echo too-late"
    openai_stub.push(Reply(content=REPLY))
    started = time.monotonic()
    result = await _compress(openai_stub, tmp_path, _cfg("PreCompact", (cmd, 1)))
    assert time.monotonic() - started < 8
    assert result.status == "compressed"
    [ev] = result.hook_events
    assert ev.status == "timeout" and ev.hook == "PreCompact" and ev.timeout_s == 1
    assert "too-late" not in _system_text(openai_stub)
    assert "Additional instructions" not in _system_text(openai_stub)
    pgid = int(pidfile.read_text())
    # SIGKILLed members linger as zombies until init reaps them
    await until_async(lambda: _live_group_members(pgid) == [],
                      what="the hook's shell and its sleep to be gone")


@pytest.mark.asyncio
async def test_failing_hook_is_reported_and_ignored(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    cmd = "echo 'do not use this'; echo 'boom' >&2; exit 3"
    openai_stub.push(Reply(content=REPLY))
    result = await _compress(openai_stub, tmp_path, _cfg("PreCompact", cmd))
    assert result.status == "compressed"
    [ev] = result.hook_events
    assert ev.status == "failed" and ev.exit_code == 3 and ev.stderr == "boom"
    assert "do not use this" not in _system_text(openai_stub)


@pytest.mark.asyncio
async def test_post_compact_receives_stripped_summary(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    out = tmp_path / "post.json"
    cfg = _cfg("PostCompact", f"cat > {shlex.quote(str(out))}", matcher="*")
    openai_stub.push(Reply(content=REPLY))
    result = await _compress(openai_stub, tmp_path, cfg, trigger="manual")
    assert result.status == "compressed"
    event = json.loads(out.read_text())
    assert event["hook_event_name"] == "PostCompact"
    assert event["trigger"] == "manual" and event["session_id"] == "sess-1"
    assert event["summary"] == SNAPSHOT and "private draft" not in event["summary"]
    [ev] = result.hook_events
    assert ev.hook == "PostCompact" and ev.status == "ok"


@pytest.mark.asyncio
async def test_post_compact_not_run_when_compaction_fails(
    openai_stub: ScriptedOpenAI, tmp_path: Path
) -> None:
    out = tmp_path / "post.json"
    openai_stub.push(Reply(fault="http_500"))
    result = await _compress(
        openai_stub, tmp_path, _cfg("PostCompact", f"touch {shlex.quote(str(out))}")
    )
    assert result.status == "failed_model_error"
    assert not out.exists() and result.hook_events == []


@pytest.mark.asyncio
async def test_failing_post_hook_never_raises(tmp_path: Path) -> None:
    run = await run_post_compact(
        _cfg("PostCompact", "exit 1", "definitely-not-a-command-xyz"),
        trigger="auto", session_id="s", cwd=tmp_path, summary="s",
    )  # fmt: skip
    assert [e.status for e in run.events] == ["failed", "failed"]
    assert run.additional_instructions is None


def test_matching_and_timeouts() -> None:
    cfg = {
        "PreCompact": [
            {"matcher": "auto", "hooks": [{"type": "command", "command": "a", "timeout": 3}]},
            {"matcher": "manual", "hooks": [{"type": "command", "command": "m"}]},
            {"hooks": [{"type": "command", "command": "all", "timeout": 5000}]},
            {"matcher": "^(au|xx)", "hooks": [{"type": "command", "command": "re"}]},
            {
                "matcher": "auto",
                "hooks": [{"type": "http", "url": "http://x"}, "junk", {"command": ""}],
            },
            "junk",
        ],
        "PostCompact": "junk",
    }
    cmds = matching_commands(cfg, "PreCompact", "auto")
    assert [(c.command, c.timeout_s) for c in cmds] == [("a", 3.0), ("all", 5.0), ("re", 10.0)]
    assert [c.command for c in matching_commands(cfg, "PreCompact", "manual")] == ["m", "all"]
    assert matching_commands(cfg, "PostCompact", "auto") == []
    assert matching_commands(None, "PreCompact", "auto") == []


def test_sanitize_instructions() -> None:
    assert sanitize_instructions("a<x>\x00\x1b[31mb\r\nc\td") == "a\u2039x\u203a[31mb\nc\td"
    assert len(sanitize_instructions("z" * 9_000)) == 4_000
