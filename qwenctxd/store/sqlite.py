"""A rebuildable SQLite cache database opened with aiosqlite.

Our SQLite files (the session index, the memory FTS index) are caches of files on disk: WAL
mode, ``synchronous=NORMAL``, a 5 s busy timeout, a ``quick_check`` on open, and a schema
version in ``user_version`` — an unknown layout is dropped and recreated. A file that is not a
database (or fails the check) is moved aside as ``<name>.corrupt-<ts>`` with its -wal/-shm
files and rebuilt; a locked or unreadable file is an error, never moved.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import aiosqlite
import anyio

T = TypeVar("T")
#: each thread's read-only connections (:meth:`CacheDatabase.read_now`), by file
_readers = threading.local()


class CacheDatabase:
    SCHEMA: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1
    TABLES: ClassVar[tuple[str, ...]] = ()  # dropped (in this order) on a schema change
    ROW_FACTORY: ClassVar[Any] = None

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.db_path = Path(db_path)
        self.set_aside: Path | None = None  # where a corrupt DB was moved, if open() did that
        self._db: aiosqlite.Connection | None = None
        self._lock: anyio.Lock | None = None
        self._opening: anyio.Event | None = None  # set once an open() begun has finished
        self._closed = False  # close() was called: a late open() must not leave a connection

    async def __aenter__(self) -> Any:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open (rebuilding a corrupt file). Not cancellable once begun: aiosqlite's worker
        thread is not a daemon thread, so a connection abandoned half-open would keep the
        process from exiting; a cancellation lands right after, with the database open (and
        :meth:`close` waits for an open in progress). After :meth:`close` it raises
        :class:`anyio.ClosedResourceError`: a loader that starts late during shutdown must not
        open a connection nobody will close."""
        if self._closed:
            raise anyio.ClosedResourceError(f"{self.db_path.name} is closed")
        if self._db is not None:
            return
        self._lock = anyio.Lock(fast_acquire=True)  # the writes' order; no loop trip uncontended
        self._opening = opening = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(
                    lambda: self.db_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                )
                try:
                    self._db = await self._connect()
                except sqlite3.OperationalError:
                    raise  # locked, unreadable, …: not corruption — never move it aside
                except sqlite3.DatabaseError:
                    self.set_aside = await anyio.to_thread.run_sync(self._move_aside)
                    self._db = await self._connect()
        finally:
            opening.set()

    async def close(self) -> None:
        self._closed = True
        if self._opening is not None:
            with anyio.CancelScope(shield=True):
                await self._opening.wait()
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in the connection's own thread, as one job: a batch of statements
        (and its commit) costs one hand-off between the event loop and the database thread
        instead of one per statement — each hand-off wakes a thread and passes the GIL, which
        under a busy loop costs more than the statement (issue 28: the daemon's per-turn index
        upkeep). aiosqlite queues every call on that thread this way (``Connection._execute``,
        what its ``execute*`` are built on); ``fn`` must not block on the event loop."""
        db = self._db
        if db is None:
            raise RuntimeError(f"{self.db_path.name} is not open")
        return await db._execute(lambda: fn(db._conn))  # noqa: SLF001 — see the docstring

    def read_now(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any] | None:
        """Rows of a read ``sql``, run in the calling thread (a worker thread's job) on a
        read-only connection that thread keeps for this file: a WAL reader never waits for the
        writer, so the read is not queued behind the writes on the database thread (issue 28:
        ``session.open``'s lookup). None when the file cannot be read (a best-effort read: the
        caller has another way)."""
        if self._db is None:
            return None
        try:
            st = os.stat(self.db_path)
            key = (str(self.db_path), st.st_dev, st.st_ino)  # a rebuilt file is another one
            conns: dict[tuple[str, int, int], sqlite3.Connection] | None = getattr(
                _readers, "conns", None)
            if conns is None:
                conns = _readers.conns = {}
            conn = conns.get(key)
            if conn is None:
                uri = "file:" + urllib.parse.quote(str(self.db_path)) + "?mode=ro"
                conn = conns[key] = sqlite3.connect(uri, uri=True, timeout=1.0)
            return conn.execute(sql, params).fetchall()
        except (OSError, sqlite3.Error):
            return None

    async def _connect(self) -> aiosqlite.Connection:
        db = await aiosqlite.connect(self.db_path)
        try:
            await db.execute("PRAGMA busy_timeout = 5000")
            (check,) = (await db.execute_fetchall("PRAGMA quick_check"))[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check failed: {check}")
            await db.execute("PRAGMA journal_mode = WAL")
            await db.execute("PRAGMA synchronous = NORMAL")
            (version,) = (await db.execute_fetchall("PRAGMA user_version"))[0]
            if version != self.SCHEMA_VERSION:  # a cache: an unknown layout is simply rebuilt
                for table in self.TABLES:
                    await db.execute(f"DROP TABLE IF EXISTS {table}")
                await db.executescript(self.SCHEMA)
                await db.execute(f"PRAGMA user_version = {self.SCHEMA_VERSION}")
                await db.commit()
            if self.ROW_FACTORY is not None:
                db.row_factory = self.ROW_FACTORY
        except BaseException:
            await db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        ts = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns() % 10**9:09d}"
        dest = self.db_path.with_name(f"{self.db_path.name}.corrupt-{ts}")
        os.replace(self.db_path, dest)
        for suffix in ("-wal", "-shm", "-journal"):
            side = self.db_path.with_name(self.db_path.name + suffix)
            if side.exists():
                os.replace(side, dest.with_name(dest.name + suffix))
        return dest
