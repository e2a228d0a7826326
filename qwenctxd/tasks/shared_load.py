"""Shared loads: per-key work that many callers wait for and that none of them can abort.

A per-project load (a memory scan and its FTS index build, an instruction set, a skill set, a
git snapshot) is started by whoever needs it first, and other callers arrive while it runs.
Run in the first caller's task, that caller's cancellation (a superseded recall prefetch, a
cancelled request, a closed connection) would stop it half-way and could leave a half-built
state behind for everyone. :class:`SharedLoads` keeps one value per key and these rules:

* the load runs in a task of its own in the daemon's long-lived task group
  (:meth:`TaskRegistry.start_soon`); callers only wait on an event, so a cancelled caller stops
  waiting and nothing else;
* the value is published (``peek``/``get`` return it) only once the load has returned; an
  exception goes to the callers waiting for that attempt and is not cached — the next ``get``
  loads again; a load cancelled under its callers (shutdown) makes them start another;
* loads of one key run one after another in start order, so a newer load's value is never
  overwritten by an older one's; ``reload`` queues a fresh load behind the running one (a
  second ``reload`` joins the queued one); ``invalidate`` drops the value and keeps loads that
  had already started from publishing (their callers still get what was loaded for them);
* without a task group (before the daemon attaches one, once shutdown began, in unit tests)
  the load runs in the caller's task: a cancellation then aborts it, and still publishes
  nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import structlog

from qwenctxd.tasks.registry import TaskRegistry

log = structlog.get_logger("qwenctxd.tasks.shared")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(eq=False)
class _Attempt(Generic[V]):
    load: Callable[[], Awaitable[V]]
    done: anyio.Event = field(default_factory=anyio.Event)
    claimed: bool = False  # a task runs it (spawned, or a caller running it inline)
    started: bool = False  # holds the key's lock: reads what is on disk from now on
    epoch: int = -1
    ok: bool = False
    value: V | None = None
    error: BaseException | None = None
    scope: anyio.CancelScope | None = None


@dataclass(eq=False)
class _Slot(Generic[V]):
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    has_value: bool = False
    value: V | None = None
    epoch: int = 0
    attempts: list[_Attempt[V]] = field(default_factory=list)  # not finished, in start order


class SharedLoads(Generic[K, V]):
    """Per-key values loaded once, shared by every caller, published only when complete."""

    def __init__(self, tasks: TaskRegistry | None, kind: str) -> None:
        self._tasks = tasks
        self._kind = kind
        self._slots: dict[K, _Slot[V]] = {}
        self.loads = 0  # loads that ran to the end (published or not)
        self.failures = 0
        self._closed = False  # after aclose() no load starts (it could open what nobody closes)

    # -- reading ------------------------------------------------------------------------------
    def peek(self, key: K) -> V | None:
        """The published value, or None (never waits, never loads)."""
        slot = self._slots.get(key)
        return slot.value if slot is not None and slot.has_value else None

    def items(self) -> Iterator[tuple[K, V]]:
        for key, slot in list(self._slots.items()):
            if slot.has_value:
                yield key, slot.value  # type: ignore[misc]

    def epoch(self, key: K) -> int:
        """Bumped by every :meth:`invalidate` of ``key``."""
        slot = self._slots.get(key)
        return slot.epoch if slot is not None else 0

    def loading(self, key: K) -> bool:
        slot = self._slots.get(key)
        return bool(slot and slot.attempts)

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """The published value; else the result of the load in flight; else of a new one."""
        while True:
            slot = self._slots.get(key)
            if slot is not None and slot.has_value:
                return slot.value  # type: ignore[return-value]
            slot = self._slots.setdefault(key, _Slot())
            last = slot.attempts[-1] if slot.attempts else None
            if last is not None and (not last.started or last.epoch == slot.epoch):
                attempt = last
            else:
                attempt = self._begin(key, slot, load)
            ok, value = await self._wait(key, slot, attempt)
            if ok:
                return value  # type: ignore[return-value]

    async def reload(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """A load that starts after everything already running for ``key`` (files changed)."""
        while True:
            slot = self._slots.setdefault(key, _Slot())
            last = slot.attempts[-1] if slot.attempts else None
            attempt = last if last is not None and not last.started else \
                self._begin(key, slot, load)
            ok, value = await self._wait(key, slot, attempt)
            if ok:
                return value  # type: ignore[return-value]

    # -- writing ------------------------------------------------------------------------------
    def publish(self, key: K, value: V) -> None:
        """Publish a value the caller built itself (a synchronous lookup); loads already
        started for ``key`` will not overwrite it."""
        slot = self._slots.setdefault(key, _Slot())
        slot.epoch += 1
        slot.value, slot.has_value = value, True

    def invalidate(self, key: K) -> None:
        """Drop the value; loads already started for ``key`` will not publish theirs."""
        slot = self._slots.get(key)
        if slot is None:
            return
        slot.epoch += 1
        slot.has_value = False
        slot.value = None

    def forget(self, key: K) -> None:
        """Invalidate and drop the key's bookkeeping once nothing is in flight."""
        self.invalidate(key)
        slot = self._slots.get(key)
        if slot is not None and not slot.attempts:
            self._slots.pop(key, None)

    async def aclose(self) -> None:
        """Cancel the loads in flight and wait for them to end (daemon shutdown); a load
        scheduled but not yet begun never begins, and a later one raises
        :class:`anyio.ClosedResourceError`."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            for slot in list(self._slots.values()):
                for attempt in list(slot.attempts):
                    if attempt.scope is not None:
                        attempt.scope.cancel()
            for slot in list(self._slots.values()):
                for attempt in list(slot.attempts):
                    if attempt.scope is not None:
                        with anyio.move_on_after(5):
                            await attempt.done.wait()

    # -- internals ----------------------------------------------------------------------------
    def _begin(self, key: K, slot: _Slot[V], load: Callable[[], Awaitable[V]]) -> _Attempt[V]:
        attempt: _Attempt[V] = _Attempt(load=load)
        slot.attempts.append(attempt)
        if self._tasks is not None and self._tasks.accepting:
            attempt.claimed = True
            self._tasks.start_soon(self._run, key, slot, attempt,
                                   name=f"shared-load:{self._kind}")
        return attempt

    async def _wait(self, key: K, slot: _Slot[V], attempt: _Attempt[V]) -> tuple[bool, Any]:
        """(True, value) or (False, None) when the attempt was cancelled; raises its error."""
        if not attempt.claimed:
            attempt.claimed = True
            await self._run(key, slot, attempt)  # no task group: in this caller's task
        else:
            await attempt.done.wait()  # a cancelled caller leaves here; the load goes on
        if attempt.ok:
            return True, attempt.value
        if isinstance(attempt.error, Exception):
            raise attempt.error
        return False, None

    async def _run(self, key: K, slot: _Slot[V], attempt: _Attempt[V]) -> None:
        try:
            with anyio.CancelScope() as scope:
                attempt.scope = scope
                async with slot.lock:
                    if self._closed:
                        attempt.error = anyio.ClosedResourceError(f"{self._kind} loads are closed")
                        return
                    attempt.started = True
                    attempt.epoch = slot.epoch
                    try:
                        value = await attempt.load()
                    except Exception as exc:
                        attempt.error = exc
                        self.failures += 1
                        log.warning("shared load failed", kind=self._kind, key=str(key),
                                    error=type(exc).__name__, exc_info=True)
                        return
                    self.loads += 1
                    attempt.value, attempt.ok = value, True
                    if attempt.epoch == slot.epoch:
                        slot.value, slot.has_value = value, True
        except BaseException as exc:
            attempt.error = exc
            raise
        finally:
            if attempt.error is None and not attempt.ok:
                attempt.error = anyio.get_cancelled_exc_class()()
            slot.attempts.remove(attempt)
            if not slot.attempts and not slot.has_value and slot.epoch == 0 \
                    and self._slots.get(key) is slot:
                self._slots.pop(key, None)
            attempt.done.set()
