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
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
        ``dirs``. A directory that does not exist yet is skipped (its parent's watch sees it
        come; the subscriber watches it then)."""
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
        want = frozenset().union(*(dirs for dirs, _ in self._subs.values()))
        assert _LIBC is not None
        fd = self._open()
        for d in sorted(set(self._by_dir) - want):
            wd = self._by_dir.pop(d)
            self._wds.pop(wd, None)
            _LIBC.inotify_rm_watch(fd, wd)
        for d in sorted(want - set(self._by_dir)):
            wd = _LIBC.inotify_add_watch(fd, os.fsencode(d), MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err not in (2, 20):  # ENOENT, ENOTDIR: not there (yet)
                    self.last_error = f"{d}: {os.strerror(err)}"
                    log.warning("watch.add_failed", directory=d, error=os.strerror(err))
                continue
            self._wds[wd] = d
            self._by_dir[d] = wd

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
                await self._deliver(self._changes(parse(buf)))
        finally:
            self._fd = None
            self._wds.clear()
            self._by_dir.clear()
            os.close(fd)

    def _changes(self, events: list[tuple[int, int, str]]) -> set[FileChange]:
        out: set[FileChange] = set()
        for wd, mask, name in events:
            if mask & IN_Q_OVERFLOW:
                self.overflows += 1
                out.update((Change.modified, d) for d in self._by_dir)
                continue
            d = self._wds.get(wd)
            if d is None:
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                out.add((Change.deleted, d))
                if mask & IN_IGNORED:  # the kernel dropped the watch: it may be added again
                    self._wds.pop(wd, None)
                    if self._by_dir.get(d) == wd:
                        del self._by_dir[d]
                continue
            path = str(Path(d) / name) if name else d
            if mask & (IN_CREATE | IN_MOVED_TO):
                out.add((Change.added, path))
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                out.add((Change.deleted, path))
            elif mask & IN_CLOSE_WRITE:
                out.add((Change.modified, path))
        return out

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
