"""The history after a full compression, and the orchestration of one compression.

A compression summarises the *past* and keeps the *present*. :func:`split_current_input`
cuts the history into the part to summarise, the pending tool-call message (an assistant
message whose calls this turn's results answer, or whose results are still to come) and the
current input (this turn's tool results and/or the user's words). Only the first part (plus
the pending call, so the summary knows what was running) goes into the summary request.
:func:`build_post_compact_history` then builds::

    user       summary + RESUME_TRAILER
    assistant  ACK_TEXT
    user       attachments: files re-read from disk now, the newest images, plan reminder
    assistant  the pending tool call, verbatim
    tool …     this turn's results (current input)
    user       this turn's words / reminders (current input)

with the attachments folded so roles always alternate (protocol C1): without a pending call
they ride in front of the current user message, or — with no current input at all — in the
summary message; without attachments the ack carries the pending call itself. The last
message is always the current input (C2), and a pending call can still be answered.
:func:`compress` runs the whole thing: guards, PreCompact hook, the side query
(:func:`qwenctxd.compaction.summary.summarize`), the new history, the inflation check and the
PostCompact hook. A failure of any kind returns the original history object unchanged.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
import structlog

from qwenctxd.compaction.hooks import HookRun
from qwenctxd.compaction.prompts import ACK_TEXT, RESUME_TRAILER
from qwenctxd.compaction.summary import Trigger, strip_analysis, summarize
from qwenctxd.fsutil import open_regular
from qwenctxd.instructions.tool_roles import QWEN_FILE_TOOLS
from qwenctxd.protocol.turn_events import HookRan
from qwenctxd.tokens import CHARS_PER_TOKEN, estimate_tokens

if TYPE_CHECKING:
    from qwenctxd.model.client import ModelClient

__all__ = [
    "FILE_TOOLS",
    "AttachmentInfo",
    "CompressionResult",
    "build_post_compact_history",
    "compress",
    "is_binary",
    "pending_tool_call",
    "recent_file_paths",
    "split_current_input",
]

log = structlog.get_logger(__name__)

FILE_TOOLS: Final = QWEN_FILE_TOOLS
_PATH_KEYS: Final = ("file_path", "path", "absolute_path")
REASONING_KEYS: Final = ("reasoning_content", "reasoning", "thinking")
#: file tool name → the parameter naming its file (``ToolRoles.file_params``)
FileToolSet = Mapping[str, str]
_BACKTICKS = re.compile(r"`+")
SUMMARY_UNAVAILABLE: Final = "[Summary unavailable]"

_FILES_HEAD = "Files the session had open before it was compacted, re-read from disk just now:"
_REFS_HEAD = (
    "These recently used files are too large to include here and are listed for reference "
    "only; read them again with read_file if you need their current content:"
)
_IMAGES_HEAD = "The most recent images from before the compaction (oldest first):"


class AttachmentInfo(msgspec.Struct, kw_only=True):
    """What the attachment message carries (paths as shown to the model)."""

    files_embedded: list[str] = msgspec.field(default_factory=list)
    files_referenced: list[str] = msgspec.field(default_factory=list)
    images: int = 0


class CompressionResult(msgspec.Struct, kw_only=True):
    """The outcome of :func:`compress`; ``history`` is the original object on any failure."""

    status: str
    history: list[dict[str, Any]]
    tokens_before: int
    tokens_after: int
    summary: str = ""
    info: AttachmentInfo = msgspec.field(default_factory=AttachmentInfo)
    hook_events: list[HookRan] = msgspec.field(default_factory=list)
    error: str | None = None


# -- files ---------------------------------------------------------------------------------------


def is_binary(head: bytes) -> bool:
    """True when over 30% of ``head`` (the first 512 bytes) is control bytes.

    Tab, newline, carriage return, form feed and backspace are text; bytes >= 0x80 count as
    printable (UTF-8 and legacy encodings).
    """
    if not head:
        return False
    bad = sum(1 for b in head if (b < 0x20 and b not in (8, 9, 10, 12, 13)) or b == 0x7F)
    return bad / len(head) > 0.30


def _call_path(call: Mapping[str, Any], file_tools: FileToolSet | None) -> str | None:
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        return None
    name = fn.get("name")
    if file_tools is None:
        if name not in FILE_TOOLS:
            return None
        keys: Sequence[str] = _PATH_KEYS
    else:
        key = file_tools.get(name) if isinstance(name, str) else None
        if key is None:
            return None
        keys = (key,)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, Mapping):
        return None
    for key in keys:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def recent_file_paths(
    history: Sequence[Mapping[str, Any]],
    file_tools: FileToolSet | None = None,
    touched_paths: Sequence[str] = (),
) -> list[str]:
    """Paths the session used, newest first, deduplicated: ``touched_paths`` (oldest first, as
    the client reported them) and the paths named by file tool calls (``file_tools``: tool name
    → path parameter, from the declared tools; None: Qwen Code's read/write/edit/replace)."""
    seen: list[str] = []
    for raw in reversed(list(touched_paths)):
        if isinstance(raw, str) and raw.strip() and raw.strip() not in seen:
            seen.append(raw.strip())
    for msg in reversed(history):
        if msg.get("role") != "assistant":
            continue
        for call in reversed(msg.get("tool_calls") or []):
            path = _call_path(call, file_tools) if isinstance(call, Mapping) else None
            if path and path not in seen:
                seen.append(path)
    return seen


def _fence(text: str) -> str:
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    return "`" * max(3, longest + 1)


def _collect_files(
    history: Sequence[Mapping[str, Any]],
    root: Path,
    max_files: int,
    per_file_tokens: int,
    token_budget: int,
    file_tools: FileToolSet | None = None,
    touched_paths: Sequence[str] = (),
) -> tuple[list[tuple[str, str]], list[str]]:
    """(embedded (path, text) pairs, referenced paths) for the newest usable files."""
    try:
        base = root.resolve()
    except OSError:
        return [], []
    embedded: list[tuple[str, str]] = []
    referenced: list[str] = []
    seen: set[Path] = set()
    used = 0
    byte_cap = per_file_tokens * CHARS_PER_TOKEN * 4  # more bytes than this: over the cap
    for raw in recent_file_paths(history, file_tools, touched_paths):
        if len(embedded) + len(referenced) >= max_files:
            break
        shown = os.path.normpath(os.path.join(base, os.path.expanduser(raw)))
        try:
            real = Path(shown).resolve()
            if real in seen or not real.is_relative_to(base) or not real.is_file():
                continue
            seen.add(real)
            with open_regular(real) as fh:
                data = fh.read(byte_cap + 1)
        except OSError:
            continue
        if is_binary(data[:512]):
            continue
        text = data.decode("utf-8", errors="replace")
        cost = estimate_tokens(text)
        if len(data) > byte_cap or cost > per_file_tokens or used + cost > token_budget:
            referenced.append(shown)
            continue
        used += cost
        embedded.append((shown, text))
    return embedded, referenced


# -- images --------------------------------------------------------------------------------------


def _call_label(call: Mapping[str, Any]) -> str:
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    name = fn.get("name") or "tool"
    args = fn.get("arguments")
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, default=str)
    if len(args) > 200:
        args = args[:200] + "…"
    return f"{name} args={args}"


def _collect_images(history: Sequence[Mapping[str, Any]], limit: int) -> list[tuple[str, dict]]:
    """The newest ``limit`` image parts, oldest first, each with where it came from."""
    calls: dict[str, Mapping[str, Any]] = {}
    found: list[tuple[str, dict]] = []
    for msg in history:
        role = msg.get("role")
        if role == "assistant":
            for call in msg.get("tool_calls") or []:
                if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                    calls[call["id"]] = call
        content = msg.get("content")
        if role not in ("user", "tool") or not isinstance(content, list):
            continue
        label = "user-provided image"
        if role == "tool":
            call = calls.get(msg.get("tool_call_id") or "")
            label = _call_label(call) if call is not None else "tool result"
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image_url":
                found.append((label, dict(part)))
    return found[-limit:] if limit > 0 else []


# -- the new history -----------------------------------------------------------------------------


def _attachment_parts(
    files: list[tuple[str, str]],
    refs: list[str],
    images: list[tuple[str, dict]],
    plan_reminder: str | None,
) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if files:
        blocks = [_FILES_HEAD]
        for path, text in files:
            fence = _fence(text)
            body = text if text.endswith("\n") or not text else text + "\n"
            blocks.append(f"## {path}\n\n{fence}\n{body}{fence}")
        parts.append({"type": "text", "text": "\n\n".join(blocks)})
    if refs:
        parts.append(
            {"type": "text", "text": _REFS_HEAD + "\n" + "\n".join(f"- {p}" for p in refs)}
        )
    if images:
        parts.append({"type": "text", "text": _IMAGES_HEAD})
        for n, (label, part) in enumerate(images, start=1):
            parts.append({"type": "text", "text": f"Image {n}: {label}"})
            parts.append(part)
    if plan_reminder and plan_reminder.strip():
        parts.append({"type": "text", "text": plan_reminder.strip()})
    return parts


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p.get("type") == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def build_post_compact_history(
    summary_text: str,
    *,
    original_history: Sequence[Mapping[str, Any]],
    workspace_root: Path,
    max_files: int = 5,
    per_file_tokens: int = 5_000,
    token_budget: int = 50_000,
    max_images: int = 3,
    plan_reminder: str | None = None,
    pending_tool_call: Mapping[str, Any] | None = None,
    current_input: Sequence[Mapping[str, Any]] = (),
    file_tools: FileToolSet | None = None,
    touched_paths: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], AttachmentInfo]:
    """The compacted history for ``summary_text`` and what was attached (see module docs).

    Files come from the newest file tool calls in ``original_history`` (tools classified by
    ``file_tools``, Qwen Code's names when None) and from ``touched_paths``, and are read from
    disk now; a path must resolve inside ``workspace_root``; missing and binary files are
    skipped; files over ``per_file_tokens`` or over the remaining ``token_budget`` are listed by
    path. ``pending_tool_call`` (an assistant message whose calls are not answered in the
    summarised part) and ``current_input`` (this turn's tool results and/or user message) are
    kept verbatim at the end, so the result keeps protocol C1/C2.
    """
    summary = strip_analysis(summary_text) or SUMMARY_UNAVAILABLE
    files, refs = _collect_files(
        original_history, Path(workspace_root), max_files, per_file_tokens, token_budget,
        file_tools, touched_paths,
    )
    images = _collect_images(original_history, max_images)
    parts = _attachment_parts(files, refs, images, plan_reminder)
    head: dict[str, Any] = {"role": "user", "content": f"{summary}\n\n{RESUME_TRAILER}"}
    ack: dict[str, Any] = {"role": "assistant", "content": ACK_TEXT}
    history: list[dict[str, Any]] = [head, ack]
    current = [dict(m) for m in current_input]
    calls = list(pending_tool_call.get("tool_calls") or []) if pending_tool_call else []
    if calls:
        assert pending_tool_call is not None
        pending = dict(pending_tool_call)
        pending["tool_calls"] = [dict(c) for c in calls]
        own = pending.get("content")
        if own is None:
            pending["content"] = ""
        if parts:  # summary, ack, attachments, the pending call, its results
            history.append({"role": "user", "content": _collapse(parts)})
            history.append(pending)
        else:  # no user message to put between ack and call: the ack carries the call
            if isinstance(own, str) and own.strip():
                ack["content"] = f"{ACK_TEXT}\n\n{own.strip()}"
            ack["tool_calls"] = pending["tool_calls"]
            for key in REASONING_KEYS:
                if key in pending:
                    ack[key] = pending[key]
        history.extend(current)
    elif current and current[0].get("role") == "user":
        # the user's words of this turn: the attachments ride in front of them
        if parts:
            current[0]["content"] = _merge_parts(parts, current[0].get("content"))
        history.extend(current)
    else:
        # nothing current (a manual compression between turns): the summary message carries
        # the attachments, so the history still ends with the ack and the next turn alternates
        if parts:
            head["content"] = _merge_parts([{"type": "text", "text": head["content"]}, *parts],
                                           None)
        history.extend(current)
    info = AttachmentInfo(
        files_embedded=[p for p, _ in files], files_referenced=refs, images=len(images)
    )
    return history, info


def _merge_parts(parts: list[dict[str, Any]], content: Any) -> str | list[dict[str, Any]]:
    """``parts`` followed by ``content`` (a string or parts), as one message content."""
    tail: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            tail = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        tail = list(content)
    return _collapse([*parts, *tail])


def split_current_input(
    history: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None, list[Mapping[str, Any]]]:
    """``(summarised part, pending tool-call message, current input)`` of a history.

    The current input is the trailing user message and/or the tool results right before it
    (or at the very end); the pending message is the assistant message those results answer,
    or a trailing assistant message whose calls have no results yet. Neither is summarised
    away: they are kept verbatim after the summary.
    """
    n = len(history)
    i = n
    if i and history[i - 1].get("role") == "user":
        i -= 1
    j = i
    while j and history[j - 1].get("role") == "tool":
        j -= 1
    pending: Mapping[str, Any] | None = None
    if j and history[j - 1].get("role") == "assistant" and history[j - 1].get("tool_calls"):
        pending = history[j - 1]
        return list(history[: j - 1]), pending, list(history[j:])
    if j < i:  # tool results with no call before them (cannot be kept valid): summarise them
        return list(history[:i]), None, list(history[i:])
    return list(history[:i]), None, list(history[i:])


# -- orchestration -------------------------------------------------------------------------------


def pending_tool_call(history: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The trailing assistant message if it carries tool calls (whose results are not in yet)."""
    if history and history[-1].get("role") == "assistant" and history[-1].get("tool_calls"):
        return history[-1]
    return None


PreHook = Callable[[], Awaitable[HookRun]]
PostHook = Callable[[str], Awaitable[HookRun]]


async def _run_hook(
    name: str, fn: Callable[[], Awaitable[HookRun]], events: list[HookRan]
) -> HookRun | None:
    try:
        run = await fn()
    except Exception as exc:  # a hook runner bug must not block compaction
        log.warning("compaction_hook_error", hook=name, error_type=type(exc).__name__)
        events.append(HookRan(hook=name, status="error", error=type(exc).__name__))
        return None
    events.extend(run.events)
    return run


async def compress(
    model_client: ModelClient,
    history: list[dict[str, Any]],
    *,
    trigger: Trigger,
    focus: str | None = None,
    workspace_root: Path,
    tokens_before: int,
    estimate_history: Callable[[list[dict[str, Any]]], int],
    plan_reminder: str | None = None,
    pre_hook: PreHook | None = None,
    post_hook: PostHook | None = None,
    fast: bool = True,
    timeout_s: float | None = None,
    file_tools: FileToolSet | None = None,
    touched_paths: Sequence[str] = (),
    max_files: int = 5,
    max_images: int = 3,
) -> CompressionResult:
    """One full compression of ``history`` (never raises for model or hook failures).

    ``max_files`` / ``max_images`` (``model.chatCompression.maxRecentFilesToRetain`` /
    ``maxRecentImagesToRetain``) bound the restored attachments; 0 restores none.

    ``noop`` when there is nothing before the current input to summarise. The pending tool-call
    message and the current input (see :func:`split_current_input`) are kept after the summary
    for both triggers. ``pre_hook()`` may add instructions;
    ``post_hook(summary)`` gets the analysis-stripped summary after a success. On a failed
    summary, or when ``estimate_history(new) >= tokens_before`` (``failed_inflated``), the
    original ``history`` object is returned unchanged with ``tokens_after == tokens_before``.
    """
    events: list[HookRan] = []

    def unchanged(status: str, error: str | None = None, summary: str = "") -> CompressionResult:
        return CompressionResult(
            status=status, history=history, tokens_before=tokens_before,
            tokens_after=tokens_before, summary=summary, hook_events=events, error=error,
        )  # fmt: skip

    past, pending, current = split_current_input(history)
    source = [*past, pending] if pending is not None else past
    if len(source) < 2 and not (len(source) == 1 and current):
        return unchanged("noop", "history_too_short")
    extra: str | None = None
    if pre_hook is not None:
        run = await _run_hook("PreCompact", pre_hook, events)
        extra = run.additional_instructions if run is not None else None
    outcome = await summarize(
        model_client, source, trigger=trigger, focus=focus, hook_instructions=extra,
        fast=fast, timeout_s=timeout_s,
    )  # fmt: skip
    if not outcome.ok:
        return unchanged(outcome.status, outcome.error, outcome.summary_text)
    new_history, info = build_post_compact_history(
        outcome.summary_text,
        original_history=history,
        workspace_root=workspace_root,
        plan_reminder=plan_reminder,
        pending_tool_call=pending,
        current_input=current,
        file_tools=file_tools,
        touched_paths=touched_paths,
        max_files=max_files,
        max_images=max_images,
    )
    tokens_after = estimate_history(new_history)
    if tokens_after >= tokens_before:
        log.info("compaction_inflated", before=tokens_before, after=tokens_after)
        return unchanged("failed_inflated", "summary_not_smaller", outcome.summary_text)
    if post_hook is not None:
        summary = outcome.summary_text
        await _run_hook("PostCompact", lambda: post_hook(summary), events)
    return CompressionResult(
        status="compressed",
        history=new_history,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        summary=outcome.summary_text,
        info=info,
        hook_events=events,
    )
