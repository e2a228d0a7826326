"""PreCompact and PostCompact command hooks, configured as in Qwen Code / Claude Code settings.

Settings shape (the ``hooks`` key of settings.json)::

    {"PreCompact": [{"matcher": "manual" | "auto" | "*" | "",
                     "hooks": [{"type": "command", "command": "...", "timeout": 10}]}],
     "PostCompact": [...]}

Every matching command runs through the shell in the session's cwd, in its own process group,
with the event as JSON on stdin; matching commands of one event run concurrently. A command that
outlives its timeout (default 10 s) has its whole process group killed (a hook that exits on
its own keeps any background child it started; its pipes are dropped after a short grace).
PreCompact stdout is
either plain text or JSON carrying ``additionalContext`` (top level or under
``hookSpecificOutput``); the collected text is sanitised (control characters removed, ``<``/``>``
replaced so it cannot open or close prompt tags) and capped at 4 000 characters. A non-zero exit
is reported as ``failed`` and its output ignored. Nothing here raises for a hook's behaviour:
every outcome is a :class:`~qwenctxd.protocol.turn_events.HookRan` event in
:attr:`HookRun.events`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio
import anyio.abc
import msgspec
import structlog

from qwenctxd.protocol.turn_events import HookRan

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_INSTRUCTIONS_CHARS",
    "HookRun",
    "matching_commands",
    "run_post_compact",
    "run_pre_compact",
    "sanitize_instructions",
]

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S: Final = 10.0
MAX_TIMEOUT_S: Final = 600.0
MAX_INSTRUCTIONS_CHARS: Final = 4_000
_OUTPUT_CAP: Final = 256 * 1024
_STDERR_TAIL: Final = 300
_DRAIN_GRACE_S: Final = 0.5
_PLAIN_MATCHER = re.compile(r"^[A-Za-z0-9_|\s-]+$")


class HookRun(msgspec.Struct, kw_only=True):
    """What running one event's hooks produced."""

    additional_instructions: str | None = None
    events: list[HookRan] = msgspec.field(default_factory=list)


class _Command(msgspec.Struct, frozen=True):
    command: str
    timeout_s: float


class _Outcome(msgspec.Struct, kw_only=True):
    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    elapsed_ms: int = 0


def _matches(matcher: Any, trigger: str) -> bool:
    if matcher is None or (isinstance(matcher, str) and matcher.strip() in ("", "*")):
        return True
    if not isinstance(matcher, str):
        return False
    if _PLAIN_MATCHER.match(matcher):
        return trigger in {m.strip() for m in matcher.split("|")}
    try:
        return re.search(matcher, trigger) is not None
    except re.error:
        return False


def _timeout_of(hook: Mapping[str, Any]) -> float:
    value = hook.get("timeout")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return DEFAULT_TIMEOUT_S
    # Claude Code uses seconds; gemini-cli lineage configs often carry milliseconds (5000).
    seconds = value / 1000 if value >= 1000 else float(value)
    return min(seconds, MAX_TIMEOUT_S)


def matching_commands(hooks_cfg: Any, event: str, trigger: str) -> list[_Command]:
    """The command hooks configured for ``event`` whose matcher accepts ``trigger``.

    Malformed entries (wrong types, non-command hooks, empty commands) are skipped.
    """
    groups = hooks_cfg.get(event) if isinstance(hooks_cfg, Mapping) else None
    if not isinstance(groups, Sequence) or isinstance(groups, str):
        return []
    out: list[_Command] = []
    for group in groups:
        if not isinstance(group, Mapping) or not _matches(group.get("matcher"), trigger):
            continue
        hooks = group.get("hooks")
        if not isinstance(hooks, Sequence) or isinstance(hooks, str):
            continue
        for hook in hooks:
            if not isinstance(hook, Mapping) or hook.get("type", "command") != "command":
                continue
            command = hook.get("command")
            if isinstance(command, str) and command.strip():
                out.append(_Command(command, _timeout_of(hook)))
    return out


def sanitize_instructions(text: str, cap: int = MAX_INSTRUCTIONS_CHARS) -> str:
    """Drop control characters (keeping newline and tab), neutralise ``<``/``>``, cap length."""
    text = text.replace("\r\n", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or ch.isprintable())
    text = text.replace("<", "\u2039").replace(">", "\u203a")
    return text.strip()[:cap].rstrip()


def _instructions_from(stdout: str) -> str | None:
    body = stdout.strip()
    if not body:
        return None
    if body.startswith("{"):
        try:
            value = json.loads(body)
        except ValueError:
            return body
        if not isinstance(value, dict):
            return body
        specific = value.get("hookSpecificOutput")
        for source in (specific if isinstance(specific, dict) else {}, value):
            ctx = source.get("additionalContext")
            if isinstance(ctx, str) and ctx.strip():
                return ctx
        return None  # JSON control output without extra context
    return body


def _kill_group(proc: anyio.abc.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


async def _drain(
    stream: anyio.abc.ByteReceiveStream | None, sink: bytearray, done: anyio.Event
) -> None:
    try:
        if stream is not None:
            async for chunk in stream:
                room = _OUTPUT_CAP - len(sink)
                if room > 0:
                    sink.extend(chunk[:room])
    finally:
        done.set()


async def _run_command(cmd: _Command, payload: bytes, cwd: str | None) -> _Outcome:
    """Run one hook command under its timeout; never raises for the command's behaviour."""
    started = time.monotonic()
    env = dict(os.environ)
    if cwd:
        env.setdefault("QWEN_PROJECT_DIR", cwd)
        env.setdefault("CLAUDE_PROJECT_DIR", cwd)
    out, err = bytearray(), bytearray()
    status, code = "ok", None
    try:
        proc = await anyio.open_process(
            cmd.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd or None,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return _Outcome(status="error", stderr=f"could not start: {type(exc).__name__}")
    drained = [anyio.Event(), anyio.Event()]
    try:
        with anyio.move_on_after(cmd.timeout_s) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, proc.stdout, out, drained[0])
                tg.start_soon(_drain, proc.stderr, err, drained[1])
                if proc.stdin is not None:
                    try:
                        await proc.stdin.send(payload)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass  # the hook does not read its stdin
                    await proc.stdin.aclose()
                code = await proc.wait()
                # A child the hook left running in the background may hold the pipes open.
                with anyio.move_on_after(_DRAIN_GRACE_S):
                    for ev in drained:
                        await ev.wait()
                tg.cancel_scope.cancel()
        if scope.cancelled_caught and code is None:
            status = "timeout"
    finally:
        if proc.returncode is None:  # timed out or cancelled: kill the hook and its children
            _kill_group(proc)
        with anyio.CancelScope(shield=True):
            await proc.aclose()
    if status == "ok" and code != 0:
        status = "failed"
    return _Outcome(
        status=status,
        exit_code=code,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        elapsed_ms=round((time.monotonic() - started) * 1000),
    )


def _event(hook: str, cmd: _Command, res: _Outcome) -> HookRan:
    return HookRan(
        hook=hook,
        command=cmd.command if len(cmd.command) <= 200 else cmd.command[:200] + "…",
        status=res.status,
        elapsed_ms=res.elapsed_ms,
        exit_code=res.exit_code,
        timeout_s=cmd.timeout_s if res.status == "timeout" else None,
        stderr=(sanitize_instructions(res.stderr[-_STDERR_TAIL:], _STDERR_TAIL)
                if res.status != "ok" and res.stderr.strip() else None),
    )


async def _run_all(
    hook: str, cmds: list[_Command], payload: dict[str, Any], cwd: str | None
) -> list[_Outcome]:
    data = json.dumps(payload, ensure_ascii=False).encode()
    results: list[_Outcome | None] = [None] * len(cmds)

    async def one(i: int) -> None:
        try:
            results[i] = await _run_command(cmds[i], data, cwd)
        except Exception as exc:  # defensive: a hook must never break compaction
            log.warning("hook_run_error", hook=hook, error_type=type(exc).__name__)
            results[i] = _Outcome(status="error", stderr=type(exc).__name__)

    async with anyio.create_task_group() as tg:
        for i in range(len(cmds)):
            tg.start_soon(one, i)
    done = [r if r is not None else _Outcome(status="error") for r in results]
    for cmd, res in zip(cmds, done, strict=True):
        (log.info if res.status == "ok" else log.warning)(
            "hook_ran", hook=hook, status=res.status, exit_code=res.exit_code,
            elapsed_ms=res.elapsed_ms, timeout_s=cmd.timeout_s,
        )  # fmt: skip
    return done


async def run_pre_compact(
    hooks_cfg: Any,
    *,
    trigger: str,
    session_id: str,
    cwd: str | os.PathLike[str] | None,
    transcript_path: str | os.PathLike[str] | None = None,
    custom_instructions: str | None = None,
) -> HookRun:
    """Run the matching PreCompact hooks; their extra instructions are sanitised and capped."""
    cmds = matching_commands(hooks_cfg, "PreCompact", trigger)
    if not cmds:
        return HookRun()
    cwd_s, payload = _payload("PreCompact", trigger, session_id, cwd, transcript_path,
                              custom_instructions=custom_instructions or "")
    outcomes = await _run_all("PreCompact", cmds, payload, cwd_s)
    texts = []
    for res in outcomes:
        text = _instructions_from(res.stdout) if res.status == "ok" else None
        if text:
            texts.append(text)
    joined = sanitize_instructions("\n\n".join(texts)) if texts else ""
    return HookRun(
        additional_instructions=joined or None,
        events=[_event("PreCompact", c, r) for c, r in zip(cmds, outcomes, strict=True)],
    )


def _payload(event: str, trigger: str, session_id: str, cwd: str | os.PathLike[str] | None,
             transcript_path: str | os.PathLike[str] | None, **extra: Any
             ) -> tuple[str | None, dict[str, Any]]:
    """(cwd as str, the JSON a hook receives on stdin) for ``event``."""
    cwd_s = os.fspath(cwd) if cwd is not None else None
    return cwd_s, {
        "hook_event_name": event,
        "trigger": trigger,
        "session_id": session_id,
        "cwd": cwd_s,
        "transcript_path": os.fspath(transcript_path) if transcript_path is not None else None,
        **extra,
    }


async def run_post_compact(
    hooks_cfg: Any,
    *,
    trigger: str,
    session_id: str,
    cwd: str | os.PathLike[str] | None,
    summary: str,
    transcript_path: str | os.PathLike[str] | None = None,
) -> HookRun:
    """Run the matching PostCompact hooks with the (analysis-stripped) summary on stdin."""
    cmds = matching_commands(hooks_cfg, "PostCompact", trigger)
    if not cmds:
        return HookRun()
    cwd_s, payload = _payload("PostCompact", trigger, session_id, cwd, transcript_path,
                              summary=summary)
    outcomes = await _run_all("PostCompact", cmds, payload, cwd_s)
    return HookRun(
        events=[_event("PostCompact", c, r) for c, r in zip(cmds, outcomes, strict=True)]
    )
