"""SessionStore: every record of a live session passes ``recorded``, the fsync is paced there
(never by the writer itself), titles and deletes of recorded sessions reach file and index."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from qwenctxd.config import ConfigStore
from qwenctxd.project import Project
from qwenctxd.protocol import errors
from qwenctxd.sessions import records
from qwenctxd.sessions.state import Session, SessionOptions
from qwenctxd.sessions.store import SessionStore
from qwenctxd.tasks import TaskRegistry


class WatchedStore(SessionStore):
    """The store, noting each record ``recorded`` sees."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.seen: list[records.ChatRecord] = []

    def recorded(self, s: Session, rec: records.ChatRecord) -> None:
        self.seen.append(rec)
        super().recorded(s, rec)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QWEN_RUNTIME_DIR", str(tmp_path / "qwen"))
    return tmp_path / "qwen"


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[tuple[SessionStore, TaskRegistry]]:
    """A started store over a task registry that runs its jobs, closed on the way out."""
    tasks = TaskRegistry()
    store = SessionStore(index_path=tmp_path / "sessions.sqlite", tasks=tasks)
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await store.start()
        try:
            yield store, tasks
        finally:
            tasks.close()
            await store.aclose()
            tg.cancel_scope.cancel()


def recorded(store: SessionStore, cwd: Path, text: str) -> Session:
    """A session with one user record, its writer closed."""
    s = live_session(store, cwd)
    store.record(s, {"role": "user", "content": text})
    store.close_writer(s)
    return s


def live_session(store: SessionStore, cwd: Path) -> Session:
    sid = str(uuid.uuid4())
    path = records.session_path(cwd, sid)
    opts = SessionOptions(window_tokens=100_000, auto_compact_threshold=0.7, tools=[])
    project = Project(root=None, anchor=cwd, home=cwd, qwen_home=cwd / ".qwen",
                      config=ConfigStore(home=cwd, xdg_config=cwd))
    return Session(id=sid, cwd=cwd, project=project, model="m", options=opts, env={},
                   path=path, writer=store.writer_for(path))


@pytest.mark.asyncio
async def test_every_record_passes_recorded_and_one_fsync_job_per_interval(
        tmp_path: Path, runtime: Path) -> None:
    tasks = TaskRegistry()
    started: list[str] = []
    tasks.add_listener(lambda r: started.append(r.kind) if r.finished_at is None else None)
    store = WatchedStore(index_path=tmp_path / "sessions.sqlite", tasks=tasks)
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await store.start()
        s = live_session(store, tmp_path)
        assert s.writer.fsync_policy == "interval" and s.writer.fsync_interval == float("inf")
        store.record(s, {"role": "user", "content": "hello"})
        store.record(s, {"role": "assistant", "content": "hi"}, usage={"prompt_tokens": 5,
                                                                       "completion_tokens": 1})
        store.record_title(s, "Greetings", source="manual")
        assert [r.type for r in store.seen] == ["user", "assistant", "system"]
        assert store.seen[2].subtype == records.SUBTYPE_TITLE and s.title == "Greetings"
        assert await tasks.drain(5.0)
        # three records well inside one interval: one background fsync, none on the turn path
        assert started.count("jsonl-flush") == 1
        store.close_writer(s)
        await store.upsert(s)
        row = await store.index.get(s.id)
        assert row is not None and row["title"] == "Greetings" and row["messages"] == 0
        tasks.close()
        await store.aclose()
        tg.cancel_scope.cancel()
    summary = records.scan_summary(s.path)
    assert summary.title == "Greetings" and summary.messages == 2


@pytest.mark.asyncio
async def test_recorded_session_titled_found_and_deleted(tmp_path: Path, runtime: Path) -> None:
    async with running(tmp_path) as (store, _tasks):
        s = recorded(store, tmp_path / "proj", "q")
        # found from another directory too (the index row, else any project's chats dir)
        assert await store.find(s.id, Path("/")) == s.path
        await store.title_recorded(s.id, "Later title")
        row = await store.index.get(s.id)
        assert row is not None and row["title"] == "Later title"
        assert records.scan_summary(s.path).title == "Later title"
        assert await store.delete(s.id, None) is True
        assert not s.path.exists() and await store.index.get(s.id) is None
        with pytest.raises(errors.SessionNotFound):
            await store.title_recorded(s.id, "gone")



@pytest.mark.asyncio
async def test_open_finds_a_file_only_the_index_knows_and_creates_new_ones(
        tmp_path: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index's path is asked beside the open's disk job: a session recorded under an
    earlier runtime directory (which no scan of the current one finds) still resumes, and a
    new id gets its new file."""
    async with running(tmp_path) as (store, _tasks):
        s = recorded(store, tmp_path / "proj", "remembered question")
        await store.upsert(s)
        monkeypatch.setenv("QWEN_RUNTIME_DIR", str(tmp_path / "moved"))  # scans look elsewhere
        cwd = tmp_path / "proj"
        opened = await store.open_files(s.id, cwd, records.session_path(cwd, s.id), find=True,
                                        must_exist=True, qwen_home=cwd / ".qwen")
        assert opened is not None and opened.path == s.path
        assert opened.state is not None and "remembered question" in str(opened.state.messages)
        opened.writer.close()
        fresh = str(uuid.uuid4())
        new_path = records.session_path(cwd, fresh)
        assert await store.open_files(fresh, cwd, new_path, find=True, must_exist=True,
                                      qwen_home=cwd / ".qwen") is None
        assert not new_path.exists()
        created = await store.open_files(fresh, cwd, new_path, find=True, must_exist=False,
                                         qwen_home=cwd / ".qwen")
        assert created is not None and created.path == new_path and created.state is None
        created.writer.close()
        assert new_path.exists()


@pytest.mark.asyncio
async def test_index_touches_close_together_are_one_batch(tmp_path: Path, runtime: Path) -> None:
    """Turns completed within TOUCH_COALESCE_S of each other refresh their index rows in one
    batch (one transaction), and a drain does not wait the coalescing out."""
    batches: list[int] = []
    async with running(tmp_path) as (store, tasks):
        real = store.index.write_sessions

        async def counting(new: list, touched: list) -> None:  # type: ignore[type-arg]
            batches.append(len(new) + len(touched))
            await real(new, touched)

        store.index.write_sessions = counting  # type: ignore[method-assign]
        sessions = [live_session(store, tmp_path / "proj") for _ in range(5)]
        for s in sessions:
            store.record(s, {"role": "user", "content": "q"})
            store.schedule_touch(s, new=True)
            await anyio.sleep(0.05)  # sleep-ok: touches 50 ms apart, inside the window
        with anyio.fail_after(5):
            assert await tasks.drain(5)
        assert batches == [5]
        for s in sessions:
            row = await store.index.get(s.id)
            assert row is not None and row["messages"] == 0
            store.close_writer(s)
