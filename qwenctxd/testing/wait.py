"""Wait for a condition, never for a fixed time: the one poll loop our tests use.

``until(predicate)`` calls ``predicate()`` until it returns something truthy and returns that
value; ``until_async`` is its twin for async tests (the predicate may be a plain function or a
coroutine function). The timeout is only a generous liveness bound: a test that passes never
waits for it, so it may be large without slowing the suite. When it runs out the call raises
:class:`WaitTimeout` (an ``AssertionError``) naming what was awaited and the last value the
predicate returned, or the last exception it raised when that exception was listed in
``ignoring`` (e.g. ``ConnectionRefusedError`` while a server starts).

Polling starts fast (5 ms) and backs off to ``interval`` (50 ms by default), so a condition that
holds soon is seen soon and a slow one costs little CPU. A predicate may raise to stop waiting
early (a child process that died, say): any exception not in ``ignoring`` propagates at once.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["DEFAULT_TIMEOUT_S", "WaitTimeout", "until", "until_async"]

T = TypeVar("T")

#: The liveness bound when none is given: generous for a loaded two-core machine.
DEFAULT_TIMEOUT_S = 15.0
_FIRST_INTERVAL_S = 0.005
_MAX_REPR = 400


class WaitTimeout(AssertionError):
    """The awaited condition did not hold within the timeout; ``last`` is the last value seen
    (or the last ignored exception)."""

    def __init__(self, what: str, timeout: float, last: object) -> None:
        shown = repr(last)
        if len(shown) > _MAX_REPR:
            shown = shown[:_MAX_REPR] + "…"
        super().__init__(f"timed out after {timeout:g} s waiting for {what}; last seen: {shown}")
        self.what = what
        self.timeout = timeout
        self.last = last


def _describe(predicate: Callable[..., Any], what: str | None) -> str:
    if what is not None:
        return what
    name = getattr(predicate, "__qualname__", None) or repr(predicate)
    return f"{name}() to be true"


def until(predicate: Callable[[], T], *, timeout: float = DEFAULT_TIMEOUT_S,
          what: str | None = None, interval: float = 0.05,
          ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``predicate()`` until it returns something truthy and return it; see the module
    docstring. ``interval`` is the longest pause between two calls."""
    deadline = time.monotonic() + timeout
    pause = min(_FIRST_INTERVAL_S, interval)
    last: object = None
    while True:
        try:
            value = predicate()
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(_describe(predicate, what), timeout, last)
        time.sleep(min(pause, remaining))  # sleep-ok: the helper's own poll pause
        pause = min(pause * 2, interval)


async def until_async(predicate: Callable[[], T | Awaitable[T]], *,
                      timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109
                      what: str | None = None,
                      interval: float = 0.05,
                      ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """The async twin of :func:`until`; ``predicate`` may return an awaitable (awaited).

    A ``timeout`` parameter rather than ``anyio.fail_after`` around the call, so that running
    out names what was awaited and the last value seen."""
    deadline = time.monotonic() + timeout
    pause = min(_FIRST_INTERVAL_S, interval)
    last: object = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as exc:
            last = exc
        else:
            if value:
                return value  # type: ignore[return-value]
            last = value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(_describe(predicate, what), timeout, last)
        await anyio.sleep(min(pause, remaining))  # sleep-ok: the helper's own poll pause
        pause = min(pause * 2, interval)
