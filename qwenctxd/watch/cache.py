"""WatchedCache: a value per key (a project, a cwd), kept fresh by the watch hub.

The one implementation of "cache per project, invalidated by watchers, re-checked once the
watches are live", used by the project registry, the config store and the instructions, git,
skills and memory subsystems. A load returns a
:class:`Watched`: the value, the directories to watch (an explicit, non-recursive set, as the
:class:`~qwenctxd.watch.WatchHub` wants), a filter for the events that matter, and optionally a
``changed`` check. Then:

* the load runs as a :class:`~qwenctxd.tasks.SharedLoads` load — a waiter's cancellation never
  aborts it, and the value is published only once the load returned (never half-built);
* after the load (nothing awaited in between) the directories are watched under
  ``"<kind>:<key>"``; a relevant event makes the key *stale*;
* once the hub reports its watches live, ``changed()`` runs in a worker thread; True (an edit
  landed between reading and watching) makes the key stale too, unless a newer value was
  published meanwhile;
* a value that must be had without awaiting (a cwd's project, a project's settings) is built
  by the caller and handed to :meth:`publish`; from there it is watched and re-checked the same
  way;
* stale means :meth:`invalidate` (the next ``get`` loads again), or the ``on_stale`` callback
  when the subsystem refreshes in the background instead (skills, memory: debounced reloads and
  a change event).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
import structlog

from qwenctxd.tasks import SharedLoads, TaskRegistry
from qwenctxd.watch.hub import FileChange, WatchHub

log = structlog.get_logger("qwenctxd.watch.cache")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
VERIFY_WAIT_S = 10.0


@dataclass(frozen=True, eq=False)
class Watched(Generic[V]):
    """What a load returns: the value and how to know it went stale."""

    value: V
    dirs: Collection[Path]
    relevant: Callable[[Path], bool]
    # after the watches are live: True when what the value was built from changed meanwhile
    # (runs in a worker thread)
    changed: Callable[[], bool] | None = None


@dataclass(frozen=True, eq=False)
class _Entry(Generic[V]):
    value: V
    watched: Watched[V]


class WatchedCache(Generic[K, V]):
    """Per-key values loaded once, shared, watched; see the module docstring.

    Without a hub (a service built standalone, outside a daemon) nothing is watched: a value
    lives until :meth:`invalidate`."""

    def __init__(
        self,
        hub: WatchHub | None,
        tasks: TaskRegistry | None,
        kind: str,
        *,
        on_stale: Callable[[K, V], None] | None = None,
        project_of: Callable[[K], str | None] = lambda k: None if k is None else str(k),
    ) -> None:
        self._hub = hub
        self._tasks = tasks
        self.kind = kind
        self._on_stale = on_stale
        self._project_of = project_of
        self._loads: SharedLoads[K, _Entry[V]] = SharedLoads(tasks, kind)
        self.stale_events = 0

    # -- reading ------------------------------------------------------------------------------
    def peek(self, key: K) -> V | None:
        entry = self._loads.peek(key)
        return entry.value if entry is not None else None

    def items(self) -> Iterator[tuple[K, V]]:
        for key, entry in self._loads.items():
            yield key, entry.value

    def epoch(self, key: K) -> int:
        """Bumped by every :meth:`invalidate` of ``key`` (part of a dependent cache's stamp)."""
        return self._loads.epoch(key)

    def loading(self, key: K) -> bool:
        return self._loads.loading(key)

    @property
    def loads(self) -> int:
        return self._loads.loads

    async def get(self, key: K, load: Callable[[], Awaitable[Watched[V]]]) -> V:
        """The published value; else the load in flight's; else a new load's."""
        entry = self._loads.peek(key)
        if entry is None:
            entry = await self._loads.get(key, self._wrap(key, load))
        return entry.value

    async def reload(self, key: K, load: Callable[[], Awaitable[Watched[V]]]) -> V:
        """A load that starts after everything already running for ``key``."""
        entry = await self._loads.reload(key, self._wrap(key, load))
        return entry.value

    async def live(self) -> None:
        """Return once the hub has registered every watch asked for so far (a start-up that
        must re-read what changed before its watches existed)."""
        if self._hub is not None:
            await self._hub.wait_synced()

    # -- writing ------------------------------------------------------------------------------
    def publish(self, key: K, watched: Watched[V]) -> None:
        """Publish a value built synchronously by the caller, and watch it like a load's.

        For lookups that must answer without awaiting (a project's root on every request, its
        settings from a worker thread): the caller builds ``watched`` itself; from here on it
        is the same as a load — watched at once, re-checked once the watches are live. Call
        from the event-loop thread."""
        entry = _Entry(watched.value, watched)
        self._loads.publish(key, entry)
        self._after_load(key, self._loads.epoch(key), entry)

    def invalidate(self, key: K) -> None:
        """Drop the value; loads already started will not publish theirs."""
        self._loads.invalidate(key)

    def forget(self, key: K) -> None:
        """Invalidate, stop watching and drop the key's bookkeeping."""
        self._loads.forget(key)
        if self._hub is not None:
            self._hub.unwatch(self._watch_key(key))

    def stale(self, key: K) -> None:
        """What a relevant change does: the subsystem's refresh, else an invalidation."""
        self.stale_events += 1
        if self._on_stale is None:
            self.invalidate(key)
            return
        value = self.peek(key)
        if value is not None:
            self._on_stale(key, value)
        else:  # nothing published to refresh: the next get loads afresh
            self.invalidate(key)

    async def aclose(self) -> None:
        await self._loads.aclose()

    # -- internals ----------------------------------------------------------------------------
    def _watch_key(self, key: K) -> str:
        return f"{self.kind}:{key}"

    def _wrap(self, key: K, load: Callable[[], Awaitable[Watched[V]]]
              ) -> Callable[[], Awaitable[_Entry[V]]]:
        async def run() -> _Entry[V]:
            epoch = self._loads.epoch(key)
            watched = await load()
            entry = _Entry(watched.value, watched)
            self._after_load(key, epoch, entry)  # nothing awaited between the load and this
            return entry

        return run

    def _after_load(self, key: K, epoch: int, entry: _Entry[V]) -> None:
        self._watch(key, entry.watched)
        if entry.watched.changed is not None and self._loads.epoch(key) == epoch:
            self._schedule_verify(key, entry)

    def _watch(self, key: K, watched: Watched[V]) -> None:
        hub, relevant = self._hub, watched.relevant
        if hub is None:
            return

        async def on_change(changes: set[FileChange] | set[tuple[Any, str]]) -> None:
            for _, raw in changes:
                if relevant(Path(raw)):
                    log.debug("watched value stale", kind=self.kind, key=str(key), path=raw)
                    self.stale(key)
                    return

        if watched.dirs:
            hub.watch(self._watch_key(key), watched.dirs, on_change)
        else:
            hub.unwatch(self._watch_key(key))

    def _schedule_verify(self, key: K, entry: _Entry[V]) -> None:
        tasks, hub = self._tasks, self._hub
        changed = entry.watched.changed
        if tasks is None or hub is None or not tasks.accepting or changed is None:
            return

        async def verify() -> None:
            with anyio.move_on_after(VERIFY_WAIT_S):
                await hub.wait_synced()
            if await anyio.to_thread.run_sync(changed) and self._loads.peek(key) is entry:
                self.stale(key)

        tasks.submit(f"{self.kind}-verify", verify, key=f"{self.kind}-verify:{key}",
                     project=self._project_of(key))
