"""Wire types of the ``speculation.*`` methods."""

from __future__ import annotations

from typing import Any

import msgspec

from qwenctxd.protocol.daemon import Params


class StartParams(Params):
    session_id: str
    suggestion: str


class StartResult(msgspec.Struct, kw_only=True):
    speculation_id: str


class IdParams(Params):
    speculation_id: str


class AcceptResult(msgspec.Struct, kw_only=True):
    applied: list[str]
    complete: bool
    outcome: str | None = None
    conflicts: list[str] = msgspec.field(default_factory=list)
    messages: int = 0


class AbortResult(msgspec.Struct, kw_only=True):
    ok: bool


class StatusResult(msgspec.Struct, kw_only=True):
    status: dict[str, Any]
