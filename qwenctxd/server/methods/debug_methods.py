"""``debug.*`` methods, served only when QWENCTXD_DEBUG_METHODS=1 (tests and benchmarks).

They let a test put real work into the background-task registry (to watch ``status`` list it,
``drain`` wait for it and shutdown cancel it) without depending on a subsystem.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from qwenctxd.protocol import methods
from qwenctxd.protocol.debug import PublishParams, SleepTaskParams, SleepTaskResult
from qwenctxd.server.dispatch import handler

if TYPE_CHECKING:
    from qwenctxd.events import EventBus
    from qwenctxd.server.connection import Connection
    from qwenctxd.tasks import TaskRegistry


class DebugHandlers:
    def __init__(self, *, tasks: TaskRegistry, bus: EventBus) -> None:
        self.tasks = tasks
        self.bus = bus

    @handler(methods.DEBUG_SLEEP_TASK)
    async def sleep_task(self, ctx: Connection, p: SleepTaskParams) -> SleepTaskResult:
        async def job() -> None:
            if p.until_exists is None:
                await anyio.sleep(p.seconds)
                return
            release = anyio.Path(p.until_exists)
            with anyio.move_on_after(p.seconds):
                while not await release.exists():  # noqa: ASYNC110 - a path, not an event
                    await anyio.sleep(0.01)

        rec = self.tasks.submit(p.kind, job, description=f"sleep {p.seconds}s", key=p.key)
        return SleepTaskResult(task_id=rec.id)

    @handler(methods.DEBUG_PUBLISH)
    async def publish(self, ctx: Connection, p: PublishParams) -> dict[str, bool]:
        self.bus.publish(p.topic, p.params)
        return {"ok": True}
