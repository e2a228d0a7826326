"""QuietPeriods (tasks/quiet.py): a wait ends after a pause in the foreground, is bounded,
and a hurry (a drain) ends every wait at once."""

from __future__ import annotations

import time

import anyio
import pytest

from qwenctxd.tasks.quiet import QuietPeriods

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_wait_lasts_until_the_key_pauses_and_each_touch_extends_it() -> None:
    q = QuietPeriods()
    q.touch("k")
    started = time.monotonic()

    async def keep_busy() -> None:
        for _ in range(4):  # activity every 0.1 s for 0.4 s: no pause of 0.3 s until the end
            await anyio.sleep(0.1)  # sleep-ok: activity at a pace under the quiet period
            q.touch("k")

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_busy)
        waited = await q.wait("k", 0.3, 30)
    assert waited >= 0.6  # the last touch (~0.4 s) plus the quiet 0.3 s
    assert time.monotonic() - started < 10  # liveness
    assert await q.wait("other", 0.3, 30) < 0.1  # a key with no activity is quiet already
    assert await q.wait("k", 0, 30) == pytest.approx(0, abs=0.05)  # 0: at once


async def test_a_key_that_never_pauses_waits_at_most_max_wait() -> None:
    q = QuietPeriods()

    async def busy(scope: anyio.CancelScope) -> None:
        while not scope.cancel_called:
            q.touch("k")
            await anyio.sleep(0.02)  # sleep-ok: a key that never pauses

    q.touch("k")
    async with anyio.create_task_group() as tg:
        tg.start_soon(busy, tg.cancel_scope)
        waited = await q.wait("k", 0.5, 0.4)
        tg.cancel_scope.cancel()
    assert 0.35 <= waited < 5


async def test_hurried_ends_waits_begun_and_beginning() -> None:
    q = QuietPeriods()
    q.touch("k")
    waits: list[float] = []

    async def waiter() -> None:
        waits.append(await q.wait("k", 60, 60))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.1)  # sleep-ok: the waiter is waiting
        with q.hurried():
            await anyio.sleep(0.05)  # sleep-ok: the hurried waiter returns
            assert len(waits) == 1 and waits[0] < 5
            assert await q.wait("k", 60, 60) < 0.05  # begun while hurried
    with anyio.move_on_after(0.2) as scope:  # after the hurry: waits wait again
        await q.wait("k", 60, 60)
    assert scope.cancelled_caught
