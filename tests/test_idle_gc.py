"""Full garbage collections wait for a moment without requests (qwenctxd.idle_gc): never while
requests come, as soon as the process is idle and CPython's own pace asks for one, and after
the longest deferral even when it is never idle."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest

from qwenctxd import idle_gc
from qwenctxd.idle_gc import IdleCollector
from qwenctxd.testing.wait import until_async


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def younger_collections(n: int) -> None:
    gc.collect(2)  # counts from zero
    for _ in range(n):
        gc.collect(1)  # each one counts towards the next full collection


def test_full_collections_wait_for_idle_and_for_cpythons_pace(
        thresholds: tuple[int, int, int]) -> None:
    clock, requests, in_flight = Clock(), [0], [0]
    c = IdleCollector(lambda: requests[0], lambda: in_flight[0], idle_s=0.5, max_defer_s=300,
                      clock=clock)
    c.install()
    assert gc.get_threshold() == (thresholds[0], thresholds[1], idle_gc.OFF)
    every = thresholds[2]

    younger_collections(every)
    for _ in range(20):  # requests keep coming: no full collection
        requests[0] += 1
        clock.now += 0.1
        assert not c.tick()
    in_flight[0] = 1  # one long request: not idle either
    clock.now += 5
    assert not c.tick()
    in_flight[0] = 0
    clock.now += 0.2
    assert not c.tick()  # idle for 0.2 s only
    clock.now += 0.5
    assert c.tick() and c.collections == 1
    assert gc.get_count()[2] == 0

    younger_collections(every - 1)  # idle, but CPython would not collect yet
    clock.now += 10
    assert not c.tick()
    c.restore()
    assert gc.get_threshold() == thresholds


def test_a_process_that_is_never_idle_still_collects(thresholds: tuple[int, int, int]) -> None:
    clock, requests = Clock(), [0]
    c = IdleCollector(lambda: requests[0], lambda: 1, idle_s=0.5, max_defer_s=300, clock=clock)
    younger_collections(0)
    clock.now += 400
    assert not c.tick()  # nothing collected since the last full one: nothing to do
    younger_collections(1)
    assert c.tick() and c.collections == 1
    clock.now += 100
    younger_collections(thresholds[2] * 3)
    assert not c.tick()  # busy, and the last full collection was 100 s ago


@pytest.mark.anyio
async def test_run_installs_and_restores(thresholds: tuple[int, int, int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle_gc, "CHECK_S", 0.01)
    c = IdleCollector(lambda: 0, lambda: 0, idle_s=0.0)
    younger_collections(thresholds[2])
    async with anyio.create_task_group() as tg:
        tg.start_soon(c.run)
        await until_async(lambda: c.collections, timeout=10)
        assert gc.get_threshold()[2] == idle_gc.OFF
        tg.cancel_scope.cancel()
    assert gc.get_threshold() == thresholds
