"""The one token estimator — text, content parts, messages and histories.

Used everywhere a count is needed before the API reports one. Text is characters / 4 (Qwen
Code's ratio), CJK characters one token each (a Chinese or Japanese character is roughly a token
in Qwen's tokenizer, not a quarter of one). In chat messages, text (string content, text parts,
reasoning fields, tool-call names and arguments) goes through :func:`estimate_tokens`; every
media part (``image_url``, ``video_url``, ``input_audio``, ``file``) costs a flat
``image_tokens`` regardless of its base64 size (a 1 MB PNG is ~1 300 visual tokens on Qwen-VL,
not 350 000); each message adds a fixed overhead for the role and separators. API-reported
prompt counts, when a client sends them, are authoritative; this only estimates deltas and fills
gaps. :func:`tool_result_chars` is the other size a history is measured by: the text
characters of its tool results (the size trigger of micro-compaction). :func:`system_tokens`
sizes a system prompt plus its tool declarations, cached per (text, tools list). Pure
functions, no I/O; a leaf module (it imports nothing of the daemon).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "MEDIA_PART_TYPES",
    "MESSAGE_OVERHEAD",
    "CHARS_PER_TOKEN",
    "DEFAULT_IMAGE_TOKENS",
    "REASONING_KEYS",
    "content_tokens",
    "estimate_tokens",
    "history_tokens",
    "is_media_part",
    "message_tokens",
    "reasoning_tokens",
    "system_tokens",
    "tool_calls_tokens",
    "tool_result_chars",
]

CHARS_PER_TOKEN = 4
DEFAULT_IMAGE_TOKENS = 1600
_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff00-\uffef\U00020000-\U0002fa1f]"
)


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text``: ceil(other chars / 4) + one per CJK character."""
    if not text:
        return 0
    if text.isascii():
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / CHARS_PER_TOKEN)


MESSAGE_OVERHEAD = 4
"""Tokens added per message for the role marker and separators of the chat template."""

MEDIA_PART_TYPES = frozenset({"image_url", "video_url", "input_audio", "file"})
"""Content-part ``type`` values counted as media (a flat estimate each)."""

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
"""Assistant-message keys that carry model reasoning; counted when they hold a string."""


def is_media_part(part: Any) -> bool:
    """True when ``part`` is a content part of a media type (see :data:`MEDIA_PART_TYPES`)."""
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return isinstance(kind, str) and kind in MEDIA_PART_TYPES


def _part_tokens(part: Any, image_tokens: int) -> int:
    if isinstance(part, dict):
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            return estimate_tokens(text) if isinstance(text, str) else 0
        if isinstance(kind, str) and kind in MEDIA_PART_TYPES:
            return image_tokens
    if isinstance(part, str):
        return estimate_tokens(part)
    # Unknown part shapes are sent as JSON, so count them that way.
    return estimate_tokens(json.dumps(part, ensure_ascii=False, default=str))


def content_tokens(content: Any, *, image_tokens: int = DEFAULT_IMAGE_TOKENS) -> int:
    """Estimated tokens of a message ``content``: a string, ``None`` or a list of parts."""
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_tokens(content)
    if isinstance(content, list):
        return sum(_part_tokens(p, image_tokens) for p in content)
    return _part_tokens(content, image_tokens)


def tool_calls_tokens(tool_calls: Any) -> int:
    """Estimated tokens of an assistant ``tool_calls`` list: each call's name + arguments."""
    if not isinstance(tool_calls, list):
        return 0
    total = 0
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            continue
        name = fn.get("name")
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = "" if args is None else json.dumps(args, ensure_ascii=False, default=str)
        total += estimate_tokens((name if isinstance(name, str) else "") + args)
    return total


def reasoning_tokens(value: Any) -> int:
    """Estimated tokens of one reasoning field's value (a string, or a structure sent as JSON)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return estimate_tokens(value)
    return estimate_tokens(json.dumps(value, ensure_ascii=False, default=str))


def message_tokens(msg: Mapping[str, Any], *, image_tokens: int = DEFAULT_IMAGE_TOKENS) -> int:
    """Estimated prompt tokens of one chat message.

    ``content`` text via ``estimate_tokens``; each media part ``image_tokens``; each tool call the
    estimate of ``name + arguments``; ``reasoning_content`` / ``reasoning`` / ``thinking``
    fields via :func:`reasoning_tokens` (they are part of the payload when a client sends them
    back); plus
    :data:`MESSAGE_OVERHEAD`.
    """
    total = MESSAGE_OVERHEAD + content_tokens(msg.get("content"), image_tokens=image_tokens)
    calls = msg.get("tool_calls")
    if calls:
        total += tool_calls_tokens(calls)
    for key in REASONING_KEYS:
        if key in msg:
            total += reasoning_tokens(msg[key])
    return total


def history_tokens(
    messages: Iterable[Mapping[str, Any]], *, image_tokens: int = DEFAULT_IMAGE_TOKENS
) -> int:
    """Sum of :func:`message_tokens` over ``messages``."""
    return sum(message_tokens(m, image_tokens=image_tokens) for m in messages)


def tool_result_chars(messages: Sequence[Mapping[str, Any]]) -> int:
    """Total text characters in tool messages (media parts not counted): the size trigger's input."""
    total = 0
    for msg in messages:
        if msg.get("role") != "tool":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"])
    return total


_SYSTEM_TOKENS: dict[tuple[str, int], tuple[list[dict[str, Any]], int]] = {}


@functools.lru_cache(maxsize=64)
def _text_tokens(text: str) -> int:
    """:func:`estimate_tokens` of a system prompt or a tools declaration: the same few texts
    come back with every session (a regex over ~15 000 characters each time otherwise)."""
    return estimate_tokens(text)


def system_tokens(system: str, tools: list[dict[str, Any]]) -> int:
    """The estimate for a system prompt plus tool declarations; cached per (text, tools list),
    since every turn and reply of a session asks for the same one."""
    key = (system, id(tools))
    hit = _SYSTEM_TOKENS.get(key)
    if hit is not None and hit[0] is tools:
        return hit[1]
    import msgspec

    # every new session brings its own tools list: the texts' estimates are cached by value
    n = _text_tokens(system) + (_text_tokens(msgspec.json.encode(tools).decode())
                                if tools else 0)
    if len(_SYSTEM_TOKENS) > 256:
        _SYSTEM_TOKENS.clear()
    _SYSTEM_TOKENS[key] = (tools, n)
    return n
