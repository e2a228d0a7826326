"""SessionSearch: keeps the search index in step with the session files and answers queries.

What makes a file *dirty* (to be read again from its indexed offset):

* the daemon recording a record (:meth:`SessionSearch.recorded`, a record hook of
  ``SessionStore.recorded``: searchable within about :data:`RECORD_COALESCE_S`);
* a watch (:class:`~qwenctxd.watch.closed_writes.ClosedWriteWatch` on Linux, else the watch
  hub) of the ``chats`` directory of every project under ``<runtime>/projects`` and of the
  projects directory itself (a new project directory adds its ``chats`` to the watch), so a
  file written and closed, removed or moved by another program (the real ``qwen`` CLI) is
  seen at once; the daemon's own appends raise no event (the record hook covers them);
* the start-up scan, which compares every file's size and mtime with the index.

One task (:meth:`run`) reads dirty files in worker threads and writes them in bounded batches
(:data:`BATCH_FILES` files, :data:`BATCH_ENTRIES` entries), so a first start over a large
history indexes in the background and the event loop keeps serving; ``pending`` counts the
dirty files. The index is a cache (:class:`~.index.SearchIndex`): lost or corrupt, it is
rebuilt from the files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.to_thread
import structlog

from qwenctxd.paths import SESSION_FILE_RE, project_slug
from qwenctxd.protocol import errors
from qwenctxd.protocol import session as wire
from qwenctxd.sessions.search import query as search_query
from qwenctxd.sessions.search.index import FileState, FileUpdate, Filters, SearchIndex
from qwenctxd.sessions.search.reader import chats_dirs, discover, read_update
from qwenctxd.watch import Callback, FileChange

if TYPE_CHECKING:
    from qwenctxd.project import Project

log = structlog.get_logger("qwenctxd.sessions.search")

WATCH_KEY = "session-search"
BATCH_FILES = 32
BATCH_ENTRIES = 4000
RECORD_COALESCE_S = 0.5  # records close together (a turn, a burst of turns) are read together
MAX_LIMIT = 100
RECHECK_S = 2.0  # a second scan after a project directory event
SYNC_WAIT_S = 10.0  # at most this long for new watches to go live before a rescan


class Watcher(Protocol):
    """What session search needs of a directory watch (ClosedWriteWatch, WatchHub)."""

    def watch(self, key: str, dirs: Iterable[str | os.PathLike[str]],
              callback: Callback) -> None: ...
    def unwatch(self, key: str) -> None: ...
    async def wait_synced(self) -> None: ...


class SessionSearch:
    """The ``session.search`` service over ``projects_root`` (see the module docstring)."""

    def __init__(self, db_path: Path, *, projects_root: Path, hub: Watcher | None,
                 own_watch: bool = False) -> None:
        """``hub``: the watch of the chats directories; ``own_watch``: it is this search's
        own (a ClosedWriteWatch), run by :meth:`run`, not a shared one the daemon runs."""
        self.index = SearchIndex(db_path)
        self.projects_root = projects_root
        self._hub = hub
        self._own_watch = own_watch
        self._dirty: dict[str, None] = {}  # insertion-ordered set of paths
        self._in_batch = 0
        self._wake = anyio.Event()
        self._rescan = False
        self._watched: frozenset[Path] = frozenset()
        self._counts = (0, 0, 0, 0)  # files, entries, torn lines, junk files
        self._run_scope: anyio.CancelScope | None = None
        self._recheck_at: float | None = None  # a scan due then (monotonic)
        self._closed = False
        self._opened = anyio.Event()
        self._scanned = False
        self.batches = 0

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Nothing to wait for: :meth:`run` opens the index and scans in the background, so
        start-up is not held (``pending`` counts 1 until that first scan is done)."""

    async def _open(self) -> None:
        """Open (or rebuild) the index and find what changed while the daemon was away."""
        await self.index.open()
        if self.index.set_aside is not None:
            log.warning("search index was corrupt: rebuilding", set_aside=str(self.index.set_aside))
        self._opened.set()
        await self._scan()
        self._counts = await self.index.counts()
        self._scanned = True
        self._rescan = True  # watch, wait for the watches to be live, scan again

    async def aclose(self) -> None:
        """Stop indexing (a batch in flight is abandoned: the files are the truth), close."""
        self._closed = True
        if self._run_scope is not None:
            self._run_scope.cancel()
        if self._hub is not None:
            self._hub.unwatch(WATCH_KEY)
        self._opened.set()  # a search waiting for the index fails fast ("not open")
        await self.index.close()

    async def run(self) -> None:
        """Until :meth:`aclose`: index what is dirty, in bounded batches, then wait for more."""
        with anyio.CancelScope() as self._run_scope:
            if self._closed:
                return
            async with anyio.create_task_group() as tg:
                if self._own_watch and self._hub is not None:
                    await tg.start(self._hub.run)  # type: ignore[attr-defined]
                await self._open()
                await self._run()

    async def _run(self) -> None:
        while True:
            if not self._dirty and not self._rescan:
                wait = None if self._recheck_at is None else self._recheck_at - time.monotonic()
                with anyio.move_on_after(wait):
                    await self._wake.wait()
                    await anyio.sleep(RECORD_COALESCE_S)
            self._wake = anyio.Event()
            recheck = self._recheck_at is not None and time.monotonic() >= self._recheck_at
            if self._rescan or recheck:
                # a project directory came or went: its files are found by scanning (again,
                # RECHECK_S later: files made while a directory's watch was being set up)
                self._recheck_at = time.monotonic() + RECHECK_S if self._rescan else None
                self._rescan = False
                self._rewatch()
                if self._hub is not None:  # files made before the watches were live: the scan
                    with anyio.move_on_after(SYNC_WAIT_S):
                        await self._hub.wait_synced()
                await self._scan()
            while self._dirty:
                await self._index_batch()

    # -- what changed ---------------------------------------------------------------------
    def recorded(self, path: Path) -> None:
        """The daemon appended to ``path`` (``SessionStore.recorded``'s record hook). Cheap."""
        key = str(path)
        if key not in self._dirty:
            self._dirty[key] = None
            self._wake.set()

    async def _on_change(self, changes: set[FileChange]) -> None:
        root = str(self.projects_root)
        for _change, path in changes:
            parent = os.path.dirname(path)
            if parent == root or path == root or Path(path) in self._watched:
                # a project directory came or went, a chats directory went (or the kernel's
                # event queue overflowed: every watched directory is reported)
                self._rescan = True
            elif SESSION_FILE_RE.match(os.path.basename(path)):
                self._dirty[path] = None
        self._wake.set()

    def _rewatch(self) -> bool:
        """Watch the projects directory and every project's chats; True if that set changed."""
        if self._hub is None:
            return False
        dirs = frozenset([self.projects_root, *chats_dirs(self.projects_root)])
        changed = dirs != self._watched
        self._watched = dirs
        # every time: a directory removed and made again is watched again (a no-op otherwise)
        self._hub.watch(WATCH_KEY, dirs, self._on_change)
        return changed

    async def _scan(self) -> None:
        found = await anyio.to_thread.run_sync(discover, self.projects_root)
        known = await self.index.states()
        for path, f in sorted(found.items(), key=lambda kv: kv[1].mtime_ns):  # oldest first
            st = known.get(path)
            if st is None or (st.size, st.mtime_ns) != (f.size, f.mtime_ns):
                self._dirty[path] = None
        for path in known:
            if path not in found:
                self._dirty[path] = None  # read_update sees it gone
        log.info("search index scan", files=len(found), pending=len(self._dirty))

    async def _index_batch(self) -> None:
        paths = list(self._dirty)[:BATCH_FILES]
        for p in paths:
            del self._dirty[p]
        self._in_batch = len(paths)
        try:
            # states, the files read on from them, the writes and the counts: one job
            unread, self._counts = await self.index.read_and_apply(paths, _read_batch)
            self._dirty = dict.fromkeys([*unread, *self._dirty])
            self.batches += 1
        finally:
            self._in_batch = 0

    # -- queries --------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._dirty) + self._in_batch + (0 if self._scanned else 1)

    def indexed(self) -> wire.SearchIndexed:
        return wire.SearchIndexed(sessions=self._counts[0], entries=self._counts[1],
                                  pending=self.pending)

    def status(self) -> dict[str, int]:
        files, entries, torn, junk = self._counts
        return {"sessions": files, "entries": entries, "pending": self.pending,
                "torn_lines": torn, "junk_files": junk, "batches": self.batches}

    async def search(self, p: wire.SearchParams,
                     scope: tuple[Path, Project] | None) -> wire.SearchResult:
        """``session.search`` (params checked here: -32602 naming the field)."""
        filters = _filters(p, scope)
        await self._opened.wait()
        q = search_query.parse(p.query)
        hits: list[wire.SearchHit] = []
        if q.match is not None:
            for r in await self.index.search(q.match, filters, p.limit):
                hits.append(wire.SearchHit(
                    session_id=r["session_id"], cwd=r["cwd"], title=r["title"],
                    entry=r["entry"], role=r["role"], time=r["time"],
                    snippet=search_query.snippet(r["text"], q.needles),
                    score=-float(r["rank"])))
        return wire.SearchResult(hits=hits, indexed=self.indexed())


def _read_batch(paths: list[str], states: dict[str, FileState],
                ) -> tuple[list[FileUpdate], list[str]]:
    """Blocking: the updates for ``paths`` until BATCH_ENTRIES entries were read, and the
    paths left for the next batch."""
    out: list[FileUpdate] = []
    entries = 0
    for i, path in enumerate(paths):
        if entries >= BATCH_ENTRIES:
            return out, paths[i:]
        up = read_update(path, states.get(path))
        if up is not None:
            out.append(up)
            entries += len(up.rows)
    return out, []


def _invalid(field: str, message: str) -> errors.InvalidParams:
    return errors.InvalidParams(f"{field}: {message}", data={"field": field, "message": message})


def parse_since(value: str) -> float:
    """An ISO-8601 date or date-time (UTC when it names no zone) as a Unix time."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise _invalid("since", "not an ISO-8601 date or time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _filters(p: wire.SearchParams, scope: tuple[Path, Project] | None) -> Filters:
    """The query's filters; ``scope``: the cwd and the project it belongs to (resolved at the
    wire edge) — the sessions recorded in the cwd or anywhere in its project."""
    if not p.query.strip():
        raise _invalid("query", "blank")
    if not 1 <= p.limit <= MAX_LIMIT:
        raise _invalid("limit", f"must be 1..{MAX_LIMIT}")
    if not p.roles:
        raise _invalid("roles", "empty")
    if p.session_id is not None:
        from qwenctxd.sessions.manager import checked_id

        checked_id(p.session_id)
    since = parse_since(p.since) if p.since is not None else None
    filters = Filters(roles=sorted(set(p.roles)), session_id=p.session_id, since_ts=since)
    if scope is not None:
        cwd, project = scope
        root = project.root
        slugs = {project_slug(cwd)}
        if root is not None:
            slugs.add(project_slug(root))
        filters.slugs = sorted(slugs)
        filters.under = str(root or cwd)
    return filters
