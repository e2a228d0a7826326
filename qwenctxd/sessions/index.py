"""A small SQLite index of session JSONL files, so ``session.list`` never parses every file.

The JSONL files are the truth; the index is a cache kept in step with them: the daemon
:meth:`~SessionIndex.upsert`\\s / :meth:`~SessionIndex.touch`\\es rows as it writes, and
:meth:`~SessionIndex.sync` reconciles with ``<projects_root>/<slug>/chats/<uuid>.jsonl`` on disk
(rescanning only files whose size or mtime changed, dropping rows whose file vanished). A DB
file that is not a SQLite database is set aside (``<name>.corrupt-<ts>``) and rebuilt.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.to_thread
import msgspec

from qwenctxd.paths import SESSION_FILE_RE, project_slug, runtime_base_dir, state_dir
from qwenctxd.sessions.records import SessionSummary, scan_summary, session_path
from qwenctxd.store.sqlite import CacheDatabase

SCHEMA_VERSION = 1
COLUMNS = (
    "session_id",
    "project_slug",
    "project",
    "cwd",
    "path",
    "started_at",
    "updated_at",
    "messages",
    "title",
    "size",
    "mtime_ns",
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id   TEXT PRIMARY KEY,
    project_slug TEXT NOT NULL,
    project      TEXT,
    cwd          TEXT,
    path         TEXT NOT NULL,
    started_at   TEXT,
    updated_at   TEXT,
    messages     INTEGER NOT NULL DEFAULT 0,
    title        TEXT,
    size         INTEGER NOT NULL DEFAULT 0,
    mtime_ns     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sessions_by_project ON sessions(project_slug, updated_at);
CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions(updated_at);
"""
_UPSERT = f"""
INSERT INTO sessions ({", ".join(COLUMNS)}) VALUES ({", ".join("?" * len(COLUMNS))})
ON CONFLICT(session_id) DO UPDATE SET
    project_slug = excluded.project_slug,
    project = COALESCE(excluded.project, sessions.project),
    cwd = excluded.cwd, path = excluded.path, started_at = excluded.started_at,
    updated_at = excluded.updated_at, messages = excluded.messages, title = excluded.title,
    size = excluded.size, mtime_ns = excluded.mtime_ns
"""
_TOUCH = ("UPDATE sessions SET updated_at = ?, messages = ?, size = ?, mtime_ns = ?, "
          "title = COALESCE(?, title) WHERE session_id = ?")
_ORDER = "ORDER BY updated_at IS NULL, updated_at DESC, mtime_ns DESC"


def default_db_path() -> Path:
    """``$XDG_STATE_HOME/qwenctxd/sessions.sqlite``."""
    return state_dir() / "sessions.sqlite"


def default_projects_root() -> Path:
    """``<runtime base>/projects`` — the directory :meth:`SessionIndex.sync` walks."""
    return runtime_base_dir() / "projects"


class SyncStats(msgspec.Struct):
    files: int = 0  # session files found on disk
    scanned: int = 0  # files rescanned and upserted (new or changed)
    deleted: int = 0  # rows dropped because their file is gone


class _Found(msgspec.Struct):
    slug: str
    path: str
    size: int
    mtime_ns: int


def _discover(root: Path) -> dict[str, _Found]:
    """``{session_id: _Found}`` for every ``<root>/<slug>/chats/<uuid>.jsonl`` regular file."""
    found: dict[str, _Found] = {}
    try:
        slugs = os.scandir(root)
    except (FileNotFoundError, NotADirectoryError):
        return found
    with slugs:
        for slug in slugs:
            try:
                chats = os.scandir(os.path.join(slug.path, "chats"))
            except OSError:
                continue
            with chats:
                for entry in chats:
                    if not SESSION_FILE_RE.match(entry.name):
                        continue
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    sid = entry.name[: -len(".jsonl")]
                    prev = found.get(sid)  # the same id in two projects: the newest file wins
                    if prev is None or st.st_mtime_ns > prev.mtime_ns:
                        found[sid] = _Found(slug.name, entry.path, st.st_size, st.st_mtime_ns)
    return found


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]


def _slug_of(path: str, project: str | None) -> str:
    p = Path(path)
    if p.parent.name == "chats" and p.parent.parent.name:
        return p.parent.parent.name
    return project_slug(project) if project else ""


def _row(summary: SessionSummary, project: str | None) -> tuple[Any, ...]:
    path = summary.path
    if not path and project:
        path = str(session_path(project, summary.session_id))
    slug = _slug_of(path, project)
    if project is None and summary.cwd and project_slug(summary.cwd) == slug:
        project = summary.cwd
    return (
        summary.session_id,
        slug,
        project,
        summary.cwd,
        path,
        summary.started_at,
        summary.updated_at,
        summary.messages,
        summary.title,
        summary.size,
        summary.mtime_ns,
    )


class SessionIndex(CacheDatabase):
    """``sessions(session_id PK, project_slug, project, cwd, path, started_at, updated_at,
    messages, title, size, mtime_ns)`` in one SQLite file (WAL, synchronous=NORMAL)."""

    SCHEMA = _SCHEMA
    SCHEMA_VERSION = SCHEMA_VERSION
    TABLES = ("sessions",)
    ROW_FACTORY = sqlite3.Row

    async def upsert(self, summary: SessionSummary, *, project: str | None) -> None:
        """Insert or replace one row; ``project=None`` keeps a project already recorded."""
        await self._write_many(_UPSERT, [_row(summary, project)])

    async def touch(
        self, session_id: str, *, updated_at: str | None, messages: int, size: int, mtime_ns: int,
        title: str | None = None,
    ) -> bool:
        """The cheap per-turn update (``title`` only when given); ``False`` if no such row."""
        db = self._conn()
        assert self._lock is not None
        async with self._lock:
            cur = await db.execute(
                "UPDATE sessions SET updated_at = ?, messages = ?, size = ?, mtime_ns = ?, "
                "title = COALESCE(?, title) WHERE session_id = ?",
                (updated_at, messages, size, mtime_ns, title, session_id),
            )
            await db.commit()
            return cur.rowcount > 0

    async def touch_many(
        self, rows: Sequence[tuple[str, str | None, int, int, int, str | None]],
    ) -> None:
        """:meth:`touch` for many sessions in one transaction: ``(session_id, updated_at,
        messages, size, mtime_ns, title)`` each; rows no longer indexed are skipped."""
        if rows:
            await self._write_many(_TOUCH, [(updated, messages, size, mtime, title, sid)
                                            for sid, updated, messages, size, mtime, title in rows])

    async def write_sessions(self, new: Sequence[tuple[SessionSummary, str | None]],
                             touched: Sequence[tuple[str, str | None, int, str | None, str]],
                             ) -> None:
        """One job on the database thread, one transaction: the whole rows of sessions not
        indexed yet (``(summary, project)``; as :meth:`upsert`) and the touches of the others
        (``(session_id, updated_at, messages, title, path)``; as :meth:`touch_many`), every
        file's size and mtime read in the same job: a project's batch is one hand-off."""
        if not new and not touched:
            return
        assert self._lock is not None

        def job(conn: sqlite3.Connection) -> None:
            try:
                if new:
                    conn.executemany(_UPSERT, [
                        _row(msgspec.structs.replace(summary, size=size, mtime_ns=mtime),
                             project)
                        for summary, project in new
                        for size, mtime in (size_mtime(summary.path),)])
                if touched:
                    conn.executemany(_TOUCH, [
                        (updated, messages, *size_mtime(path), title, sid)
                        for sid, updated, messages, title, path in touched])
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

        async with self._lock:
            await self.run(job)

    async def delete(self, session_id: str) -> bool:
        db = self._conn()
        assert self._lock is not None
        async with self._lock:
            cur = await db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            await db.commit()
            return cur.rowcount > 0

    async def list(self, project: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        """Rows newest ``updated_at`` first; ``project`` (a path or a slug) filters by slug."""
        db = self._conn()
        if project is None:
            sql, args = f"SELECT * FROM sessions {_ORDER} LIMIT ?", (limit,)
        else:
            sql = f"SELECT * FROM sessions WHERE project_slug = ? {_ORDER} LIMIT ?"
            args = (project_slug(project), limit)
        rows = await db.execute_fetchall(sql, args)
        return [dict(r) for r in rows]

    async def get(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._conn().execute_fetchall(
            "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
        )
        return dict(rows[0]) if rows else None

    def path_now(self, session_id: str) -> Path | None:
        """The recorded file of ``session_id`` as the index has it, read in the calling worker
        thread (:meth:`read_now`: not queued behind the index's writes); None without a row."""
        rows = self.read_now("SELECT path FROM sessions WHERE session_id = ?", (session_id,))
        return Path(rows[0][0]) if rows and rows[0][0] else None

    async def sync(self, projects_root: str | os.PathLike[str]) -> SyncStats:
        """Make the index match the session files under ``projects_root`` (see module doc)."""
        db = self._conn()
        root = Path(projects_root)
        found = await anyio.to_thread.run_sync(_discover, root)
        rows = await db.execute_fetchall("SELECT session_id, path, size, mtime_ns FROM sessions")
        known = {r[0]: (r[1], r[2], r[3]) for r in rows}
        stats = SyncStats(files=len(found))
        upserts: list[tuple[Any, ...]] = []
        vanished: set[str] = set()
        for sid, f in found.items():
            if known.get(sid) == (f.path, f.size, f.mtime_ns):
                continue
            try:
                summary = await anyio.to_thread.run_sync(scan_summary, f.path)
            except FileNotFoundError:
                vanished.add(sid)  # deleted since discovery: its row (if any) goes below
                continue
            upserts.append(_row(summary, None))
        gone = [sid for sid in known if sid not in found or sid in vanished]
        outside = [known[sid][0] for sid in gone if not _under(known[sid][0], root)]
        if outside:  # rows from another root: keep them while their file exists
            still = set(outside) - set(await anyio.to_thread.run_sync(_missing, outside))
            gone = [sid for sid in gone if known[sid][0] not in still]
        stats.scanned, stats.deleted = len(upserts), len(gone)
        if upserts or gone:
            assert self._lock is not None
            async with self._lock:
                if upserts:
                    await db.executemany(_UPSERT, upserts)
                if gone:
                    await db.executemany(
                        "DELETE FROM sessions WHERE session_id = ?", [(s,) for s in gone]
                    )
                await db.commit()
        return stats

    # -- internals --------------------------------------------------------------------------------

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("SessionIndex is not open")
        return self._db

    async def _write_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """``sql`` over ``rows`` and the commit, as one job on the database thread."""
        assert self._lock is not None

        def job(conn: sqlite3.Connection) -> None:
            try:
                conn.executemany(sql, rows)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

        async with self._lock:
            await self.run(job)


def size_mtime(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(size, mtime_ns)`` of ``path``; ``(0, 0)`` when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return 0, 0
    return st.st_size, st.st_mtime_ns


def _under(path: str, root: Path) -> bool:
    try:
        return Path(path).is_relative_to(root)
    except ValueError:
        return False
