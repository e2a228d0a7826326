"""Wire types of the ``debug.*`` methods (served only when QWENCTXD_DEBUG_METHODS=1)."""

from __future__ import annotations

from typing import Any

import msgspec

from qwenctxd.protocol.daemon import Params


class SleepTaskParams(Params):
    seconds: float = msgspec.field(default=1.0)
    kind: str = "debug"
    key: str | None = None
    #: end early (completed) once this path exists: a test decides when the job lands
    until_exists: str | None = None


class SleepTaskResult(msgspec.Struct, kw_only=True):
    task_id: int


class PublishParams(Params):
    topic: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
