"""SessionStore: how sessions are persisted — the one owner of their JSONL writers, the fsync
policy and the session index.

Each session records to ``~/.qwen/projects/<slug>/chats/<uuid>.jsonl`` (Qwen Code's ChatRecord
field names, :mod:`qwenctxd.sessions.jsonl_writer`); a small SQLite index
(:mod:`qwenctxd.sessions.index`) serves ``session.list`` without parsing every file and is
re-synced from the files at start. The fsync policy lives here alone: a live session's writer
never fsyncs on the turn path; :meth:`SessionStore.recorded` paces a background fsync job (at
most one a second per session) and closing a writer fsyncs it. Every record written for a live
session passes :meth:`SessionStore.recorded` — the one place a later consumer of records (a
full-text index) hooks in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd import __version__
from qwenctxd.paths import runtime_base_dir
from qwenctxd.protocol import errors
from qwenctxd.sessions import jsonl_writer, records, shared_file
from qwenctxd.sessions.index import SessionIndex, size_mtime
from qwenctxd.sessions.state import Session
from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.sessions")
TOUCH_COALESCE_S = 0.5  # index touches close together are written in one batch
FSYNC_INTERVAL_S = 1.0  # a live session's transcript is fsynced at most this often


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class OpenedFiles:
    """A session's files as :meth:`SessionStore.open_files` found or made them."""

    path: Path
    state: records.ResumeState | None  # the recorded history, when the file existed
    writer: jsonl_writer.JsonlWriter
    holders: list[shared_file.Holder]


class SessionStore:
    """The transcripts and the index of the daemon's sessions."""

    def __init__(self, *, index_path: Path, tasks: TaskRegistry,
                 record_hooks: Sequence[Callable[[Path], None]] = ()) -> None:
        self.index = SessionIndex(index_path)
        self.tasks = tasks
        self.record_hooks = tuple(record_hooks)  # told each file a record was appended to
        self._last_fsync: dict[str, float] = {}  # session id → monotonic time of its last job
        #: per project, the sessions whose index rows wait for the next batched touch
        self._touches: dict[str, dict[str, Session]] = {}
        self._unindexed: set[str] = set()  # sessions opened whose row the next batch writes

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.index.open()
        if self.tasks.accepting:
            self.tasks.submit("index-sync", self.sync_index, description="sync session index")

    async def sync_index(self) -> None:
        """Re-read the index rows of files changed since (sessions Qwen Code recorded too)."""
        await self.index.sync(runtime_base_dir() / "projects")

    async def aclose(self) -> None:
        await self.index.close()

    # -- a live session's transcript -----------------------------------------------------------
    @staticmethod
    def writer_for(path: Path) -> jsonl_writer.JsonlWriter:
        """The appender of a live session: it never fsyncs by itself (``recorded`` paces the
        background fsync; ``close_writer`` fsyncs), and a new file's directory entry is made
        durable by that first background fsync too — not on session.open's path."""
        return jsonl_writer.JsonlWriter(path, fsync="interval", fsync_interval=float("inf"),
                                        defer_dir_sync=True)

    async def open_files(self, session_id: str, cwd: Path, path: Path, *, find: bool,
                         must_exist: bool, qwen_home: Path) -> OpenedFiles | None:
        """What a ``session.open`` needs from the disk, as one worker-thread job (each hand-off
        to a thread wakes it and passes the GIL: under 32 conversations opening at once they
        were most of an open's cost): with ``find``, the recorded file of ``session_id``
        (:meth:`find`) and its resumed state; the appender of that file, or of a new one at
        ``path``; the running Qwen Code processes that registered the session. None when
        ``must_exist`` and no file was found (no file is made then). The job is not abandoned
        on cancellation: its writer holds an open descriptor (the caller closes it)."""
        def job() -> OpenedFiles | None:
            # the index's path is read in this thread: queued behind the index's batch
            # writes on the database thread, that lookup was the slowest part of a slow open
            # (issue 28)
            found = _locate(session_id, cwd, lambda: self.index.path_now(session_id)) \
                if find else None
            if found is None and must_exist:
                return None
            state = records.resume(found) if found is not None else None
            # the file's creation off the event loop: an O_CREAT waits on the filesystem
            # journal while other sessions' fsyncs commit it
            writer = self.writer_for(found or path)
            try:
                held = shared_file.holders(qwen_home, session_id)
            except BaseException:
                writer.close()
                raise
            return OpenedFiles(found or path, state, writer, held)

        with anyio.CancelScope(shield=True):  # a cancelled open must not drop an open fd
            return await anyio.to_thread.run_sync(job)

    def resumed(self, s: Session, messages: list[dict[str, Any]]) -> None:
        """``s`` continues a recorded history: its writer learns the tool calls in it."""
        s.writer.remember_tool_calls(messages)

    def record(self, s: Session, msg: dict[str, Any], *, usage: dict[str, int] | None = None,
               subtype: str | None = None, payload: dict[str, Any] | None = None) -> None:
        """Append one ChatRecord for ``msg`` (or a system record) to the session's JSONL."""
        role = msg.get("role") if msg else None
        rtype = {"user": "user", "assistant": "assistant", "tool": "tool_result"}.get(
            role or "", "system")
        rec = records.ChatRecord(
            uuid=records.record_uuid(), parentUuid=None, sessionId=s.id, timestamp=iso(time.time()),
            type=rtype if payload is None else "system", subtype=subtype, cwd=str(s.cwd),
            version=__version__, message=msg if payload is None else None, usage=usage,
            model=s.model if rtype == "assistant" else None, systemPayload=payload,
            contextWindowSize=s.options.window_tokens if payload is not None else None,
        )
        try:
            s.writer.append(rec)
        except OSError as exc:
            log.error("session record write failed", session=s.id, error=exc.strerror)
            return
        self.recorded(s, rec)

    def record_title(self, s: Session, title: str, *, source: str) -> None:
        """Set ``s.title`` and record it (a ``custom_title`` record)."""
        s.title = title
        self.record(s, {}, subtype=records.SUBTYPE_TITLE,
                    payload={"customTitle": title, "titleSource": source})

    def recorded(self, s: Session, rec: records.ChatRecord) -> None:
        """Every record written for a live session passes here: the fsync policy (a background
        job at most every :data:`FSYNC_INTERVAL_S`, never on the turn path) and the record
        hooks (session search reads the file on from where it stopped)."""
        for hook in self.record_hooks:
            hook(s.path)
        now = time.monotonic()
        if now - self._last_fsync.get(s.id, 0.0) >= FSYNC_INTERVAL_S and self.tasks.accepting:
            self._last_fsync[s.id] = now
            writer = s.writer
            self.tasks.submit("jsonl-flush", lambda: anyio.to_thread.run_sync(_fsync, writer),
                              key=f"jsonl-flush:{s.id}", project=str(s.project.anchor))

    def close_writer(self, s: Session) -> None:
        """Close (and so fsync) ``s``'s transcript."""
        s.writer.close()
        self._last_fsync.pop(s.id, None)

    # -- the index ------------------------------------------------------------------------------
    async def upsert(self, s: Session) -> None:
        """Write ``s``'s whole index row."""
        size, mtime_ns = size_mtime(s.path)
        summary = records.SessionSummary(
            session_id=s.id, path=str(s.path), cwd=str(s.cwd), started_at=iso(s.started_at),
            updated_at=iso(s.updated_at), messages=len(s.history.messages), title=s.title,
            size=size, mtime_ns=mtime_ns)
        await self.index.upsert(summary, project=str(s.project.anchor))

    def schedule_touch(self, s: Session, *, new: bool = False) -> None:
        """Refresh ``s``'s index row (time, size, messages, title) in a background job; with
        ``new``, write its whole row there (a session just opened: ``session.open`` does not
        wait for the database, and ``session.list`` finds the file by its scan meanwhile). The
        touches of a project's sessions are batched: one job writes every row touched since the
        last one, in one transaction (32 concurrent conversations: one commit instead of one
        per turn, the aiosqlite thread being the daemon's busiest under that load). The job
        first waits for :data:`TOUCH_COALESCE_S` without touches (at most that long; a drain
        hurries it): a batch begun at once held the one or two rows touched before it ran."""
        if not self.tasks.accepting:
            return
        project = str(s.project.anchor)
        pending = self._touches.setdefault(project, {})
        self.tasks.quiet.touch(f"index-touches:{project}")
        if not pending:  # the first since the last batch took its rows: one job for them all
            self.tasks.submit("index", lambda: self._write_touches(project),
                              key=f"index-touches:{project}", project=project)
        pending[s.id] = s
        if new:
            self._unindexed.add(s.id)

    async def _write_touches(self, project: str) -> None:
        await self.tasks.quiet.wait(f"index-touches:{project}", TOUCH_COALESCE_S,
                                    TOUCH_COALESCE_S)
        batch = list(self._touches.pop(project, {}).values())
        if not batch:
            return
        new = [s for s in batch if s.id in self._unindexed]
        fresh = {s.id for s in new}
        self._unindexed -= fresh
        await self.index.write_sessions(
            [(records.SessionSummary(
                session_id=s.id, path=str(s.path), cwd=str(s.cwd), started_at=iso(s.started_at),
                updated_at=iso(s.updated_at), messages=len(s.history.messages), title=s.title),
              str(s.project.anchor)) for s in new],
            [(s.id, iso(s.updated_at), len(s.history.messages), s.title, str(s.path))
             for s in batch if s.id not in fresh])

    async def rows(self, project: str | None) -> list[dict[str, Any]]:
        """The index rows (of ``project``'s sessions, or all), after a re-sync from the files."""
        await self.sync_index()
        return await self.index.list(project=project)

    # -- recorded sessions ----------------------------------------------------------------------
    async def find(self, session_id: str, cwd: Path) -> Path | None:
        """The JSONL of ``session_id``: under cwd's project dir, in any project's chats dir,
        or where the index says."""
        row = await self.index.get(session_id)
        hint = Path(row["path"]) if row and row.get("path") else None
        return await anyio.to_thread.run_sync(_locate, session_id, cwd, lambda: hint)

    async def delete(self, session_id: str, path: Path | None) -> bool:
        """Remove ``session_id``'s file (``path``, else found) and its index row; whether a
        file was removed."""
        for pending in self._touches.values():  # a batch still to come must not bring it back
            pending.pop(session_id, None)
        self._unindexed.discard(session_id)
        if path is None:
            row = await self.index.get(session_id)
            path = Path(row["path"]) if row and row.get("path") else None
        if path is None:
            path = await self.find(session_id, Path("/"))
        deleted = False
        if path is not None:
            try:
                path.unlink()
                deleted = True
            except FileNotFoundError:
                pass
        await self.index.delete(session_id)
        return deleted

    async def title_recorded(self, session_id: str, title: str) -> None:
        """Append the user's title to a session that is not open (SessionNotFound without a
        file), fsynced, and re-index it."""
        path = await self.find(session_id, Path("/"))
        if path is None:
            raise errors.SessionNotFound(f"unknown session {session_id}",
                                         data={"session_id": session_id})

        def append() -> records.SessionSummary:
            writer = jsonl_writer.JsonlWriter(path, session_id=session_id, version=__version__,
                                              fsync="always")
            try:
                writer.append_title(title, source="manual")
            finally:
                writer.close()
            return records.scan_summary(path)

        summary = await anyio.to_thread.run_sync(append)
        await self.index.upsert(summary, project=None)


def _fsync(writer: jsonl_writer.JsonlWriter) -> None:
    try:
        writer.sync()
    except (OSError, ValueError):  # closed meanwhile: close() fsynced it
        pass


def _locate(session_id: str, cwd: Path, indexed: Callable[[], Path | None]) -> Path | None:
    """The JSONL of ``session_id``: under cwd's project dir, where the index says
    (``indexed()``, one read of its table: a session may be continued from another
    directory), or, for a file the index has not seen yet, in any project's chats dir."""
    direct = records.session_path(cwd, session_id)
    if direct.exists():
        return direct
    hint = indexed()
    if hint is not None and hint.exists():
        return hint
    projects = runtime_base_dir() / "projects"
    try:
        slugs = os.listdir(projects)
    except FileNotFoundError:
        slugs = []
    name = f"{session_id}.jsonl"
    for slug in slugs:
        cand = os.path.join(projects, slug, "chats", name)
        if os.path.exists(cand):
            return Path(cand)
    return None
