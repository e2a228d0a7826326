"""``debug.*`` methods, served only when QWENCTXD_DEBUG_METHODS=1 (tests and benchmarks).

They let a test put real work into the background-task registry (to watch ``status`` list it,
``drain`` wait for it and shutdown cancel it) without depending on a subsystem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec

from qwenctxd.protocol.daemon import Params
from qwenctxd.server.dispatch import MethodSpec

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


class SleepTaskParams(Params):
    seconds: float = msgspec.field(default=1.0)
    kind: str = "debug"
    key: str | None = None


class SleepTaskResult(msgspec.Struct, kw_only=True):
    task_id: int


class PublishParams(Params):
    topic: str
    params: dict[str, object] = msgspec.field(default_factory=dict)


def register(daemon: Daemon) -> None:
    async def sleep_task(ctx: Connection, p: SleepTaskParams) -> SleepTaskResult:
        async def job() -> None:
            await anyio.sleep(p.seconds)

        rec = daemon.tasks.submit(p.kind, job, description=f"sleep {p.seconds}s", key=p.key)
        return SleepTaskResult(task_id=rec.id)

    async def publish(ctx: Connection, p: PublishParams) -> dict[str, bool]:
        daemon.bus.publish(p.topic, p.params)
        return {"ok": True}

    daemon.dispatcher.register(MethodSpec("debug.sleep_task", SleepTaskParams, sleep_task))
    daemon.dispatcher.register(MethodSpec("debug.publish", PublishParams, publish))
