"""Background-task registry: spawn, coalesce, observe, drain and cancel daemon jobs.

Every subsystem that works outside a request (extraction, dream, index rebuilds, JSONL
flushes, watchers' refreshes) submits its job here. ``daemon.status`` lists what is in flight
and queued; ``daemon.drain`` waits until both are empty; shutdown cancels what is left after
the drain deadline. Jobs with a ``key`` coalesce: at most one runs and one waits per key, and a
newer submission replaces the waiting one (the "one running + one queued" rule).

A job fails when it raises *or* when it returns a result whose ``status`` is ``"failed"`` (the
agents report a model error or a missed deadline that way instead of raising): it is counted
as failed, its cause (the result's ``reason``, or the exception's type) is kept in
``recent_failures`` for ``daemon.status``, and ``last_finished`` (``last_extract_at``,
``last_dream_at``) moves only for completed jobs.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup

from qwenctxd.tasks.quiet import QuietPeriods

log = structlog.get_logger("qwenctxd.tasks")

JobFn = Callable[[], Awaitable[Any]]
RECENT_FAILURES = 10


def failure_cause(result: Any) -> str | None:
    """The cause when a job's returned ``result`` reports a failure (``status == "failed"``)."""
    if getattr(result, "status", None) != "failed":
        return None
    reason = getattr(result, "reason", None) or getattr(result, "error", None)
    return str(reason) if reason else "failed"


class TaskOutcome(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REPLACED = "replaced"


@dataclass
class TaskRecord:
    id: int
    kind: str
    project: str | None
    description: str
    key: str | None
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    outcome: TaskOutcome | None = None
    error: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None
    result: Any = None
    cancel_requested: bool = False


@dataclass
class _KeySlot:
    running: TaskRecord | None = None
    queued: tuple[TaskRecord, JobFn] | None = None


class TaskRegistry:
    """Runs background jobs in a task group owned by the daemon.

    ``attach(tg)`` must be called before ``submit``; until then (and after ``close``) submits
    are refused with RuntimeError so a job can never be silently lost.
    """

    def __init__(self) -> None:
        self._tg: TaskGroup | None = None
        self._ids = itertools.count(1)
        self._running: dict[int, TaskRecord] = {}
        self._slots: dict[str, _KeySlot] = {}
        self._idle = anyio.Event()
        self._idle.set()
        self._last_finished: dict[str, float] = {}
        self.counts = {o.value: 0 for o in TaskOutcome}
        self.failed_by_kind: dict[str, int] = {}
        self.recent_failures: deque[TaskRecord] = deque(maxlen=RECENT_FAILURES)
        self._listeners: list[Callable[[TaskRecord], None]] = []
        #: jobs that wait for a gap in the foreground first (tasks/quiet.py); a drain hurries them
        self.quiet = QuietPeriods()

    # -- lifecycle ---------------------------------------------------------------------------
    def attach(self, tg: TaskGroup) -> None:
        self._tg = tg

    def close(self) -> None:
        """Refuse further submissions (drain and shutdown call this)."""
        self._tg = None

    @property
    def accepting(self) -> bool:
        return self._tg is not None

    def add_listener(self, fn: Callable[[TaskRecord], None]) -> None:
        """``fn(record)`` is called when a job starts and when it finishes (progress events)."""
        self._listeners.append(fn)

    # -- submission --------------------------------------------------------------------------
    def submit(
        self,
        kind: str,
        fn: JobFn,
        *,
        project: str | None = None,
        description: str = "",
        key: str | None = None,
    ) -> TaskRecord:
        """Schedule ``fn``. With ``key``, at most one runs and one waits; newer replaces queued."""
        if self._tg is None:
            raise RuntimeError("task registry is not accepting jobs")
        rec = TaskRecord(
            id=next(self._ids),
            kind=kind,
            project=project,
            description=description,
            key=key,
            submitted_at=time.time(),
        )
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        if key is not None:
            slot = self._slots.setdefault(key, _KeySlot())
            if slot.running is not None:
                if slot.queued is not None:
                    old, _ = slot.queued
                    self._finish(old, TaskOutcome.REPLACED)
                slot.queued = (rec, fn)
                return rec
            slot.running = rec
        self._start(rec, fn)
        return rec

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str) -> None:
        """Run ``fn(*args)`` in the daemon's task group without recording it as a job: for work
        that requests wait on (shared loads, see ``tasks.shared_load``), not background work of
        its own. ``fn`` must not raise. RuntimeError when not accepting."""
        if self._tg is None:
            raise RuntimeError("task registry is not accepting jobs")
        self._tg.start_soon(fn, *args, name=name)

    def _start(self, rec: TaskRecord, fn: JobFn) -> None:
        assert self._tg is not None
        self._running[rec.id] = rec
        self._tg.start_soon(self._run, rec, fn, name=f"task:{rec.kind}:{rec.id}")

    async def _run(self, rec: TaskRecord, fn: JobFn) -> None:
        rec.started_at = time.time()
        self._notify(rec)
        outcome = TaskOutcome.COMPLETED
        with anyio.CancelScope() as scope:
            rec.scope = scope
            if rec.cancel_requested:
                scope.cancel()
            try:
                rec.result = await fn()
                cause = failure_cause(rec.result)
                if cause is not None:
                    outcome = TaskOutcome.FAILED
                    rec.error = cause
                    log.warning("background job failed", kind=rec.kind, task_id=rec.id,
                                cause=cause)
            except anyio.get_cancelled_exc_class():
                outcome = TaskOutcome.CANCELLED
                raise
            except Exception as exc:  # a job's failure must never take the daemon down
                outcome = TaskOutcome.FAILED
                rec.error = type(exc).__name__
                log.exception("background job failed", kind=rec.kind, task_id=rec.id)
            finally:
                self._running.pop(rec.id, None)
                self._finish(rec, outcome if not scope.cancel_called else TaskOutcome.CANCELLED)
                self._advance_key(rec)
        if scope.cancelled_caught:
            # routine (a newer user turn supersedes its session's recall prefetch): a line at
            # info for every turn cost more than the cancelled job; the outcome is counted
            log.debug("background job cancelled", kind=rec.kind, task_id=rec.id)

    def _advance_key(self, rec: TaskRecord) -> None:
        if rec.key is None:
            return
        slot = self._slots.get(rec.key)
        if slot is None or slot.running is not rec:
            return
        slot.running = None
        if slot.queued is not None:
            nxt, fn = slot.queued
            slot.queued = None
            if self._tg is not None:
                slot.running = nxt
                self._start(nxt, fn)
            else:
                self._finish(nxt, TaskOutcome.CANCELLED)
        if slot.running is None and slot.queued is None:
            self._slots.pop(rec.key, None)

    def _finish(self, rec: TaskRecord, outcome: TaskOutcome) -> None:
        if rec.outcome is not None:
            return
        rec.outcome = outcome
        rec.finished_at = time.time()
        self.counts[outcome.value] += 1
        if outcome is TaskOutcome.COMPLETED:
            self._last_finished[rec.kind] = rec.finished_at
        elif outcome is TaskOutcome.FAILED:
            self.failed_by_kind[rec.kind] = self.failed_by_kind.get(rec.kind, 0) + 1
            self.recent_failures.append(rec)
        rec.done.set()
        self._notify(rec)
        if not self._running and self.queued == 0:
            self._idle.set()

    def _notify(self, rec: TaskRecord) -> None:
        for fn in self._listeners:
            try:
                fn(rec)
            except Exception:
                log.exception("task listener failed")

    # -- observation -------------------------------------------------------------------------
    @property
    def in_flight(self) -> list[TaskRecord]:
        return sorted(self._running.values(), key=lambda r: r.id)

    @property
    def queued(self) -> int:
        return sum(1 for s in self._slots.values() if s.queued is not None)

    @property
    def pending(self) -> int:
        return len(self._running) + self.queued

    def last_finished(self, kind: str) -> float | None:
        return self._last_finished.get(kind)

    # -- drain / cancel ----------------------------------------------------------------------
    async def drain(self, timeout_s: float | None) -> bool:
        """Wait until nothing runs or waits; True if that happened before the timeout. Jobs
        waiting for a quiet period start at once (``quiet.hurried``)."""
        with self.quiet.hurried(), anyio.move_on_after(timeout_s):
            while self.pending:
                await self._idle.wait()
            return True
        return self.pending == 0

    def cancel(self, rec: TaskRecord) -> None:
        """Cancel one job (running or about to start); a finished one is left alone."""
        if rec.outcome is not None:
            return
        rec.cancel_requested = True
        if rec.scope is not None:
            rec.scope.cancel()

    def cancel_all(self) -> int:
        """Cancel every running job and drop queued ones; returns how many were affected."""
        n = 0
        for slot in self._slots.values():
            if slot.queued is not None:
                self._finish(slot.queued[0], TaskOutcome.CANCELLED)
                slot.queued = None
                n += 1
        for rec in list(self._running.values()):
            if rec.scope is not None:
                rec.scope.cancel()
                n += 1
        return n
