"""One file-system watch hub for the whole daemon.

Every subsystem that needs change notifications (config files, instruction files, skills,
memory directories) subscribes here with an explicit list of directories instead of running
its own watcher. The hub keeps ONE watchfiles ``awatch`` over the union of those directories,
always ``recursive=False``: watchfiles' filters only hide events, they never reduce the inotify
watches a recursive watch registers on a whole tree, so the only way to bound the kernel cost
is an explicit directory list (reference/daemon-ecosystem.md §3.4). The path set of an
``awatch`` is fixed when it starts, so whenever the set changes the hub stops the running
watcher (``stop_event``) and starts a new one.

Directories that do not exist yet are watched through their nearest existing ancestor; when
the ancestor reports that a directory on the way was created (or a watched directory was
deleted, moved or replaced), the hub re-plans and restarts.

A restart is blind for a moment: the old watcher drops the changes it had collected but not yet
reported (its debounce), and nothing watches between its stop and the new watcher's
registration. So the hub lists the requested directories before each watcher registers and
again once it has, and hands the subscribers a synthetic change for every entry that differs
between the listing taken before the previous watcher registered and the one taken after this
one did (:mod:`qwenctxd.watch.listing`): a file written into one project's memory while another
project's load restarts the watcher is still reported, and so is every entry already present in
a directory that (re)appeared. The windows overlap: a change may be reported twice.

Registration point: watchfiles' Rust wait loop calls ``stop_event.is_set()`` from its worker
thread every ``step`` ms; the first call can only happen once ``RustNotify`` exists, i.e. once
every inotify watch has been added. The hub's stop event notices that first call and marks the
directory set as synced (``wait_synced``, ``run``'s ``task_status.started()``).

Costs: ``awatch`` holds one worker thread from anyio's default limiter for as long as it runs.
Python only wakes up for real batches and for the ``rust_timeout`` (5 s) round trips; there is
no polling loop here. Callbacks run one after another in the hub's task (a slow callback delays
later batches but loses nothing, the Rust side keeps collecting); keep them short and hand long
work to a task group or a worker thread. A callback that raises is logged and ignored.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import structlog
from anyio.abc import TaskStatus
from watchfiles import BaseFilter, Change, DefaultFilter, awatch

from qwenctxd.watch.listing import Listings, diff, snapshot

__all__ = ["Callback", "FileChange", "WatchHub", "count_inotify_watches"]

log = structlog.get_logger("qwenctxd.watch")

FileChange = tuple[Change, str]
Callback = Callable[[set[FileChange]], Awaitable[None]]

#: How long to wait before retrying after the watcher could not be started (doubling).
_RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 60.0
#: Immediate re-plans allowed when a directory vanished between planning and registering.
_QUICK_RETRIES = 3


def count_inotify_watches() -> int:
    """Inotify watches held by this process, from ``/proc/self/fdinfo`` (0 where unavailable).

    Counts the ``inotify wd:`` lines of every inotify descriptor the process holds, so watches
    registered by other libraries in the process are included.
    """
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    total = 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as fh:
                total += sum(1 for line in fh if line.startswith("inotify wd:"))
        except OSError:
            continue
    return total


def _norm(path: str | os.PathLike[str]) -> str:
    """Absolute, normalised, ``~``-expanded; symlinks are kept (events use the watched path)."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _dir_ident(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of a readable directory, else None (missing, a file, unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or not os.access(path, os.R_OK | os.X_OK):
        return None
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one watcher instance watches, derived from the requested directories."""

    watched: Mapping[str, tuple[int, int]]  # directory -> identity when planned
    missing: frozenset[str]  # requested directories that are absent (watched via an ancestor)
    triggers: frozenset[str]  # paths whose change may alter the plan
    debounce_ms: int
    step_ms: int

    def same_watch(self, other: _Plan) -> bool:
        return (
            self.watched == other.watched
            and self.debounce_ms == other.debounce_ms
            and self.step_ms == other.step_ms
        )


def _make_plan(requested: frozenset[str], debounce_ms: int, step_ms: int) -> _Plan:
    """Stat the requested directories (blocking: run it in a worker thread)."""
    watched: dict[str, tuple[int, int]] = {}
    missing: set[str] = set()
    triggers: set[str] = set()
    for d in requested:
        triggers.add(d)
        ident = _dir_ident(d)
        if ident is not None:
            watched[d] = ident
            continue
        missing.add(d)
        cur = d
        while True:
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            triggers.add(parent)
            ident = _dir_ident(parent)
            if ident is not None:
                watched[parent] = ident
                break
            cur = parent
    return _Plan(watched, frozenset(missing), frozenset(triggers), debounce_ms, step_ms)


def _listed_plan(requested: frozenset[str], debounce_ms: int, step_ms: int
                 ) -> tuple[Listings, _Plan]:
    """The requested directories' listing, then the plan (blocking: run it in a worker thread).
    The listing comes first: it must predate the watches the plan leads to."""
    before = snapshot(requested)
    return before, _make_plan(requested, debounce_ms, step_ms)


class _StopEvent:
    """``stop_event`` for awatch that also reports when the watcher has been registered.

    watchfiles calls ``is_set()`` from its worker thread on every ``step``; the first call
    proves ``RustNotify`` was built, i.e. every inotify watch is in place.
    """

    __slots__ = ("_flag", "_on_first_poll", "_polled")

    def __init__(self, on_first_poll: Callable[[], None]) -> None:
        self._flag = threading.Event()
        self._on_first_poll = on_first_poll
        self._polled = False

    def is_set(self) -> bool:
        if not self._polled:
            self._polled = True
            try:
                self._on_first_poll()
            except Exception:  # the loop may be gone during interpreter shutdown
                log.debug("watch.first_poll_failed", exc_info=True)
        return self._flag.is_set()

    def set(self) -> None:
        self._flag.set()

    def requested(self) -> bool:
        """Whether ``set`` was called; unlike ``is_set`` never counts as the first poll."""
        return self._flag.is_set()


@dataclass(slots=True)
class _Subscription:
    dirs: frozenset[str]
    callback: Callback
    debounce_ms: int | None


@dataclass(slots=True)
class _Signal:
    """A re-armable wake-up: waiters grab the current event, ``fire`` sets and forgets it.

    anyio events need a running loop to be created, so they are made lazily by waiters.
    """

    _event: anyio.Event | None = field(default=None)

    def current(self) -> anyio.Event:
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    def fire(self) -> None:
        ev, self._event = self._event, None
        if ev is not None:
            ev.set()


class WatchHub:
    """The daemon's single file watcher; see the module docstring.

    ``watch``/``unwatch`` are plain methods meant to be called from the event-loop thread;
    ``run`` is the long-running task the daemon starts in its task group.
    """

    def __init__(
        self,
        *,
        debounce_ms: int = 1600,
        step_ms: int = 50,
        watch_filter: BaseFilter | None = None,
        rust_timeout_ms: int | None = None,
    ) -> None:
        """``watch_filter`` (default ``DefaultFilter()``) sees each entry's name relative to
        its watched directory, so ignore rules apply to the entry itself and never to the
        directories above it: a subscriber that lists ``repo/.git`` gets ``repo/.git/HEAD``,
        while a subscriber of ``repo`` does not hear about ``repo/.git``."""
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.rust_timeout_ms = rust_timeout_ms
        self._filter: BaseFilter | None = DefaultFilter() if watch_filter is None else watch_filter
        self._subs: dict[str, _Subscription] = {}
        self._dir_keys: dict[str, set[str]] = {}
        self._requested: frozenset[str] = frozenset()
        self._debounce_eff = debounce_ms
        self._version = 0  # bumps whenever the requested directory set (or debounce) changes
        self._synced_version = -1
        self._changed = _Signal()
        self._synced = _Signal()
        self._stop: _StopEvent | None = None
        self._last: _Plan | None = None  # plan of the last watcher that registered
        self._live: _Plan | None = None  # plan of the watcher registered right now
        # requested directories as listed before the last watcher that registered did so
        self._baseline: Listings = {}
        self._running = False
        self._dispatch_lock: anyio.Lock | None = None
        self.batches = 0  # batches awatch reported
        self.changes = 0  # file changes handed to subscribers (real and synthetic), callbacks done
        self.restarts = 0
        self.last_error: str | None = None
        # watchfiles logs every batch at INFO; the hub logs its own batches at debug.
        logging.getLogger("watchfiles.main").setLevel(logging.WARNING)

    # -- subscriptions --------------------------------------------------------------------
    def watch(
        self,
        key: str,
        dirs: Iterable[str | os.PathLike[str]],
        callback: Callback,
        *,
        debounce_ms: int | None = None,
    ) -> None:
        """Create or replace subscription ``key``.

        ``callback(changes)`` receives only changes whose parent directory is one of ``dirs``
        (non-recursive). Directories may be missing; see the module docstring. A lower
        ``debounce_ms`` than the hub's lowers it for the whole hub while subscribed.
        """
        self._subs[key] = _Subscription(frozenset(_norm(d) for d in dirs), callback, debounce_ms)
        self._resubscribe()

    def unwatch(self, key: str) -> None:
        """Drop subscription ``key`` (no error if it does not exist)."""
        if self._subs.pop(key, None) is not None:
            self._resubscribe()

    def subscriptions(self) -> dict[str, frozenset[Path]]:
        """Each subscription's requested directories (for status and tests)."""
        return {k: frozenset(Path(d) for d in s.dirs) for k, s in self._subs.items()}

    @property
    def directories(self) -> frozenset[Path]:
        """Directories the running watcher has registered with the kernel (incl. ancestors
        standing in for missing directories)."""
        if self._live is None:
            return frozenset()
        return frozenset(Path(d) for d in self._live.watched)

    @property
    def requested_directories(self) -> frozenset[Path]:
        return frozenset(Path(d) for d in self._requested)

    @staticmethod
    def inotify_watches() -> int:
        """Inotify watches held by this process (see ``count_inotify_watches``)."""
        return count_inotify_watches()

    @property
    def synced(self) -> bool:
        """Whether the directory set requested so far is registered (or failed: ``last_error``);
        False while the watcher (re)starts. ``wait_synced`` waits for it."""
        return self._synced_version >= self._version

    async def wait_synced(self) -> None:
        """Return once the directory set requested so far is registered with the kernel (or
        the attempt failed: see ``last_error``). Needs ``run`` to be running."""
        target = self._version
        while self._synced_version < target:
            await self._synced.current().wait()

    def _resubscribe(self) -> None:
        index: dict[str, set[str]] = {}
        for key, sub in self._subs.items():
            for d in sub.dirs:
                index.setdefault(d, set()).add(key)
        self._dir_keys = index
        requested = frozenset(index)
        lows = [s.debounce_ms for s in self._subs.values() if s.debounce_ms is not None]
        debounce = min([self.debounce_ms, *lows])
        if requested == self._requested and debounce == self._debounce_eff:
            return
        self._requested, self._debounce_eff = requested, debounce
        self._version += 1
        if self._stop is not None:
            self._stop.set()
        self._changed.fire()

    # -- the task -------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled; ``task_status.started()`` once the first set is registered."""
        if self._running:
            raise RuntimeError("WatchHub.run is already running")
        self._running = True
        self._dispatch_lock = anyio.Lock()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._stop_on_cancel)
                tg.start_soon(self._loop)
                await self.wait_synced()
                task_status.started()
        finally:
            self._running = False

    async def _stop_on_cancel(self) -> None:
        """Stop the Rust wait loop at once when the hub is cancelled.

        ``awatch`` waits in a worker thread anyio will not abandon, so without this a
        cancellation would only land after ``rust_timeout`` (5 s).
        """
        try:
            await anyio.sleep_forever()
        finally:
            if self._stop is not None:
                self._stop.set()

    async def _loop(self) -> None:
        failures = 0
        quick = 0
        while True:
            version = self._version
            if not self._requested:
                self._stop = None
                self._mark_synced(version)
                await self._wait_for_change(version, None)
                continue
            before, plan = await anyio.to_thread.run_sync(
                _listed_plan, self._requested, self._debounce_eff, self.step_ms
            )
            if version != self._version:
                continue  # subscriptions changed while planning
            try:
                await self._watch_once(plan, version, before)
            except FileNotFoundError as exc:  # a directory vanished before it was registered
                quick += 1
                if quick <= _QUICK_RETRIES:
                    log.debug("watch.replan_vanished", error=str(exc))
                    continue
                failures += 1
                self._failed(version, exc, failures)
                await self._wait_for_change(version, self._backoff(failures))
            except (OSError, RuntimeError) as exc:  # inotify limit, backend failure
                failures += 1
                self._failed(version, exc, failures)
                await self._wait_for_change(version, self._backoff(failures))
            else:
                failures = quick = 0

    def _failed(self, version: int, exc: OSError | RuntimeError, failures: int) -> None:
        self.last_error = f"cannot watch {len(self._requested)} directories: {exc}"
        log.error(
            "watch.start_failed",
            directories=len(self._requested),
            error=str(exc),
            retry_in_s=self._backoff(failures),
        )
        self._mark_synced(version)  # never leave wait_synced() hanging on a failure

    @staticmethod
    def _backoff(failures: int) -> float:
        return float(min(_RETRY_MAX_S, _RETRY_FIRST_S * 2.0 ** max(0, failures - 1)))

    async def _wait_for_change(self, version: int, at_most_s: float | None) -> None:
        with anyio.move_on_after(at_most_s):
            while self._version == version:
                await self._changed.current().wait()

    def _mark_synced(self, version: int) -> None:
        if version > self._synced_version:
            self._synced_version = version
        self._synced.fire()

    async def _watch_once(self, plan: _Plan, version: int, before: Listings) -> None:
        """Run one awatch over ``plan`` until it is stopped or the plan goes stale; ``before``
        lists the requested directories as they were before it started.

        Raises what awatch raised when it could not register the directories (OSError) or
        its backend failed later (``WatchfilesRustInternalError``, a RuntimeError).
        """
        registered = anyio.Event()
        stop = _StopEvent(lambda: anyio.from_thread.run_sync(registered.set))
        self._stop = stop
        previous = self._last
        error: OSError | RuntimeError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._after_registration, plan, previous, version, registered, stop,
                          before)
            stop_event: Any = stop  # awatch only needs is_set()/set()
            try:
                async with aclosing(
                    awatch(
                        *plan.watched,
                        watch_filter=None,  # topology needs every raw change; see _dispatch
                        debounce=plan.debounce_ms,
                        step=plan.step_ms,
                        stop_event=stop_event,
                        rust_timeout=self.rust_timeout_ms,
                        recursive=False,
                        # True makes watchfiles ignore EVERY registration error (missing path,
                        # inotify limit), not just EACCES; _make_plan leaves unreadable dirs out.
                        ignore_permission_denied=False,
                    )
                ) as changes:
                    async for raw in changes:
                        self.batches += 1
                        await self._dispatch(raw)
                        if stop.requested():
                            break
                        if any(path in plan.triggers for _, path in raw):
                            fresh = await anyio.to_thread.run_sync(
                                _make_plan, self._requested, plan.debounce_ms, plan.step_ms
                            )
                            if not fresh.same_watch(plan):
                                log.debug("watch.topology_changed")
                                break
            except (OSError, RuntimeError) as exc:  # RuntimeError: watchfiles' internal error
                error = exc
            finally:
                stop.set()
            if not registered.is_set():
                tg.cancel_scope.cancel()  # the helper is still waiting for registration
        self._live = None
        if error is not None:
            raise error

    async def _after_registration(
        self,
        plan: _Plan,
        previous: _Plan | None,
        version: int,
        registered: anyio.Event,
        stop: _StopEvent,
        before: Listings,
    ) -> None:
        """Once the watches exist: report synced, report what the restart kept from view."""
        await registered.wait()
        if previous is not None:
            self.restarts += 1
        self._last = self._live = plan
        self.last_error = None
        self._mark_synced(version)
        log.debug(
            "watch.registered",
            directories=len(plan.watched),
            missing=len(plan.missing),
            restarts=self.restarts,
        )
        requested = frozenset(self._requested)

        def recheck() -> tuple[_Plan, Listings]:
            return _make_plan(requested, plan.debounce_ms, plan.step_ms), snapshot(before)

        fresh, after = await anyio.to_thread.run_sync(recheck)
        if not fresh.same_watch(plan):
            stop.set()  # something moved while we registered: go round again
        # The listing from before the previous watcher registered, against this one's from
        # after: everything since, including what the restart dropped or never saw.
        baseline, self._baseline = self._baseline, before
        missed = diff(baseline, after)
        if missed:
            log.debug("watch.missed_changes", n=len(missed), restarts=self.restarts)
            await self._dispatch(missed)

    async def _dispatch(self, raw: set[FileChange]) -> None:
        assert self._dispatch_lock is not None
        async with self._dispatch_lock:
            per_key: dict[str, set[FileChange]] = {}
            flt = self._filter
            for change, path in raw:
                parent, name = os.path.split(path)
                keys = self._dir_keys.get(parent)
                if not keys or (flt is not None and not flt(change, name)):
                    continue
                for key in keys:
                    per_key.setdefault(key, set()).add((change, path))
            for key, changes in per_key.items():
                sub = self._subs.get(key)
                if sub is None:
                    continue
                try:
                    await sub.callback(changes)
                except Exception:
                    log.exception("watch.callback_failed", key=key, changes=len(changes))
            self.changes += len(raw)
