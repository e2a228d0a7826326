"""QuietPeriods: background work that waits for a gap in the foreground.

A background job that follows a turn (extraction after every user-query turn) costs the event
loop and the CPU a few milliseconds of Python for every turn; run at once, it competes with the
next turn's assembly, which on a 2-core machine an agent's next request is already waiting
for (bench/proxy: the extraction agent was most of what a side-query model added to the proxy's
time to first byte). So such a job first waits until its key has seen no foreground activity
for ``quiet_s`` — the foreground :meth:`touch`-es the key at each turn's start and end — and
then runs over everything that accumulated (its cursor makes that one run instead of many).

Bounded: a wait ends after ``max_wait_s`` however busy the key stays, and at once while
:meth:`hurried` (``daemon.drain`` and shutdown hurry every wait, so draining never waits out
a quiet period and work is not lost to one).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import anyio

__all__ = ["QuietPeriods"]


class QuietPeriods:
    """The last foreground activity per key, and waits for a gap after it."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._hurry = anyio.Event()
        self._hurrying = 0

    def touch(self, key: str) -> None:
        """Foreground activity on ``key`` now (cheap: one dict store)."""
        self._last[key] = time.monotonic()

    async def wait(self, key: str, quiet_s: float, max_wait_s: float) -> float:
        """Return once ``key`` has been quiet for ``quiet_s`` (at most ``max_wait_s`` after the
        call; at once while hurried); the seconds waited."""
        started = time.monotonic()
        while quiet_s > 0 and not self._hurrying:
            now = time.monotonic()
            left = min(self._last.get(key, 0.0) + quiet_s, started + max_wait_s) - now
            if left <= 0:
                break
            with anyio.move_on_after(left):
                await self._hurry.wait()
        return time.monotonic() - started

    @contextlib.contextmanager
    def hurried(self) -> Iterator[None]:
        """While inside: every wait, begun or beginning, returns at once."""
        self._hurrying += 1
        self._hurry.set()
        try:
            yield
        finally:
            self._hurrying -= 1
            if not self._hurrying:
                self._hurry = anyio.Event()
