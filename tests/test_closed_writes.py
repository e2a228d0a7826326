"""ClosedWriteWatch (watch/closed_writes.py): real inotify over real directories."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from watchfiles import Change

from qwenctxd.testing.wait import until_async
from qwenctxd.watch import closed_writes
from qwenctxd.watch.closed_writes import ClosedWriteWatch
from qwenctxd.watch.hub import FileChange

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Seen:
    def __init__(self) -> None:
        self.changes: set[FileChange] = set()
        self.event = anyio.Event()

    async def __call__(self, changes: set[FileChange]) -> None:
        self.changes |= changes
        self.event.set()

    async def expect(self, *want: FileChange) -> None:
        with anyio.fail_after(5):
            while not set(want) <= self.changes:
                self.event = anyio.Event()
                await self.event.wait()

    def clear(self) -> None:
        self.changes.clear()


async def test_a_file_written_and_closed_created_removed_and_moved_is_reported(
        tmp_path: Path) -> None:
    assert closed_writes.available()
    d = tmp_path / "chats"
    d.mkdir()
    w, seen = ClosedWriteWatch(), Seen()
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.watch("k", [d], seen)
        f = d / "s.jsonl"
        with f.open("ab") as fh:  # appendFile: open, write, close
            fh.write(b'{"a":1}\n')
        await seen.expect((Change.added, str(f)), (Change.modified, str(f)))
        seen.clear()
        f.rename(d / "t.jsonl")
        await seen.expect((Change.deleted, str(f)), (Change.added, str(d / "t.jsonl")))
        seen.clear()
        (d / "t.jsonl").unlink()
        await seen.expect((Change.deleted, str(d / "t.jsonl")))
        tg.cancel_scope.cancel()


async def test_appends_on_a_descriptor_kept_open_raise_nothing_until_it_closes(
        tmp_path: Path) -> None:
    """The daemon's own writer keeps its session file open: its appends cost no event."""
    d = tmp_path / "chats"
    d.mkdir()
    f = d / "ours.jsonl"
    f.write_bytes(b"")
    w, seen = ClosedWriteWatch(), Seen()
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.watch("k", [d], seen)
        fd = os.open(f, os.O_WRONLY | os.O_APPEND)
        for i in range(200):
            os.write(fd, b'{"n":%d}\n' % i)
        # a marker file closed after those appends: once it is reported, they would have been
        other = d / "marker"
        other.write_bytes(b"x")
        await seen.expect((Change.modified, str(other)))
        assert not any(p == str(f) for _, p in seen.changes), seen.changes
        os.close(fd)
        await seen.expect((Change.modified, str(f)))
        tg.cancel_scope.cancel()


async def test_a_removed_directory_is_reported_and_watched_again_when_made_again(
        tmp_path: Path) -> None:
    d = tmp_path / "chats"
    d.mkdir()
    w, seen = ClosedWriteWatch(), Seen()
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.watch("k", [d], seen)
        d.rmdir()
        await seen.expect((Change.deleted, str(d)))
        await until_async(lambda: str(d) not in w.directories, timeout=5,
                          what="the kernel's IN_IGNORED to drop the watch")
        d.mkdir()
        w.watch("k", [d], seen)  # the subscriber re-registers after its rescan
        seen.clear()
        (d / "again.jsonl").write_bytes(b"{}\n")
        await seen.expect((Change.modified, str(d / "again.jsonl")))
        # unwatched: nothing more is delivered (a marker in a still-watched directory, written
        # after, arrives first)
        w.unwatch("k")
        other, marker = tmp_path / "other", Seen()
        other.mkdir()
        w.watch("m", [other], marker)
        seen.clear()
        (d / "later.jsonl").write_bytes(b"{}\n")
        (other / "marker").write_bytes(b"x")
        await marker.expect((Change.modified, str(other / "marker")))
        assert seen.changes == set()
        tg.cancel_scope.cancel()


async def test_a_subscriber_gets_only_its_directories(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    w, sa, sb = ClosedWriteWatch(), Seen(), Seen()
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.watch("a", [a], sa)
        w.watch("b", [b], sb)
        assert w.directories == {str(a), str(b)}
        (a / "x").write_bytes(b"1")
        (b / "y").write_bytes(b"1")
        (tmp_path / "beside").write_bytes(b"1")
        await sa.expect((Change.modified, str(a / "x")))
        await sb.expect((Change.modified, str(b / "y")))
        assert all(p.startswith(str(a)) for _, p in sa.changes)
        assert all(p.startswith(str(b)) for _, p in sb.changes)
        tg.cancel_scope.cancel()


async def test_a_missing_directory_is_watched_through_an_ancestor_until_it_comes(
        tmp_path: Path) -> None:
    """Qwen Code makes ``projects/<slug>/chats`` at its first record, long after the watch
    began: each level made moves the watch down, and the directory is reported once there."""
    chats = tmp_path / "qwen" / "projects" / "slug" / "chats"
    w, seen = ClosedWriteWatch(), Seen()
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.watch("k", [chats], seen)
        assert w.directories == {str(tmp_path)}
        (tmp_path / "unrelated").write_bytes(b"x")  # the ancestor's own files are not reported
        (tmp_path / "qwen").mkdir()
        await until_async(lambda: w.directories == {str(tmp_path / "qwen")}, timeout=5,
                          what="the watch to move down a level")
        chats.mkdir(parents=True)
        f = chats / "s.jsonl"
        f.write_bytes(b"{}\n")
        await seen.expect((Change.added, str(chats)))
        await until_async(lambda: w.directories == {str(chats)}, timeout=5,
                          what="the directory itself watched")
        (chats / "t.jsonl").write_bytes(b"{}\n")
        await seen.expect((Change.modified, str(chats / "t.jsonl")))
        assert not any("unrelated" in p for _, p in seen.changes), seen.changes
        # gone again: its ancestor stands in, and its coming back is reported
        for x in chats.iterdir():
            x.unlink()
        chats.rmdir()
        await seen.expect((Change.deleted, str(chats)))
        await until_async(lambda: w.directories == {str(chats.parent)}, timeout=5,
                          what="the parent standing in")
        seen.clear()
        chats.mkdir()
        await seen.expect((Change.added, str(chats)))
        tg.cancel_scope.cancel()


def test_parse_reads_events_and_their_padded_names() -> None:
    import struct
    name = b"s.jsonl\0\0\0\0\0\0\0\0\0"
    buf = struct.pack("iIII", 3, closed_writes.IN_CLOSE_WRITE, 0, len(name)) + name
    buf += struct.pack("iIII", 4, closed_writes.IN_DELETE_SELF, 0, 0)
    assert closed_writes.parse(buf) == [(3, closed_writes.IN_CLOSE_WRITE, "s.jsonl"),
                                        (4, closed_writes.IN_DELETE_SELF, "")]
