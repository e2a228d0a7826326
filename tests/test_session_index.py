"""The SQLite session index: sync with the JSONL files, list/get/touch/delete, corrupt DB rebuilt."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from qwenctxd.paths import project_slug
from qwenctxd.sessions import records as rec
from qwenctxd.sessions.index import SessionIndex, default_projects_root
from qwenctxd.sessions.jsonl_writer import JsonlWriter
from qwenctxd.sessions.records import ChatRecord, scan_summary

IDS = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(1, 7)]


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QWEN_RUNTIME_DIR", str(tmp_path / "qwen"))
    return tmp_path / "qwen" / "projects"


def make_session(project: Path, sid: str, stamps: list[str], *, title: str | None = None) -> Path:
    path = rec.session_path(project, sid)
    with JsonlWriter(path, cwd=str(project), fsync="never") as w:
        for i, ts in enumerate(stamps):
            role = "user" if i % 2 == 0 else "assistant"
            w.append(ChatRecord(type=role, timestamp=ts,
                                message={"role": role, "content": f"m{i}"}))
        if title:
            w.append(ChatRecord(type="system", subtype="custom_title", timestamp=stamps[-1],
                                systemPayload={"customTitle": title}))
    return path


def ts(minute: int) -> str:
    return f"2025-03-01T10:{minute:02d}:00.000Z"


@pytest.fixture
def world(tmp_path: Path, runtime: Path) -> dict[str, Path]:
    a, b = tmp_path / "work" / "alpha", tmp_path / "work" / "beta"
    paths = {
        IDS[0]: make_session(a, IDS[0], [ts(1), ts(2)], title="first alpha"),
        IDS[1]: make_session(a, IDS[1], [ts(5), ts(6), ts(7)]),
        IDS[2]: make_session(b, IDS[2], [ts(3)]),
    }
    (runtime / project_slug(b) / "chats" / "notes.jsonl").write_text("{}\n")  # not a session
    (runtime / project_slug(b) / "chats" / f"{IDS[5]}.jsonl.tmp").write_text("")
    (runtime / "stray-file").write_text("")
    return {"alpha": a, "beta": b, **paths}


@pytest.mark.asyncio
async def test_sync_builds_rows_and_lists_newest_first(tmp_path: Path, runtime: Path,
                                                       world: dict[str, Path]) -> None:
    assert default_projects_root() == runtime
    async with SessionIndex(tmp_path / "state" / "sessions.sqlite") as idx:
        stats = await idx.sync(runtime)
        assert (stats.files, stats.scanned, stats.deleted) == (3, 3, 0)
        rows = await idx.list()
        assert [r["session_id"] for r in rows] == [IDS[1], IDS[2], IDS[0]]
        first = await idx.get(IDS[0])
        assert first is not None
        assert first["project"] == str(world["alpha"]) == first["cwd"]
        assert first["project_slug"] == project_slug(world["alpha"])
        assert first["path"] == str(world[IDS[0]])
        assert (first["started_at"], first["updated_at"]) == (ts(1), ts(2))
        assert (first["messages"], first["title"]) == (2, "first alpha")
        assert first["size"] == world[IDS[0]].stat().st_size
        alpha = await idx.list(project=str(world["alpha"]))
        assert [r["session_id"] for r in alpha] == [IDS[1], IDS[0]]
        assert [r["session_id"] for r in await idx.list(project_slug(world["beta"]))] == [IDS[2]]
        assert len(await idx.list(limit=1)) == 1
        # nothing changed → nothing rescanned
        assert (await idx.sync(runtime)).scanned == 0
        assert await idx.get("nope") is None


@pytest.mark.asyncio
async def test_sync_refreshes_stale_rows_and_drops_vanished(tmp_path: Path, runtime: Path,
                                                            world: dict[str, Path]) -> None:
    async with SessionIndex(tmp_path / "s.sqlite") as idx:
        await idx.sync(runtime)
        with JsonlWriter(world[IDS[0]], fsync="never") as w:
            w.append(ChatRecord(type="user", timestamp=ts(30),
                                message={"role": "user", "content": "later"}))
        world[IDS[2]].unlink()
        new = make_session(world["beta"], IDS[3], [ts(20)])
        stats = await idx.sync(runtime)
        assert (stats.files, stats.scanned, stats.deleted) == (3, 2, 1)
        row = await idx.get(IDS[0])
        assert row is not None
        assert (row["updated_at"], row["messages"]) == (ts(30), 3)
        assert row["size"] == world[IDS[0]].stat().st_size
        assert await idx.get(IDS[2]) is None
        assert [r["session_id"] for r in await idx.list()] == [IDS[0], IDS[3], IDS[1]]
        assert (await idx.get(IDS[3]) or {})["path"] == str(new)


@pytest.mark.asyncio
async def test_sync_with_no_projects_dir(tmp_path: Path) -> None:
    async with SessionIndex(tmp_path / "s.sqlite") as idx:
        assert (await idx.sync(tmp_path / "missing")).files == 0
        assert await idx.list() == []


@pytest.mark.asyncio
async def test_upsert_touch_delete_get(tmp_path: Path, runtime: Path) -> None:
    project = tmp_path / "work" / "gamma"
    path = make_session(project, IDS[4], [ts(1)])
    async with SessionIndex(tmp_path / "s.sqlite") as idx:
        await idx.upsert(scan_summary(path), project=str(project))
        row = await idx.get(IDS[4])
        assert row is not None and row["project"] == str(project) and row["messages"] == 1
        assert await idx.touch(IDS[4], updated_at=ts(9), messages=7, size=123, mtime_ns=456)
        row = await idx.get(IDS[4])
        assert row is not None
        assert (row["updated_at"], row["messages"], row["size"], row["mtime_ns"]) == (
            ts(9), 7, 123, 456)
        assert not await idx.touch(IDS[5], updated_at=ts(9), messages=1, size=1, mtime_ns=1)
        # a summary with no path: the index derives it from the project
        await idx.upsert(rec.SessionSummary(session_id=IDS[5], cwd=str(project),
                                            updated_at=ts(2)), project=str(project))
        other = await idx.get(IDS[5])
        assert other is not None
        assert other["path"] == str(rec.session_path(project, IDS[5]))
        assert other["project_slug"] == project_slug(project)
        # the stale touch is repaired by the next sync (size/mtime differ from the file)
        await idx.sync(runtime)
        row = await idx.get(IDS[4])
        assert row is not None and row["messages"] == 1 and row["project"] == str(project)
        assert await idx.get(IDS[5]) is None  # its file never existed
        assert await idx.delete(IDS[4])
        assert not await idx.delete(IDS[4])
        assert await idx.get(IDS[4]) is None


@pytest.mark.asyncio
async def test_project_kept_when_cwd_is_a_subdirectory(tmp_path: Path, runtime: Path) -> None:
    project = tmp_path / "work" / "delta"
    path = rec.session_path(project, IDS[0])
    with JsonlWriter(path, cwd=str(project / "src"), fsync="never") as w:
        w.append(ChatRecord(type="user", message={"role": "user", "content": "x"}))
    async with SessionIndex(tmp_path / "s.sqlite") as idx:
        await idx.sync(runtime)
        row = await idx.get(IDS[0])
        assert row is not None and row["project"] is None and row["cwd"] == str(project / "src")
        await idx.upsert(scan_summary(path), project=str(project))
        with JsonlWriter(path, fsync="never") as w:
            w.append(ChatRecord(type="user", message={"role": "user", "content": "y"}))
        await idx.sync(runtime)
        row = await idx.get(IDS[0])
        assert row is not None and row["project"] == str(project) and row["messages"] == 2


@pytest.mark.asyncio
async def test_corrupt_db_is_set_aside_and_rebuilt(tmp_path: Path, runtime: Path,
                                                   world: dict[str, Path]) -> None:
    db = tmp_path / "state" / "sessions.sqlite"
    db.parent.mkdir()
    db.write_bytes(b"this is not a sqlite database at all" * 200)
    idx = SessionIndex(db)
    await idx.open()
    try:
        assert idx.set_aside is not None and idx.set_aside.exists()
        assert idx.set_aside.name.startswith("sessions.sqlite.corrupt-")
        assert idx.set_aside.read_bytes().startswith(b"this is not")
        assert (await idx.sync(runtime)).scanned == 3
        assert len(await idx.list()) == 3
    finally:
        await idx.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 3
    conn.close()
    # a healthy DB is reopened as is
    async with SessionIndex(db) as again:
        assert again.set_aside is None
        assert len(await again.list()) == 3


@pytest.mark.asyncio
async def test_missing_db_is_rebuilt_by_sync(tmp_path: Path, runtime: Path,
                                             world: dict[str, Path]) -> None:
    db = tmp_path / "s.sqlite"
    async with SessionIndex(db) as idx:
        await idx.sync(runtime)
    for name in os.listdir(tmp_path):
        if name.startswith("s.sqlite"):
            os.unlink(tmp_path / name)
    async with SessionIndex(db) as idx:
        assert await idx.list() == []
        assert (await idx.sync(runtime)).scanned == 3
        assert len(await idx.list()) == 3


@pytest.mark.asyncio
async def test_closed_index_refuses(tmp_path: Path) -> None:
    idx = SessionIndex(tmp_path / "s.sqlite")
    with pytest.raises(RuntimeError):
        await idx.list()
    await idx.close()  # closing an unopened index is fine


@pytest.mark.asyncio
async def test_a_closed_index_is_never_reopened(tmp_path: Path) -> None:
    """close() is final: an open() that starts after it (a loader late in shutdown) raises
    instead of leaving a connection, whose worker thread would keep the daemon alive."""
    idx = SessionIndex(tmp_path / "s.sqlite")
    await idx.open()
    await idx.close()
    with pytest.raises(anyio.ClosedResourceError):
        await idx.open()
    late = SessionIndex(tmp_path / "t.sqlite")
    await late.close()
    with pytest.raises(anyio.ClosedResourceError):
        await late.open()
    assert not (tmp_path / "t.sqlite").exists()


@pytest.mark.asyncio
async def test_a_touch_batch_reads_each_files_size_and_mtime_in_one_transaction(
        tmp_path: Path, runtime: Path, world: dict[str, Path]) -> None:
    """A project's batch of per-turn touches: each row takes its file's real size and mtime,
    a row no longer indexed is skipped, and a file that is gone reads as size 0."""
    async with SessionIndex(tmp_path / "s.sqlite") as idx:
        await idx.sync(runtime)
        with JsonlWriter(world[IDS[1]], fsync="never") as w:  # the file grew since the sync
            w.append(ChatRecord(type="user", message={"role": "user", "content": "more"}))
        os.unlink(world[IDS[2]])
        await idx.write_sessions([], [
            (IDS[1], ts(30), 4, "grown", str(world[IDS[1]])),
            (IDS[2], ts(31), 1, None, str(world[IDS[2]])),
            (IDS[4], ts(32), 1, None, str(tmp_path / "never-indexed.jsonl")),
        ])
        grown = await idx.get(IDS[1])
        gone = await idx.get(IDS[2])
        st = os.stat(world[IDS[1]])
        assert grown is not None and gone is not None
        assert (grown["updated_at"], grown["messages"], grown["title"]) == (ts(30), 4, "grown")
        assert (grown["size"], grown["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
        assert (gone["size"], gone["mtime_ns"], gone["title"]) == (0, 0, None)
        assert await idx.get(IDS[4]) is None


@pytest.mark.asyncio
async def test_a_worker_thread_reads_a_path_while_a_write_is_open(tmp_path: Path,
                                                                  runtime: Path) -> None:
    """``path_now`` reads on a read-only connection of the calling thread: a write
    transaction held on the database thread does not hold it up, a rebuilt file is read
    anew, and a closed index answers None."""
    project = tmp_path / "work" / "delta"
    path = make_session(project, IDS[0], [ts(1)])
    async with SessionIndex(tmp_path / "s.sqlite") as idx:
        await idx.upsert(scan_summary(path), project=str(project))
        started, release = threading.Event(), threading.Event()

        def hold(conn: sqlite3.Connection) -> None:  # on the database thread
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE sessions SET title = 'x'")
            started.set()
            release.wait(10)
            conn.rollback()

        async with anyio.create_task_group() as tg:
            tg.start_soon(idx.run, hold)
            assert await anyio.to_thread.run_sync(started.wait, 10)
            with anyio.fail_after(5):  # the writer still holds its transaction
                found = await anyio.to_thread.run_sync(idx.path_now, IDS[0])
            release.set()
        assert found == path
        assert await anyio.to_thread.run_sync(idx.path_now, IDS[1]) is None
        assert await idx.delete(IDS[0])
        assert await anyio.to_thread.run_sync(idx.path_now, IDS[0]) is None
    assert idx.path_now(IDS[0]) is None  # closed
