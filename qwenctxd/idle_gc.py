"""Full garbage collections moved to the moments a process has nothing to answer.

CPython's cyclic collector starts a full (generation 2) collection by itself once enough
objects have survived the younger generations, in the middle of whatever code allocates
next. Its pause grows with every long-lived container the process holds — an SDK imported
after start-up, the open sessions' histories, the proxy's conversation state: 20–50 ms in
the daemon and in ``qwenctl proxy`` under the proxy bench, measured with ``gc.callbacks``
(issue 28), which made the slowest first bytes. The younger generations stay automatic
(their pauses are well under a millisecond); generation 2 is taken off the automatic
schedule and collected by :meth:`IdleCollector.run` when no request has started or been in
flight for :data:`IDLE_S` and as many younger collections have passed as CPython's own
threshold asks for — or after :data:`MAX_DEFER_S` regardless, so the cyclic garbage of a
process that is never idle is still collected.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import anyio

IDLE_S = 0.5  # no request for this long: a full collection may run
MAX_DEFER_S = 300.0  # a full collection runs at least this often, idle or not
CHECK_S = 0.25
#: generation 2's automatic threshold while the collector is installed: never reached
OFF = 2**31 - 1


class IdleCollector:
    """``requests()``: how many requests the process has started so far; ``in_flight()``:
    how many are running now."""

    def __init__(self, requests: Callable[[], int], in_flight: Callable[[], int], *,
                 idle_s: float = IDLE_S, max_defer_s: float = MAX_DEFER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._requests, self._in_flight = requests, in_flight
        self.idle_s, self.max_defer_s, self._clock = idle_s, max_defer_s, clock
        self._seen = requests()
        self._last_busy = self._last_full = clock()
        self._every = gc.get_threshold()[2]  # CPython's own pace for a full collection
        self._saved: tuple[int, int, int] | None = None
        self.collections = 0

    def install(self) -> None:
        """Take generation 2 off the automatic schedule (:meth:`restore` puts it back)."""
        if self._saved is None:
            self._saved = gc.get_threshold()
            self._every = self._saved[2]
            gc.set_threshold(self._saved[0], self._saved[1], OFF)

    def restore(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

    def tick(self) -> bool:
        """Collect generation 2 if now is the time; whether it did."""
        now = self._clock()
        seen = self._requests()
        if seen != self._seen or self._in_flight():
            self._seen, self._last_busy = seen, now
        idle = now - self._last_busy >= self.idle_s
        younger = gc.get_count()[2]  # generation 1 collections since the last full one
        due = younger and now - self._last_full >= self.max_defer_s
        if (idle and younger >= self._every) or due:
            gc.collect(2)
            self._last_full = self._clock()
            self.collections += 1
            return True
        return False

    async def run(self) -> None:
        """Install, then tick until cancelled (the thresholds are restored then)."""
        self.install()
        try:
            while True:
                await anyio.sleep(CHECK_S)
                self.tick()
        finally:
            self.restore()
