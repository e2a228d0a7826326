"""SessionStore: every record of a live session passes ``recorded``, the fsync is paced there
(never by the writer itself), titles and deletes of recorded sessions reach file and index."""

from __future__ import annotations

import uuid
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
    tasks = TaskRegistry()
    store = SessionStore(index_path=tmp_path / "sessions.sqlite", tasks=tasks)
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await store.start()
        s = live_session(store, tmp_path / "proj")
        store.record(s, {"role": "user", "content": "q"})
        store.close_writer(s)
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
        tasks.close()
        await store.aclose()
        tg.cancel_scope.cancel()

