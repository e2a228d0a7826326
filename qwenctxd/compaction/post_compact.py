"""The history after a full compression, and the orchestration of one compression.

:func:`build_post_compact_history` turns a summary into the new head of the conversation::

    user       summary + RESUME_TRAILER
    assistant  ACK_TEXT                       (+ pending tool calls when nothing is attached)
    user       one merged attachment message  (only when there is something to attach):
               recently accessed files re-read from disk now, the newest images, plan reminder
    assistant  the pending tool call          (auto compaction with attachments only)

so roles always alternate and the only tool call without a result is the trailing pending one.
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
]

log = structlog.get_logger(__name__)

FILE_TOOLS: Final = frozenset({"read_file", "write_file", "edit", "replace"})
_PATH_KEYS: Final = ("file_path", "path", "absolute_path")
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
    hook_events: list[dict[str, Any]] = msgspec.field(default_factory=list)
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


def _call_path(call: Mapping[str, Any]) -> str | None:
    fn = call.get("function")
    if not isinstance(fn, Mapping) or fn.get("name") not in FILE_TOOLS:
        return None
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, Mapping):
        return None
    for key in _PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def recent_file_paths(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """Paths named by file tool calls (read/write/edit/replace), newest first, deduplicated."""
    seen: list[str] = []
    for msg in reversed(history):
        if msg.get("role") != "assistant":
            continue
        for call in reversed(msg.get("tool_calls") or []):
            path = _call_path(call) if isinstance(call, Mapping) else None
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
    for raw in recent_file_paths(history):
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
) -> tuple[list[dict[str, Any]], AttachmentInfo]:
    """The compacted history for ``summary_text`` and what was attached (see module docs).

    Files come from the newest file tool calls in ``original_history`` and are read from disk
    now; a path must resolve inside ``workspace_root``; missing and binary files are skipped;
    files over ``per_file_tokens`` or over the remaining ``token_budget`` are listed by path.
    """
    summary = strip_analysis(summary_text) or SUMMARY_UNAVAILABLE
    files, refs = _collect_files(
        original_history, Path(workspace_root), max_files, per_file_tokens, token_budget
    )
    images = _collect_images(original_history, max_images)
    parts = _attachment_parts(files, refs, images, plan_reminder)
    ack: dict[str, Any] = {"role": "assistant", "content": ACK_TEXT}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": f"{summary}\n\n{RESUME_TRAILER}"},
        ack,
    ]
    calls = list(pending_tool_call.get("tool_calls") or []) if pending_tool_call else []
    if parts:
        history.append({"role": "user", "content": _collapse(parts)})
        if calls:
            assert pending_tool_call is not None
            pending = {"role": "assistant", "content": pending_tool_call.get("content")}
            pending["tool_calls"] = [dict(c) for c in calls]
            history.append(pending)
    elif calls:
        assert pending_tool_call is not None
        own = pending_tool_call.get("content")
        if isinstance(own, str) and own.strip():
            ack["content"] = f"{ACK_TEXT}\n\n{own.strip()}"
        ack["tool_calls"] = [dict(c) for c in calls]
    info = AttachmentInfo(
        files_embedded=[p for p, _ in files], files_referenced=refs, images=len(images)
    )
    return history, info


# -- orchestration -------------------------------------------------------------------------------


def pending_tool_call(history: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The trailing assistant message if it carries tool calls (whose results are not in yet)."""
    if history and history[-1].get("role") == "assistant" and history[-1].get("tool_calls"):
        return history[-1]
    return None


PreHook = Callable[[], Awaitable[HookRun]]
PostHook = Callable[[str], Awaitable[HookRun]]


async def _run_hook(
    name: str, fn: Callable[[], Awaitable[HookRun]], events: list[dict[str, Any]]
) -> HookRun | None:
    try:
        run = await fn()
    except Exception as exc:  # a hook runner bug must not block compaction
        log.warning("compaction_hook_error", hook=name, error_type=type(exc).__name__)
        events.append(
            {"type": "hook", "hook": name, "status": "error", "error": type(exc).__name__}
        )
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
    timeout_s: float = 120,
    max_files: int = 5,
    max_images: int = 3,
) -> CompressionResult:
    """One full compression of ``history`` (never raises for model or hook failures).

    ``max_files`` / ``max_images`` (``model.chatCompression.maxRecentFilesToRetain`` /
    ``maxRecentImagesToRetain``) bound the restored attachments; 0 restores none.

    ``noop`` for fewer than 2 messages. A trailing assistant message with tool calls is dropped
    for ``manual`` and kept as pending for ``auto``. ``pre_hook()`` may add instructions;
    ``post_hook(summary)`` gets the analysis-stripped summary after a success. On a failed
    summary, or when ``estimate_history(new) >= tokens_before`` (``failed_inflated``), the
    original ``history`` object is returned unchanged with ``tokens_after == tokens_before``.
    """
    events: list[dict[str, Any]] = []

    def unchanged(status: str, error: str | None = None, summary: str = "") -> CompressionResult:
        return CompressionResult(
            status=status, history=history, tokens_before=tokens_before,
            tokens_after=tokens_before, summary=summary, hook_events=events, error=error,
        )  # fmt: skip

    if len(history) < 2:
        return unchanged("noop", "history_too_short")
    pending = pending_tool_call(history)
    source = history
    if pending is not None and trigger == "manual":
        source, pending = history[:-1], None
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
