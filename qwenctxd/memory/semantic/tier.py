"""The semantic tier of recall: memory fields as vectors, queries ranked by cosine.

Each memory contributes up to three texts — its name, its description and the start of its
body — each embedded on its own (a short name is not drowned by a long body); a memory's
similarity to a query is the best of its fields. Texts are redacted before they are embedded
(an endpoint is a way out like any other) and their vectors cached by content hash
(:mod:`~qwenctxd.memory.semantic.vectors`), so a re-sync embeds only what changed.

Per embedder, the vectors of the current documents sit in one int8 matrix with a scale per
row (:mod:`~qwenctxd.memory.semantic.int8`), rows grouped by document: a query is one
matrix-vector product (SimSIMD's integer kernels) and a segmented max
(``np.maximum.reduceat``). Brute force is fine here — 10 000 memories are 30 000 rows of 512,
15 MB and under a millisecond a query; past ~100 000 memories (or on a slow disk for the
cache load) an approximate index (HNSW) would be the next step.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import structlog

from qwenctxd.memory.outbound import OUTBOUND
from qwenctxd.memory.semantic import int8
from qwenctxd.memory.semantic.blas import numpy_module
from qwenctxd.memory.semantic.process import EmbedderUnavailable
from qwenctxd.memory.semantic.vectors import VectorCache, text_sha

log = structlog.get_logger("qwenctxd.memory.semantic")
BODY_CHARS = 400
BATCH = 48  # texts per worker request while building (each a short pause for the loop)


class Doc(Protocol):
    path: Any
    name: str
    description: str
    body: str


class Embedder(Protocol):
    """What the tier needs of an embedder (packaged, endpoint, local)."""

    key: str  # short name used in results: "usem3", "e5", "endpoint", ...
    source: str  # "packaged" | "endpoint" | "local"

    async def describe(self) -> tuple[str, int]: ...  # (model id, dimension), cached
    #: ``background``: a query nobody waits for (a turn's prefetch): the embedder may run it
    #: below the daemon's priority
    async def embed(self, texts: list[str], *, query: bool, background: bool = False) -> Any: ...


#: a query's cosine with the memories' centroid is read only over this many memories (over a
#: few, the centroid is those few and says nothing about the query's subject)
CENTROID_MIN_DOCS = 30


def field_texts(doc: Doc) -> list[str]:
    """The texts embedded for ``doc`` (redacted, non-empty, distinct, in field order)."""
    body = " ".join(doc.body.split())[:BODY_CHARS]
    out: list[str] = []
    for raw in (doc.name, doc.description, body):
        text = " ".join(OUTBOUND.text(raw or "", escape=False).split())
        if text and text not in out:
            out.append(text)
    return out


@dataclass
class _Matrix:
    model: str
    paths: list[str]
    matrix: Any  # (rows, dim) int8, rows grouped by document (:mod:`.int8`)
    scales: Any  # (rows,) float32: row r is matrix[r] * scales[r]
    starts: Any  # (len(paths),) first row of each document
    #: the mean of the rows, L2-normalised (None under CENTROID_MIN_DOCS documents): a query's
    #: cosine with it says whether the query is about what these memories are about at all
    centroid: Any = None


def release_freed_heap() -> None:
    """Give the heap a build freed back to the system (glibc keeps it otherwise: the texts,
    hashes and replies of a 10 000-memory build are tens of MB the daemon would hold)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _centroid(vectors: Any) -> Any:
    np = numpy_module()
    c = vectors.mean(axis=0, dtype=np.float64)
    norm = float(np.linalg.norm(c))
    return (c / norm).astype(np.float32) if norm > 0 else None


def _similarities(m: _Matrix, q: Any) -> Any:
    """Each document's best field cosine with ``q`` (rows are L2-normalised)."""
    np = numpy_module()
    return np.maximum.reduceat(int8.dots(m.matrix, m.scales, q), m.starts)


@dataclass
class TierState:
    """What :meth:`SemanticIndex.status` reports per embedder."""

    model: str | None = None
    vectors: int = 0
    built_at: float | None = None
    error: str | None = None
    build_ms: float = 0.0


@dataclass
class SemanticIndex:
    """One project's vectors, for every configured embedder."""

    cache: VectorCache
    embedders: Sequence[Embedder]
    generation: int = -1  # the documents' generation the matrices were built for
    _matrices: dict[str, _Matrix] = field(default_factory=dict)
    states: dict[str, TierState] = field(default_factory=dict)
    _lock: anyio.Lock = field(default_factory=anyio.Lock)

    def current(self, generation: int) -> bool:
        return self.generation == generation

    async def sync(self, docs: Sequence[Doc], generation: int) -> None:
        """Vectors for every field of ``docs`` under every embedder that answers; an
        embedder that fails keeps no matrix (its tier reports the error)."""
        async with self._lock:
            if self.generation == generation:
                return
            texts = [(str(d.path), field_texts(d)) for d in docs]
            keep: dict[str, set[bytes]] = {}
            for emb in self.embedders:
                state = self.states.setdefault(emb.key, TierState())
                started = time.monotonic()
                try:
                    model, dim = await emb.describe()
                    matrix = await self._build(emb, model, dim, texts)
                except EmbedderUnavailable as exc:
                    state.error = str(exc)
                    self._matrices.pop(emb.key, None)
                    log.warning("semantic tier unavailable", embedder=emb.key, error=str(exc))
                    continue
                keep[model] = {text_sha(t) for _, ts in texts for t in ts}
                self._matrices[emb.key] = matrix
                state.model, state.error = model, None
                state.vectors = int(matrix.matrix.shape[0])
                state.build_ms = round((time.monotonic() - started) * 1000, 1)
                state.built_at = await self.cache.built_at(model)
            if keep:
                await self.cache.prune(keep)
            self.generation = generation
            del texts, keep
            await anyio.to_thread.run_sync(release_freed_heap)

    async def _build(self, emb: Embedder, model: str, dim: int,
                     texts: list[tuple[str, list[str]]]) -> _Matrix:
        """The matrix of ``texts`` under ``emb``: cached vectors and newly embedded ones go
        straight into one preallocated float32 array (10 000 memories: one 60 MB array, not
        30 000 bytes objects and a joined copy, whose freed heap the daemon would keep), which
        is quantised to int8 and dropped: the daemon keeps 15 MB."""
        np = numpy_module()

        unique = list(dict.fromkeys(t for _, ts in texts for t in ts))
        shas = [text_sha(t) for t in unique]
        row_of = {s: i for i, s in enumerate(shas)}
        vectors = np.zeros((len(unique), dim), dtype=np.float32)
        found = await self.cache.read_into(model, dim, row_of, vectors)
        missing = [i for i in range(len(unique)) if i not in found]
        # the cache writes one batch behind the worker: it embeds the next batch meanwhile
        send, receive = anyio.create_memory_object_stream[list[tuple[str, bytes]]](1)

        async def write_behind() -> None:
            async with receive:
                async for rows in receive:
                    await self.cache.put_many(model, dim, rows)

        async with anyio.create_task_group() as tg:
            tg.start_soon(write_behind)
            async with send:
                for start in range(0, len(missing), BATCH):
                    chunk = missing[start:start + BATCH]
                    vecs = np.asarray(await emb.embed([unique[i] for i in chunk], query=False),
                                      dtype=np.float32).reshape(len(chunk), dim)
                    vectors[chunk] = vecs
                    await send.send([(shas[i], vecs[j].tobytes()) for j, i in enumerate(chunk)])
        paths: list[str] = []
        starts: list[int] = []
        order: list[int] = []
        for path, ts in texts:
            if not ts:
                continue
            paths.append(path)
            starts.append(len(order))
            order.extend(row_of[text_sha(t)] for t in ts)
        rows, scales = (await anyio.to_thread.run_sync(int8.quantise, vectors)
                        if len(unique) > 2000 else int8.quantise(vectors))
        centroid = None
        if len(paths) >= CENTROID_MIN_DOCS:
            centroid = (await anyio.to_thread.run_sync(_centroid, vectors)
                        if len(unique) > 2000 else _centroid(vectors))
        del vectors
        if order != list(range(len(unique))):  # a text shared by memories: one row each
            take = np.asarray(order, dtype=np.int64)
            rows, scales = rows.take(take, axis=0), scales.take(take)
        return _Matrix(model, paths, rows, scales, np.asarray(starts, dtype=np.int64), centroid)

    async def rank(self, query: str, *, limit: int, exclude: set[str] | None = None,
                   related: dict[str, float] | None = None, background: bool = False,
                   ) -> tuple[dict[str, list[tuple[str, float]]], dict[str, str]]:
        """Per embedder with vectors: (path, cosine) best first, at most ``limit``; and per
        embedder that failed to embed the query, why (the others still answer). ``related``
        gets, per embedder with a centroid, the query's cosine with it."""
        np = numpy_module()

        out: dict[str, list[tuple[str, float]]] = {}
        failed: dict[str, str] = {}
        text = " ".join(OUTBOUND.text(query, escape=False).split())
        for emb in self.embedders:
            m = self._matrices.get(emb.key)
            if m is None or not m.paths:
                continue
            try:
                q = (await emb.embed([text], query=True, background=background))[0]
            except EmbedderUnavailable as exc:
                failed[emb.key] = str(exc)
                continue
            # off the event loop: memory-bound (the whole matrix is read), numpy drops the GIL
            sims = await anyio.to_thread.run_sync(_similarities, m, q)
            if related is not None and m.centroid is not None:
                related[emb.key] = float(m.centroid @ q)
            n = min(len(sims), limit + len(exclude or ()))
            top = np.argpartition(-sims, n - 1)[:n] if n < len(sims) else np.arange(len(sims))
            ranked = sorted(((m.paths[i], float(sims[i])) for i in top), key=lambda x: -x[1])
            if exclude:
                ranked = [r for r in ranked if r[0] not in exclude]
            out[emb.key] = ranked[:limit]
        return out, failed
