"""The vector cache: one SQLite file per project beside the lexical index.

A row is one text's vector under one model: ``(model, sha, vec)`` where ``sha`` is a 16-byte
BLAKE2b of the (redacted) text and ``vec`` its float32 bytes. Keyed by content, an unchanged
field is never embedded twice, an edited one misses and is embedded again, and a model change
(a new id) misses everything once: the rebuild is just the misses. ``prune`` drops the rows no
current document needs (removed memories, old models). A row whose size does not match its
model's dimension counts as missing; a file that is not a database is set aside and rebuilt
(:class:`~qwenctxd.store.sqlite.CacheDatabase`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import Any

from qwenctxd.memory.semantic.blas import numpy_module
from qwenctxd.store.sqlite import CacheDatabase

READ_CHUNK = 512  # rows per fetch when loading a model's vectors
_SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    model TEXT NOT NULL,
    sha BLOB NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY (model, sha)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS models (
    model TEXT PRIMARY KEY,
    dim INTEGER NOT NULL,
    built_at REAL NOT NULL
);
"""


def text_sha(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class VectorCache(CacheDatabase):
    SCHEMA = _SCHEMA
    SCHEMA_VERSION = 1
    TABLES = ("vectors", "models")

    async def read_into(self, model: str, dim: int, row_of: dict[bytes, int], out: Any) -> set[int]:
        """Copy the cached vectors of the shas in ``row_of`` into their rows of ``out`` (an
        ``(n, dim)`` float32 array) and return those rows; wrong-sized rows are left out.
        Read in chunks straight into ``out``: a 10 000-memory project's vectors are never all
        held as Python bytes at once (whose freed heap the process would keep)."""
        np = numpy_module()

        db = self._conn()
        size = dim * 4
        found: set[int] = set()
        assert self._lock is not None
        async with self._lock:
            async with db.execute("SELECT sha, vec FROM vectors WHERE model = ?",
                                  (model,)) as cur:
                while rows := await cur.fetchmany(READ_CHUNK):
                    for sha, vec in rows:
                        row = row_of.get(bytes(sha))
                        if row is not None and len(vec) == size:
                            out[row] = np.frombuffer(vec, dtype=np.float32)
                            found.add(row)
        return found

    async def put_many(self, model: str, dim: int, rows: Iterable[tuple[bytes, bytes]]) -> None:
        db = self._conn()
        assert self._lock is not None
        async with self._lock:
            await db.executemany(
                "INSERT OR REPLACE INTO vectors(model, sha, vec) VALUES (?, ?, ?)",
                [(model, sha, vec) for sha, vec in rows])
            await db.execute(
                "INSERT OR REPLACE INTO models(model, dim, built_at) VALUES (?, ?, ?)",
                (model, dim, time.time()))
            await db.commit()

    async def prune(self, keep: dict[str, set[bytes]]) -> int:
        """Delete every row whose model is not in ``keep`` or whose sha it does not list."""
        db = self._conn()
        assert self._lock is not None
        async with self._lock:
            rows = await db.execute_fetchall("SELECT model, sha FROM vectors")
            stale = [(m, s) for m, s in rows if bytes(s) not in keep.get(m, ())]
            if stale:
                await db.executemany("DELETE FROM vectors WHERE model = ? AND sha = ?", stale)
            await db.execute(
                f"DELETE FROM models WHERE model NOT IN ({','.join('?' * len(keep)) or 'NULL'})",
                tuple(keep))
            await db.commit()
        return len(stale)

    async def built_at(self, model: str) -> float | None:
        db = self._conn()
        rows = await db.execute_fetchall("SELECT built_at FROM models WHERE model = ?", (model,))
        return float(rows[0][0]) if rows else None

    def _conn(self):  # type: ignore[no-untyped-def]
        if self._db is None:
            raise RuntimeError("VectorCache is not open")
        return self._db
