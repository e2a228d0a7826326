"""Keep the daemon's long-lived background loops alive: one crash is logged, never fatal.

The idle scheduler, the idle-session closer and the watchdog run for the daemon's whole life in
its top-level task group. An exception escaping one of them would cancel that group and stop
the daemon — a bug in a housekeeping loop must not take every client's daemon down.
:func:`supervise` runs such a loop, logs a crash with its traceback, counts it, and starts the
loop again after a back-off (1 s, doubling to 60 s; reset once a run lasted longer than the
longest back-off). Cancellation passes through untouched; a loop that returns is done.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import structlog

__all__ = ["supervise"]

log = structlog.get_logger("qwenctxd.tasks.supervise")

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 60.0


async def supervise(name: str, loop: Callable[[], Awaitable[None]], *,
                    on_crash: Callable[[str], None] | None = None,
                    first_delay_s: float = FIRST_DELAY_S,
                    max_delay_s: float = MAX_DELAY_S) -> None:
    """Run ``loop`` until it returns, restarting it after each crash (see the module doc)."""
    delay = first_delay_s
    while True:
        started = time.monotonic()
        try:
            await loop()
            return
        except Exception as exc:  # a crash of the loop, not a cancellation
            log.error("background loop crashed; restarting it", loop=name,
                      error=type(exc).__name__, restart_in_s=delay, exc_info=True)
            if on_crash is not None:
                on_crash(name)
        if time.monotonic() - started > max_delay_s:
            delay = first_delay_s
        await anyio.sleep(delay)
        delay = min(delay * 2, max_delay_s)
