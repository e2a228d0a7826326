"""The session search index: an SQLite FTS5 cache of every transcript entry of every session file.

Layout (one file, :class:`~qwenctxd.store.sqlite.CacheDatabase`: WAL, quick_check on open, a
corrupt file set aside and rebuilt — the JSONL files are the truth)::

    files(id PK, path UNIQUE, session_id, project_slug, cwd, title, size, mtime_ns,
          offset, entries, torn, last_user, last_role, last_time)
    entries(id PK = file id << 24 | entry, file_id, entry, role, ts, time, text)
    entries_fts USING fts5(body, scope, tokenize = 'unicode61 remove_diacritics 2')
                                                              -- rowid = entries.id

``offset`` is where the next unread line of the file starts, ``entries`` how many transcript
entries the file has so far and ``last_user``/``last_role``/``last_time`` what an appended
``mid_turn_user_message`` record needs to extend the last entry, so an append is read from
``offset`` on, never from the start. ``body`` is the entry text in its search form
(:func:`qwenctxd.fts.fts_text`); ``text`` is kept as written, for snippets. An entry's id is
computed, not assigned, so a batch is written with ``executemany`` and no read-back.

``scope`` holds one token each for the entry's project directory (``p`` + a hash of the slug),
session (``s`` + the id) and role (``r`` + role): the filters are MATCH terms, so FTS5
intersects them with the words and bm25 (weight 0 on ``scope``) is computed only for entries
inside them. A query matching more than :data:`RANK_CAP` entries in its scope ranks the
``RANK_CAP`` with the highest ids (files are first indexed oldest first, so: the newest) —
such a query says little anyway, and ranking every match would cost the loop its latency.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
from collections.abc import Callable
from typing import Any

import aiosqlite
import msgspec
import structlog

from qwenctxd.store.sqlite import CacheDatabase

log = structlog.get_logger("qwenctxd.sessions.search")

SCHEMA_VERSION = 2
RANK_CAP = 2000
ENTRY_BITS = 24  # entries per file beyond 2**24 are not indexed
MAX_ENTRY = (1 << ENTRY_BITS) - 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id           INTEGER PRIMARY KEY,
    path         TEXT NOT NULL UNIQUE,
    session_id   TEXT NOT NULL,
    project_slug TEXT NOT NULL,
    cwd          TEXT,
    title        TEXT,
    size         INTEGER NOT NULL,
    mtime_ns     INTEGER NOT NULL,
    offset       INTEGER NOT NULL,
    entries      INTEGER NOT NULL,
    torn         INTEGER NOT NULL DEFAULT 0,
    last_user    TEXT,
    last_role    TEXT,
    last_time    TEXT
);
CREATE TABLE IF NOT EXISTS entries (
    id      INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL,
    entry   INTEGER NOT NULL,
    role    TEXT NOT NULL,
    ts      REAL,
    time    TEXT,
    text    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_by_file ON entries(file_id);
CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(
    body, scope, tokenize = 'unicode61 remove_diacritics 2'
);
"""


class FileState(msgspec.Struct, kw_only=True):
    """What the index holds of one file: enough to go on reading it from ``offset``."""

    id: int
    path: str
    size: int
    mtime_ns: int
    offset: int
    entries: int
    torn: int = 0
    cwd: str | None = None
    title: str | None = None
    last_user: str | None = None  # JSON of the user message the last entry shows
    last_role: str | None = None
    last_time: str | None = None


class EntryRow(msgspec.Struct, array_like=True):
    entry: int
    role: str
    ts: float | None
    time: str | None
    text: str
    body: str


class FileUpdate(msgspec.Struct, kw_only=True):
    """One file's changes, read in a worker thread and written in one transaction."""

    path: str
    gone: bool = False  # removed (or no longer a regular file): its rows go
    full: bool = False  # read from the start: the old rows go first
    session_id: str = ""
    project_slug: str = ""
    cwd: str | None = None
    title: str | None = None
    size: int = 0
    mtime_ns: int = 0
    offset: int = 0
    entries: int = 0
    torn: int = 0
    last_user: str | None = None
    last_role: str | None = None
    last_time: str | None = None
    rows: list[EntryRow] = msgspec.field(default_factory=list)
    # earlier entries whose text a mid-turn record extended: entry → (text, body)
    replaced: dict[int, tuple[str, str]] = msgspec.field(default_factory=dict)


class Filters(msgspec.Struct, kw_only=True):
    roles: list[str]
    session_id: str | None = None
    since_ts: float | None = None
    slugs: list[str] | None = None  # a project scope: these project dirs …
    under: str | None = None  # … or a recorded cwd at or below this directory


_UPSERT_FILE = """
INSERT INTO files (path, session_id, project_slug, cwd, title, size, mtime_ns, offset, entries,
                   torn, last_user, last_role, last_time)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(path) DO UPDATE SET
    session_id = excluded.session_id, project_slug = excluded.project_slug, cwd = excluded.cwd,
    title = excluded.title, size = excluded.size, mtime_ns = excluded.mtime_ns,
    offset = excluded.offset, entries = excluded.entries, torn = excluded.torn,
    last_user = excluded.last_user, last_role = excluded.last_role, last_time = excluded.last_time
"""


def _entry_id(file_id: int, entry: int) -> int:
    return (file_id << ENTRY_BITS) | entry


@functools.lru_cache(maxsize=1024)  # per indexed entry: the same few projects and sessions
def project_token(slug: str) -> str:
    return "p" + hashlib.blake2b(slug.encode(), digest_size=8).hexdigest()


@functools.lru_cache(maxsize=1024)
def session_token(session_id: str) -> str:
    return "s" + "".join(ch for ch in session_id.lower() if ch.isalnum())


def _scope(slug: str, session_id: str, role: str) -> str:
    return f"{project_token(slug)} {session_token(session_id)} r{role}"


def _any_of(tokens: list[str]) -> str:
    return "(" + " OR ".join(f'"{t}"' for t in tokens) + ")"


Reader = Callable[[list[str], dict[str, "FileState"]], tuple[list["FileUpdate"], list[str]]]
_STATE_COLS = ("id, path, size, mtime_ns, offset, entries, torn, cwd, title, last_user, "
               "last_role, last_time")
_STATE_NAMES = [c.strip() for c in _STATE_COLS.split(",")]


def _states(conn: sqlite3.Connection, paths: list[str] | None) -> dict[str, FileState]:
    if paths is None:
        rows = conn.execute(f"SELECT {_STATE_COLS} FROM files").fetchall()
    else:
        rows = []
        for i in range(0, len(paths), 500):
            part = paths[i:i + 500]
            rows.extend(conn.execute(
                f"SELECT {_STATE_COLS} FROM files WHERE path IN ({','.join('?' * len(part))})",
                part).fetchall())
    return {r[1]: FileState(**dict(zip(_STATE_NAMES, r, strict=True))) for r in rows}


def _counts(conn: sqlite3.Connection) -> tuple[int, int, int, int]:
    files, entries, torn, junk = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(entries), 0), COALESCE(SUM(torn), 0), "
        "COALESCE(SUM(entries = 0 AND torn > 0), 0) FROM files").fetchone()
    return int(files), int(entries), int(torn), int(junk)


def _apply(conn: sqlite3.Connection, updates: list[FileUpdate]) -> None:
    """The updates in one transaction (rolled back whole on an error)."""
    try:
        for u in updates:
            _apply_one(conn, u)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _apply_one(conn: sqlite3.Connection, u: FileUpdate) -> None:
    row = conn.execute("SELECT id FROM files WHERE path = ?", (u.path,)).fetchone()
    file_id = row[0] if row else None
    if file_id is not None and (u.gone or u.full):
        low, high = _entry_id(file_id, 0), _entry_id(file_id, MAX_ENTRY)
        conn.execute("DELETE FROM entries_fts WHERE rowid BETWEEN ? AND ?", (low, high))
        conn.execute("DELETE FROM entries WHERE file_id = ?", (file_id,))
    if u.gone:
        if file_id is not None:
            conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return
    conn.execute(_UPSERT_FILE, (
        u.path, u.session_id, u.project_slug, u.cwd, u.title, u.size, u.mtime_ns, u.offset,
        u.entries, u.torn, u.last_user, u.last_role, u.last_time))
    if file_id is None:
        file_id = conn.execute("SELECT id FROM files WHERE path = ?", (u.path,)).fetchone()[0]
    for entry, (text, body) in u.replaced.items():
        eid = _entry_id(file_id, entry)
        if conn.execute("UPDATE entries SET text = ? WHERE id = ?", (text, eid)).rowcount:
            conn.execute("DELETE FROM entries_fts WHERE rowid = ?", (eid,))
            conn.execute("INSERT INTO entries_fts(rowid, body, scope) VALUES (?, ?, ?)",
                         (eid, body, _scope(u.project_slug, u.session_id, "user")))
    kept = [r for r in u.rows if r.entry <= MAX_ENTRY]
    if kept:
        conn.executemany(
            "INSERT OR REPLACE INTO entries(id, file_id, entry, role, ts, time, text) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(_entry_id(file_id, r.entry), file_id, r.entry, r.role, r.ts, r.time, r.text)
             for r in kept])
        conn.executemany(
            "INSERT INTO entries_fts(rowid, body, scope) VALUES (?, ?, ?)",
            [(_entry_id(file_id, r.entry), r.body,
              _scope(u.project_slug, u.session_id, r.role)) for r in kept])


class SearchIndex(CacheDatabase):
    """The FTS5 index of transcript entries (see the module docstring)."""

    SCHEMA = _SCHEMA
    SCHEMA_VERSION = SCHEMA_VERSION
    TABLES = ("entries_fts", "entries", "files")

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("SearchIndex is not open")
        return self._db

    async def states(self, paths: list[str] | None = None) -> dict[str, FileState]:
        """``{path: FileState}`` for ``paths`` (every file when None)."""
        return await self.run(lambda conn: _states(conn, paths))

    async def apply(self, updates: list[FileUpdate]) -> None:
        """Write a batch of file updates in one transaction."""
        if not updates:
            return
        assert self._lock is not None
        async with self._lock:
            await self.run(lambda conn: _apply(conn, updates))

    async def read_and_apply(self, paths: list[str], read: Reader,
                             ) -> tuple[list[str], tuple[int, int, int, int]]:
        """One job on the database thread: the indexed states of ``paths``, ``read(paths,
        states)`` (the files from those offsets: ``(updates, paths left unread)``), the
        updates written in one transaction, and the counts after it. Returns the paths left
        and the counts. A batch of appends costs the event loop one hand-off, not one per
        statement."""
        assert self._lock is not None

        def job(conn: sqlite3.Connection) -> tuple[list[str], tuple[int, int, int, int]]:
            updates, unread = read(paths, _states(conn, paths))
            if updates:
                _apply(conn, updates)
            return unread, _counts(conn)

        async with self._lock:
            return await self.run(job)

    async def counts(self) -> tuple[int, int, int, int]:
        """(files, their transcript entries, torn lines, junk files: torn lines and no entry);
        from the ``files`` rows only, so it stays cheap however many entries there are."""
        return await self.run(_counts)

    async def scope_slugs(self, under: str) -> list[str]:
        """The project directories of the files recorded in ``under`` or below it."""
        prefix = under.rstrip("/") + "/"
        rows = await self._conn().execute_fetchall(
            "SELECT DISTINCT project_slug FROM files WHERE cwd = ? OR substr(cwd, 1, ?) = ?",
            (under, len(prefix), prefix))
        return [r[0] for r in rows]

    async def search(self, match: str, filters: Filters, limit: int) -> list[dict[str, Any]]:
        """The best ``limit`` entries for ``match`` (words: an FTS5 expression over ``body``)
        within ``filters``: bm25 first, newer first on a tie."""
        terms = [f"{{body}} : ({match})"]
        roles = sorted(set(filters.roles))
        if len(roles) == 1:  # a narrow filter: FTS5 intersects it (wider ones filter rows below)
            terms.append("{scope} : " + _any_of([f"r{roles[0]}"]))
        if filters.session_id is not None:
            terms.append("{scope} : " + _any_of([session_token(filters.session_id)]))
        if filters.slugs is not None:
            slugs = set(filters.slugs)
            if filters.under is not None:
                slugs.update(await self.scope_slugs(filters.under))
            terms.append("{scope} : " + _any_of(sorted(project_token(s) for s in slugs)))
        full = " AND ".join(terms)
        where = ["entries_fts MATCH ?"]
        args: list[Any] = [full]
        if 1 < len(roles) < 3:
            where.append(f"e.role IN ({','.join('?' * len(roles))})")
            args.extend(roles)
        if filters.session_id is not None:
            where.append("f.session_id = ?")
            args.append(filters.session_id)
        if filters.since_ts is not None:
            where.append("e.ts >= ?")
            args.append(filters.since_ts)
        db = self._conn()
        try:
            edge = await db.execute_fetchall(
                "SELECT rowid FROM entries_fts WHERE entries_fts MATCH ? "
                "ORDER BY rowid DESC LIMIT 1 OFFSET ?", (full, RANK_CAP))
            if edge:
                where.append("entries_fts.rowid >= ?")
                args.append(edge[0][0])
            sql = (
                "SELECT f.session_id, f.cwd, f.title, e.entry, e.role, e.time, e.text, "
                "bm25(entries_fts, 1.0, 0.0) AS rank FROM entries_fts "
                "JOIN entries e ON e.id = entries_fts.rowid JOIN files f ON f.id = e.file_id "
                f"WHERE {' AND '.join(where)} ORDER BY rank, e.ts DESC LIMIT ?"
            )
            args.append(limit)
            rows = await db.execute_fetchall(sql, args)
        except sqlite3.OperationalError as exc:  # a MATCH the engine refuses: no hit, not -32603
            if "fts5" in str(exc) or "syntax" in str(exc):
                log.warning("search match refused", error=str(exc), match=match[:200])
                return []
            raise
        keys = ("session_id", "cwd", "title", "entry", "role", "time", "text", "rank")
        return [dict(zip(keys, r, strict=True)) for r in rows]
