"""Typed ``events`` entries of ``session.turn`` (``AssembledPrompt.events``) and
``session.compress`` (``CompressResult.events``).

One Struct per event, used on both sides. The daemon builds these (a ``list[Event]`` while a
turn runs) and :func:`to_wire` turns them into the objects sent: an object with a ``type``
member (docs/protocol.md "Events"), every member always sent (a null ``cause`` too), except
:class:`HookRan`, whose optional members are left out when unset. On the client side
:func:`parse` turns one into its Struct, :func:`parse_all` a list. A type this module does not
know yet (a newer daemon) comes back as the plain dict, so clients keep working; extra fields
are ignored. The result structs keep ``events`` as plain objects on the wire types for that
reason (an unknown tag must not fail the whole reply).
"""

from __future__ import annotations

from typing import Any

import msgspec


class Event(msgspec.Struct, kw_only=True, tag_field="type"):
    """Base of the typed events (``type`` is the tag)."""


class Compressed(Event, kw_only=True, tag="compressed"):
    status: str
    trigger: str
    reason: str | None = None
    tokens_before: int
    tokens_after: int


class CompressionFailed(Event, kw_only=True, tag="compression_failed"):
    status: str
    trigger: str
    reason: str | None = None
    cause: str | None = None


class CompressionSkipped(Event, kw_only=True, tag="compression_skipped"):
    reason: str
    level: str | None = None
    tokens: int | None = None


class CompressionFallback(Event, kw_only=True, tag="compression_fallback"):
    fallback: str
    status: str
    cause: str | None = None
    tokens_saved: int


class MicroCompacted(Event, kw_only=True, tag="micro_compacted"):
    trigger: str
    cleared: dict[str, int]
    kept: dict[str, int]
    tokens_saved: int
    evicted_read_paths: list[str] = msgspec.field(default_factory=list)
    unresolved_evicted_reads: int = 0


class HardFallback(Event, kw_only=True, tag="hard_fallback"):
    tokens_saved: int


class ToolCallsAbandoned(Event, kw_only=True, tag="tool_calls_abandoned"):
    tool_call_ids: list[str]


class UserTurnMerged(Event, kw_only=True, tag="user_turn_merged"):
    pass


class DuplicateToolResult(Event, kw_only=True, tag="duplicate_tool_result"):
    tool_call_id: str
    index: int


class UsageWarning(Event, kw_only=True, tag="usage"):
    level: str
    prompt_tokens: int


class HookRan(Event, kw_only=True, tag="hook", omit_defaults=True):
    """A PreCompact / PostCompact command's outcome; a hook runner failure has only
    ``error``."""

    hook: str
    command: str | None = None
    status: str
    elapsed_ms: int | None = None
    exit_code: int | None = None
    timeout_s: float | None = None
    stderr: str | None = None
    error: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (Compressed, CompressionFailed, CompressionSkipped, CompressionFallback,
                MicroCompacted, HardFallback, ToolCallsAbandoned, UserTurnMerged,
                DuplicateToolResult, UsageWarning, HookRan)
}


def to_wire(events: list[Event]) -> list[dict[str, Any]]:
    """The objects sent for ``events`` (the ``events`` member of a turn or compress reply)."""
    return msgspec.to_builtins(events)  # type: ignore[no-any-return]


def parse(event: dict[str, Any]) -> Event | dict[str, Any]:
    """The Struct of ``event``, or the dict itself when its ``type`` is unknown here;
    ``msgspec.ValidationError`` when a known type lacks a field."""
    cls = EVENT_TYPES.get(event.get("type"))  # type: ignore[arg-type]
    return event if cls is None else msgspec.convert(event, cls)


def parse_all(events: list[dict[str, Any]]) -> list[Event | dict[str, Any]]:
    return [parse(e) for e in events]
