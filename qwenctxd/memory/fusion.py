"""Fusing recall's ranked lists (lexical BM25, one semantic list per embedder) into one order.

Two ways, both measured on bench/recall_devset (docs/benchmarks.md): reciprocal rank fusion
(``Σ w / (k + rank)``, scale-free: BM25 and cosine never have to agree on units) and a blend of
calibrated scores (cosine as it is, BM25 squashed to 0..1 by its top score). Every fused entry
keeps what each tier said of it, for ``memory.recall``'s ``why`` and ``qwenctl memory recall
--explain``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

RRF_K = 60.0
#: per-tier weights; a list's weight is its key's, "semantic:*" lists default to SEMANTIC
LEXICAL_WEIGHT = 1.0
SEMANTIC_WEIGHT = 1.0


@dataclass
class Fused:
    path: str
    score: float
    lexical_rank: int | None = None  # 1-based
    lexical_score: float | None = None
    semantic: float | None = None  # the best cosine over the embedders that ranked it
    ranks: dict[str, int] = field(default_factory=dict)  # tier -> 1-based rank


def rrf(lexical: Sequence[tuple[str, float]], semantic: Mapping[str, Sequence[tuple[str, float]]],
        *, k: float = RRF_K, weights: Mapping[str, float] | None = None) -> list[Fused]:
    """Reciprocal rank fusion of the lexical list and each embedder's list."""
    w = dict(weights or {})
    entries: dict[str, Fused] = {}

    def entry(path: str) -> Fused:
        e = entries.get(path)
        if e is None:
            e = entries[path] = Fused(path=path, score=0.0)
        return e

    lw = w.get("lexical", LEXICAL_WEIGHT)
    for i, (path, score) in enumerate(lexical):
        e = entry(path)
        e.lexical_rank, e.lexical_score = i + 1, score
        e.ranks["lexical"] = i + 1
        e.score += lw / (k + i + 1)
    for name, ranked in semantic.items():
        sw = w.get(name, SEMANTIC_WEIGHT)
        for i, (path, cos) in enumerate(ranked):
            e = entry(path)
            e.ranks[name] = i + 1
            e.semantic = cos if e.semantic is None else max(e.semantic, cos)
            e.score += sw / (k + i + 1)
    return sorted(entries.values(), key=lambda e: (-e.score, e.lexical_rank or 10**9))


def blend(lexical: Sequence[tuple[str, float]],
          semantic: Mapping[str, Sequence[tuple[str, float]]], *,
          weights: Mapping[str, float] | None = None) -> list[Fused]:
    """A weighted sum of calibrated scores: each embedder's cosine, and BM25 divided by the
    query's best BM25 (so the top lexical hit scores 1); a tier that did not list a document
    contributes its list's lowest score."""
    w = dict(weights or {})
    entries: dict[str, Fused] = {}
    top = max((s for _, s in lexical), default=0.0)
    lex = {p: (s / top if top > 0 else 0.0) for p, s in lexical}
    lex_floor = min(lex.values(), default=0.0)
    for i, (path, score) in enumerate(lexical):
        entries[path] = Fused(path=path, score=0.0, lexical_rank=i + 1, lexical_score=score,
                              ranks={"lexical": i + 1})
    for name, ranked in semantic.items():
        for i, (path, cos) in enumerate(ranked):
            e = entries.setdefault(path, Fused(path=path, score=0.0))
            e.ranks[name] = i + 1
            e.semantic = cos if e.semantic is None else max(e.semantic, cos)
    for e in entries.values():
        total = w.get("lexical", LEXICAL_WEIGHT) * lex.get(e.path, lex_floor)
        for name, ranked in semantic.items():
            cos = dict(ranked).get(e.path)
            floor = ranked[-1][1] if ranked else 0.0
            total += w.get(name, SEMANTIC_WEIGHT) * (cos if cos is not None else floor)
        e.score = total
    return sorted(entries.values(), key=lambda e: (-e.score, e.lexical_rank or 10**9))
