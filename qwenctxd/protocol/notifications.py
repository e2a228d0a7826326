"""Typed payloads of the server → client notifications (``daemon.subscribe`` topics).

``NOTIFICATIONS`` maps each topic to its params struct; :func:`payload` turns a received
notification frame (``{"jsonrpc", "method", "params"}``) into that struct. Fields a producer
adds later are ignored by the structs (forward compatible), missing ones fail loudly.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class SessionUsage(msgspec.Struct, kw_only=True):
    """``session/usage``: a turn's prompt reached ``warn`` or above."""

    session_id: str
    prompt_tokens: int
    window_tokens: int
    level: Literal["ok", "warn", "auto", "hard"]


class SessionCompressed(msgspec.Struct, kw_only=True):
    """``session/compressed``: the session's history was summarised."""

    session_id: str
    type: str = "compressed"
    status: str
    trigger: str
    reason: str | None = None
    tokens_before: int
    tokens_after: int


class SkillsChanged(msgspec.Struct, kw_only=True):
    """``skills/changed``: a project's skill set was re-read (``root`` None: user level)."""

    root: str | None
    generation: int
    added: list[str] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)


class MemoryChanged(msgspec.Struct, kw_only=True):
    """``memory/changed``: a project's memory changed (re-scan, ``memory.save`` or forget)."""

    project: str
    docs: int | None = None
    saved: str | None = None
    scope: str | None = None
    removed: int | None = None


class BackgroundProgress(msgspec.Struct, kw_only=True):
    """``background/progress``: a background job started or finished."""

    id: int
    kind: str
    project: str | None
    state: Literal["started", "completed", "failed", "cancelled", "replaced"]
    pending: int


class ConfigChanged(msgspec.Struct, kw_only=True):
    """``config/changed``: the settings were reloaded."""

    generation: int


Notification = (SessionUsage | SessionCompressed | SkillsChanged | MemoryChanged
                | BackgroundProgress | ConfigChanged)

NOTIFICATIONS: dict[str, type[Any]] = {
    "session/usage": SessionUsage,
    "session/compressed": SessionCompressed,
    "skills/changed": SkillsChanged,
    "memory/changed": MemoryChanged,
    "background/progress": BackgroundProgress,
    "config/changed": ConfigChanged,
}


def payload(note: dict[str, Any]) -> Any:
    """The typed params of a received notification; KeyError for an unknown topic,
    ``msgspec.ValidationError`` for a payload that does not match its struct."""
    return msgspec.convert(note.get("params") or {}, NOTIFICATIONS[note["method"]])
