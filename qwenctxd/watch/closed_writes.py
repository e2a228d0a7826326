"""ClosedWriteWatch: directories watched for files written *and closed*, created, removed, moved.

The watch hub (watchfiles) asks the kernel for every event, ``IN_MODIFY`` included, and a watched
directory's every ``write()`` then pays for it inside the syscall and wakes the watcher thread:
an 800-byte append 6 → 23 µs, about 4 % of a warm ``session.turn`` for the session file the
daemon itself appends to (bench/session_search: the watch was the whole cost, the record hook
and the indexing none). Session search only needs to know that another program finished
writing: Qwen Code appends a record with ``fs.promises.appendFile`` — open, write, close — so
``IN_CLOSE_WRITE`` marks each record, while the daemon keeps its descriptor open and its own
appends raise no event the watch asked for (it tells search itself, through the record hook).

Linux inotify through libc (ctypes), read on the event loop (``anyio.wait_readable``), with
the same three calls session search uses of the hub: :meth:`watch`, :meth:`unwatch`,
:meth:`wait_synced` (a watch is live when ``inotify_add_watch`` returns). A writer that keeps
its file open and never closes it is seen at its close (or the next scan); a queue overflow is
reported as a change of every watched directory (the subscriber rescans).

A directory that does not exist (yet, or any more) is watched through its nearest existing
ancestor, as the hub does: when a directory on the way to it is made, the watch re-plans and,
once the directory itself is there, reports it as ``(Change.added, directory)`` — the
subscriber scans it for what was written before its own watch was live (Qwen Code makes
``~/.qwen/projects/<slug>/chats`` at its first record, long after the daemon started).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus
from watchfiles import Change

from qwenctxd.watch.hub import Callback, FileChange

log = structlog.get_logger("qwenctxd.watch")

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
MASK = (IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
        | IN_MOVE_SELF | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        lib.inotify_init1  # noqa: B018 - present on Linux only
    except (OSError, AttributeError):
        return None
    return lib


_LIBC = _libc()


def available() -> bool:
    """True where inotify can be used (Linux)."""
    return _LIBC is not None


def parse(buf: bytes) -> list[tuple[int, int, str]]:
    """``(wd, mask, name)`` for each event in a read of the inotify descriptor."""
    out, pos = [], 0
    while pos + _EVENT.size <= len(buf):
        wd, mask, _cookie, length = _EVENT.unpack_from(buf, pos)
        pos += _EVENT.size
        name = buf[pos:pos + length].split(b"\0", 1)[0]
        pos += length
        out.append((wd, mask, os.fsdecode(name)))
    return out


class ClosedWriteWatch:
    """One inotify descriptor over the union of the subscribers' directories."""

    def __init__(self) -> None:
        if _LIBC is None:
            raise OSError("inotify is not available here")
        self._subs: dict[str, tuple[frozenset[str], Callback]] = {}
        self._wds: dict[int, str] = {}  # watch descriptor -> directory
        self._by_dir: dict[str, int] = {}
        self._missing: frozenset[str] = frozenset()  # wanted, watched through an ancestor
        self._fd: int | None = None
        self.changes = 0
        self.overflows = 0
        self.last_error: str | None = None

    def _open(self) -> int:
        if self._fd is None:
            assert _LIBC is not None
            fd = _LIBC.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            self._fd = fd
        return self._fd

    def watch(self, key: str, dirs: Iterable[str | os.PathLike[str]], callback: Callback) -> None:
        """Subscribe ``key`` (replacing its earlier set): ``callback`` gets the changes in
        ``dirs``. A directory that does not exist yet is watched through its nearest existing
        ancestor and reported as added when it comes (see the module docstring)."""
        self._subs[key] = (frozenset(os.path.abspath(os.fspath(d)) for d in dirs), callback)
        self._sync()

    def unwatch(self, key: str) -> None:
        if self._subs.pop(key, None) is not None:
            self._sync()

    async def wait_synced(self) -> None:
        """Watches are live once added (:meth:`watch` adds them before it returns)."""

    @property
    def directories(self) -> frozenset[str]:
        return frozenset(self._by_dir)

    def _sync(self) -> None:
        """Watch every wanted directory, or its nearest existing ancestor in its stead."""
        want = frozenset().union(*(dirs for dirs, _ in self._subs.values()))
        fd = self._open()
        live: set[str] = set()
        missing: set[str] = set()
        for d in sorted(want):
            watched = self._add_nearest(fd, d)
            if watched is not None:
                live.add(watched)
            if watched != d:
                missing.add(d)
        assert _LIBC is not None
        for d in sorted(set(self._by_dir) - live):
            wd = self._by_dir.pop(d)
            self._wds.pop(wd, None)
            _LIBC.inotify_rm_watch(fd, wd)
        self._missing = frozenset(missing)

    def _add_nearest(self, fd: int, directory: str) -> str | None:
        """Add a watch on ``directory`` or, where it is not there, its nearest existing
        ancestor; the directory watched (None: an error other than not-there). A level made
        while the ancestor's watch was being added raised no event there: the walk starts
        again from ``directory`` when the next level down exists once the watch is live."""
        for _ in range(64):
            d, below = directory, None
            while d not in self._by_dir:
                if self._add(fd, d):
                    break
                err = ctypes.get_errno()
                parent = os.path.dirname(d)
                if err not in (errno.ENOENT, errno.ENOTDIR) or parent == d:
                    self.last_error = f"{d}: {os.strerror(err)}"
                    log.warning("watch.add_failed", directory=d, error=os.strerror(err))
                    return None
                d, below = parent, d
            if below is None or not os.path.isdir(below):
                return d
        return d

    def _add(self, fd: int, d: str) -> bool:
        assert _LIBC is not None
        wd = _LIBC.inotify_add_watch(fd, os.fsencode(d), MASK)
        if wd < 0:
            return False
        self._wds[wd] = d
        self._by_dir[d] = wd
        return True

    def _on_the_way(self, path: str) -> bool:
        """True if ``path`` is a missing wanted directory or one of its ancestors."""
        return any(m == path or m.startswith(path + os.sep) for m in self._missing)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Read and deliver events until cancelled."""
        fd = self._open()
        task_status.started()
        try:
            while True:
                await anyio.wait_readable(fd)
                try:
                    buf = os.read(fd, 64 * 1024)
                except BlockingIOError:
                    continue
                changes, replan = self._changes(parse(buf))
                if replan:  # a directory on the way came, or a watched one went
                    before = self._missing
                    self._sync()
                    changes.update((Change.added, d) for d in before - self._missing)
                await self._deliver(changes)
        finally:
            self._fd = None
            self._wds.clear()
            self._by_dir.clear()
            os.close(fd)

    def _changes(self, events: list[tuple[int, int, str]]) -> tuple[set[FileChange], bool]:
        """The changes in ``events``, and whether the watches must be planned again."""
        out: set[FileChange] = set()
        replan = False
        for wd, mask, name in events:
            if mask & IN_Q_OVERFLOW:
                self.overflows += 1
                out.update((Change.modified, d) for d in self._by_dir)
                replan = True
                continue
            d = self._wds.get(wd)
            if d is None:
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                out.add((Change.deleted, d))
                if mask & IN_IGNORED:  # the kernel dropped the watch: an ancestor stands in
                    self._wds.pop(wd, None)
                    if self._by_dir.get(d) == wd:
                        del self._by_dir[d]
                    replan = True
                continue
            path = str(Path(d) / name) if name else d
            if mask & (IN_CREATE | IN_MOVED_TO):
                out.add((Change.added, path))
                replan = replan or self._on_the_way(path)
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                out.add((Change.deleted, path))
            elif mask & IN_CLOSE_WRITE:
                out.add((Change.modified, path))
        return out, replan

    async def _deliver(self, changes: set[FileChange]) -> None:
        if not changes:
            return
        self.changes += len(changes)
        for dirs, callback in list(self._subs.values()):
            mine = {c for c in changes if c[1] in dirs or os.path.dirname(c[1]) in dirs}
            if mine:
                try:
                    await callback(mine)
                except Exception as exc:  # a subscriber's bug never stops the watch
                    log.error("watch.callback_failed", error=repr(exc))
