"""Micro-compaction: rule-based clearing of old tool results and media, no model call (§7.4).

Three kinds of item are ranked separately, oldest to newest, and all but the newest ``keep``
(floor 1) of *each* kind are replaced by a placeholder (``keep=1`` keeps one tool result AND one
top-level image AND one nested image, not one item in total):

``tool``
    A tool message of a compactable tool (:data:`COMPACTABLE_TOOLS`). Its whole content,
    nested media included, becomes :data:`CLEARED_TOOL_RESULT`. The tool name is the tool
    message's ``name``, else the ``function.name`` of the assistant tool call with that id.
``media``
    A media part (see :data:`~qwenctxd.tokens.MEDIA_PART_TYPES`) at the top level of
    a user message's content. It becomes the text part ``[Old inline media cleared: <mime>]``.
``nested_media``
    A media part inside the content list of a tool message of a *non-compactable* tool. The part
    gets the same text placeholder; the tool's text output is kept.

Error results are never cleared and take no ``keep`` slot. A tool message is an error when it
carries our ``"is_error"`` extension field (the session layer strips it before sending the
history to a model) — a non-null value decides by its truthiness; without the field (or when it
is null), when its text (string content or first text part), leading whitespace ignored, starts
with ``"Error:"``.

Triggers: ``force`` (``session.compress mode=fast``) and ``idle`` (see
:func:`should_micro_compact`) clear all three kinds; ``size`` (tool-result characters over a
threshold) clears only ``tool`` items, media is left alone (seed §7.4).

An item is only replaced when that saves tokens (a 3-character result is not swapped for a
9-token placeholder), so ``tokens_saved`` — the drop in
:func:`~qwenctxd.tokens.history_tokens` — is positive whenever anything changed.
Results already holding the placeholder are skipped. For every cleared ``read_file``, ``edit``
or ``write_file`` result
the ``file_path`` (or ``path``) argument of its call is reported in ``evicted_read_paths`` so
the caller can disarm that file's read cache; a cleared read whose call cannot be found or whose
arguments do not parse counts in ``unresolved_evicted_reads`` (the caller must then wipe the
whole cache).

Pure: inputs are never mutated. Changed messages are shallow copies (with new content lists);
unchanged messages are shared with the input list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from qwenctxd.tokens import (
    DEFAULT_IMAGE_TOKENS,
    REASONING_KEYS,
    content_tokens,
    estimate_tokens,
    is_media_part,
    reasoning_tokens,
)

__all__ = [
    "CLEARED_MEDIA_PREFIX",
    "CLEARED_TOOL_RESULT",
    "COMPACTABLE_TOOLS",
    "KINDS",
    "READ_TOOLS",
    "MicroResult",
    "Trigger",
    "is_error_result",
    "media_mime",
    "media_placeholder",
    "micro_compact",
    "micro_compact_if_due",
    "should_micro_compact",
]

Message = dict[str, Any]
Trigger = Literal["force", "idle", "size"]
Kind = Literal["tool", "media", "nested_media"]
KINDS: tuple[Kind, ...] = ("tool", "media", "nested_media")

CLEARED_TOOL_RESULT = "[Old tool result content cleared]"
CLEARED_MEDIA_PREFIX = "[Old inline media cleared:"
COMPACTABLE_TOOLS = frozenset(
    {"read_file", "run_shell_command", "grep_search", "glob", "web_fetch", "edit", "write_file"}
)
READ_TOOLS = frozenset({"read_file", "edit", "write_file"})
"""Tools whose cleared result is reported in ``evicted_read_paths``: a read, and (as upstream,
issue #4239) an edit or a write, whose result also stood for the file's content in context."""

_TOOL_PLACEHOLDER_TOKENS = estimate_tokens(CLEARED_TOOL_RESULT)
_MIME_FALLBACK = {
    "image_url": "image",
    "video_url": "video",
    "input_audio": "audio",
    "file": "application/octet-stream",
}


@dataclass(frozen=True, slots=True)
class MicroResult:
    """Outcome of :func:`micro_compact`; a no-op has the input list and zero counts."""

    messages: list[Message]
    cleared: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    tokens_saved: int = 0
    evicted_read_paths: list[str] = field(default_factory=list)
    unresolved_evicted_reads: int = 0
    reasoning_stripped: int = 0
    trigger: Trigger | None = None  # what the result was compacted for (None: a no-op)

    @property
    def changed(self) -> bool:
        """True when the history was rewritten (``tokens_saved > 0``)."""
        return self.tokens_saved > 0


def _sanitize_mime(mime: str) -> str:
    mime = mime.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    mime = mime.replace("[", "").replace("]", "").strip()
    return mime[:128]


def _data_url_mime(url: Any) -> str | None:
    if isinstance(url, str) and url.startswith("data:"):
        head = url[5:].split(",", 1)[0].split(";", 1)[0]
        return head or None
    return None


def media_mime(part: dict[str, Any]) -> str:
    """The sanitized MIME type of a media part (from its data URL, else a generic kind)."""
    kind = part.get("type")
    inner = part.get(kind) if isinstance(kind, str) else None
    mime: str | None = None
    if isinstance(inner, dict):
        if kind == "input_audio" and isinstance(inner.get("format"), str):
            mime = f"audio/{inner['format']}"
        else:
            mime = _data_url_mime(inner.get("url")) or _data_url_mime(inner.get("file_data"))
    elif isinstance(inner, str):
        mime = _data_url_mime(inner)
    mime = _sanitize_mime(mime) if mime else ""
    return mime or _MIME_FALLBACK.get(str(kind), "application/octet-stream")


def media_placeholder(part: dict[str, Any]) -> dict[str, str]:
    """The text part that replaces a cleared media part: ``[Old inline media cleared: <mime>]``."""
    return {"type": "text", "text": f"{CLEARED_MEDIA_PREFIX} {media_mime(part)}]"}


def _first_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                return text if isinstance(text, str) else ""
    return ""


def is_error_result(msg: Message) -> bool:
    """Whether a tool message is an error result (never cleared).

    The explicit ``is_error`` extension field wins when present (the session layer strips it
    before sending); otherwise the text, leading whitespace ignored, starts with ``"Error:"``.
    """
    if "is_error" in msg and msg["is_error"] is not None:
        return bool(msg["is_error"])
    return _first_text(msg.get("content")).lstrip().startswith("Error:")


def _is_cleared(content: Any) -> bool:
    if content == CLEARED_TOOL_RESULT:
        return True
    return (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], dict)
        and content[0].get("text") == CLEARED_TOOL_RESULT
    )


def should_micro_compact(
    *,
    now: float,
    last_model_reply_at: float | None,
    idle_minutes: float,
    tool_chars: int,
    size_threshold: int,
) -> Trigger | None:
    """Which automatic micro-compaction trigger fires, if any (``force`` is the caller's own).

    ``idle``: at least ``idle_minutes`` since the last model reply (times in seconds, e.g.
    ``time.time()``; no reply yet or ``idle_minutes < 0`` disables it). ``size``: the tool results
    hold at least ``size_threshold`` characters (:func:`~qwenctxd.tokens.tool_result_chars`; ``< 0`` disables).
    Idle wins when both fire, since it clears more.
    """
    if idle_minutes >= 0 and last_model_reply_at is not None:
        if now - last_model_reply_at >= idle_minutes * 60.0:
            return "idle"
    if size_threshold >= 0 and tool_chars >= size_threshold:
        return "size"
    return None


def _read_path(call: dict[str, Any] | None) -> str | None:
    """The ``file_path`` (or ``path``) argument of a tool call, or None when unrecoverable."""
    if call is None:
        return None
    fn = call.get("function")
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    for key in ("file_path", "path"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def micro_compact(
    messages: list[Message],
    *,
    keep: int = 5,
    trigger: Trigger,
    strip_reasoning: bool = False,
    image_tokens: int = DEFAULT_IMAGE_TOKENS,
) -> MicroResult:
    """Clear all but the newest ``keep`` items of each kind (see the module docstring).

    ``strip_reasoning`` (compress-fast) also drops ``reasoning_content`` / ``reasoning`` /
    ``thinking`` from every assistant message except the last one. Returns the input list itself,
    with zero counts, when nothing would be saved.
    """
    keep = max(1, int(keep))
    clear_media = trigger != "size"

    # --- scan: rank the candidates of each kind, oldest first ---
    calls: dict[str, dict[str, Any]] = {}
    tool_refs: list[tuple[int, str, dict[str, Any] | None]] = []  # (index, name, call)
    media_refs: list[tuple[int, int]] = []  # (message index, part index)
    nested_refs: list[tuple[int, int]] = []
    found = dict.fromkeys(KINDS, 0)
    last_assistant = -1
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            call = calls.get(call_id) if isinstance(call_id, str) else None
            name = msg.get("name")
            if not isinstance(name, str) or not name:
                fn = call.get("function") if call is not None else None
                name = fn.get("name") if isinstance(fn, dict) else None
            content = msg.get("content")
            if name in COMPACTABLE_TOOLS:
                if _is_cleared(content):
                    continue
                found["tool"] += 1
                if not is_error_result(msg):
                    tool_refs.append((i, name, call))
            elif isinstance(content, list):
                error = is_error_result(msg)
                for j, part in enumerate(content):
                    if is_media_part(part):
                        found["nested_media"] += 1
                        if not error:
                            nested_refs.append((i, j))
        elif role == "user":
            content = msg.get("content")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    if is_media_part(part):
                        found["media"] += 1
                        media_refs.append((i, j))
        elif role == "assistant":
            last_assistant = i
            tool_calls = msg.get("tool_calls")
            if isinstance(tool_calls, list):
                for call in tool_calls:
                    if isinstance(call, dict) and isinstance(call.get("id"), str):
                        calls[call["id"]] = call

    # --- plan: what to replace, and what it saves ---
    cleared = dict.fromkeys(KINDS, 0)
    saved = 0
    replaced_tools: list[tuple[int, str, dict[str, Any] | None]] = []
    for ref in tool_refs[:-keep]:
        gain = content_tokens(messages[ref[0]].get("content"), image_tokens=image_tokens)
        gain -= _TOOL_PLACEHOLDER_TOKENS
        if gain <= 0:
            continue
        saved += gain
        cleared["tool"] += 1
        replaced_tools.append(ref)

    parts_plan: dict[int, dict[int, dict[str, str]]] = {}
    if clear_media:
        for kind, refs in (("media", media_refs), ("nested_media", nested_refs)):
            for i, j in refs[:-keep]:
                part = messages[i]["content"][j]
                placeholder = media_placeholder(part)
                gain = image_tokens - estimate_tokens(placeholder["text"])
                if gain <= 0:
                    continue
                saved += gain
                cleared[kind] += 1
                parts_plan.setdefault(i, {})[j] = placeholder

    stripped: list[int] = []
    if strip_reasoning:
        for i, msg in enumerate(messages):
            if i != last_assistant and msg.get("role") == "assistant":
                present = [k for k in REASONING_KEYS if k in msg]
                if present:
                    saved += sum(reasoning_tokens(msg[k]) for k in present)
                    stripped.append(i)

    kept = {kind: found[kind] - cleared[kind] for kind in KINDS}
    if saved <= 0:
        return MicroResult(messages=messages, kept=kept)

    # --- apply on copies ---
    out = list(messages)
    evicted: dict[str, None] = {}
    unresolved = 0
    for i, name, call in replaced_tools:
        new = dict(messages[i])
        new["content"] = CLEARED_TOOL_RESULT
        out[i] = new
        if name in READ_TOOLS:  # its file's content leaves the context with it
            path = _read_path(call)
            if path is None:
                unresolved += 1
            else:
                evicted[path] = None
    for i, plan in parts_plan.items():
        new = dict(messages[i])
        new["content"] = [plan.get(j, part) for j, part in enumerate(messages[i]["content"])]
        out[i] = new
    for i in stripped:
        new = dict(out[i])
        for key in REASONING_KEYS:
            new.pop(key, None)
        out[i] = new

    return MicroResult(
        messages=out,
        cleared=cleared,
        kept=kept,
        tokens_saved=saved,
        evicted_read_paths=list(evicted),
        unresolved_evicted_reads=unresolved,
        reasoning_stripped=len(stripped),
        trigger=trigger,
    )


def micro_compact_if_due(
    messages: list[Message],
    *,
    now: float,
    last_model_reply_at: float | None,
    idle_minutes: float,
    tool_chars: int,
    size_threshold: int,
    keep: int,
    image_tokens: int = DEFAULT_IMAGE_TOKENS,
) -> MicroResult | None:
    """The automatic micro-compaction of a turn in one call: which trigger fires
    (:func:`should_micro_compact`) and, when one does, :func:`micro_compact` for it. None when
    no trigger fires or clearing would save nothing; else the result, its ``trigger`` set."""
    trigger = should_micro_compact(now=now, last_model_reply_at=last_model_reply_at,
                                   idle_minutes=idle_minutes, tool_chars=tool_chars,
                                   size_threshold=size_threshold)
    if trigger is None:
        return None
    result = micro_compact(messages, keep=keep, trigger=trigger, image_tokens=image_tokens)
    return result if result.changed else None
