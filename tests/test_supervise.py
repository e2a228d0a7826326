"""tasks.supervise: a crashing life-long loop is logged, counted and restarted with back-off;
a cancellation ends it; a loop that returns is done."""

from __future__ import annotations

import anyio
import pytest

from qwenctxd.tasks.supervise import supervise


def test_a_crashing_loop_is_restarted_and_counted() -> None:
    runs: list[int] = []
    crashes: list[str] = []

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError("bug in a housekeeping loop")

    async def main() -> None:
        with anyio.fail_after(10):
            await supervise("flaky", flaky, on_crash=crashes.append,
                            first_delay_s=0.01, max_delay_s=0.04)

    anyio.run(main)
    assert runs == [0, 1, 2]  # two crashes, then a run that returned
    assert crashes == ["flaky", "flaky"]


def test_cancellation_passes_through() -> None:
    started = anyio.Event()

    async def forever() -> None:
        started.set()
        await anyio.sleep_forever()

    async def main() -> bool:
        with anyio.move_on_after(5) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(supervise, "forever", forever)
                await started.wait()
                tg.cancel_scope.cancel()
        return scope.cancelled_caught

    assert anyio.run(main) is False  # ended by its own group's cancel, not the 5 s bound


def test_base_exceptions_are_not_swallowed() -> None:
    async def exits() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        anyio.run(supervise, "exits", exits)
