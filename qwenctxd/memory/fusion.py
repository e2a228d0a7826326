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
BM25_SCALE = 15.0  # blend: BM25 s counts s / (s + BM25_SCALE)
#: per-tier weights; a list's weight is its key's, "semantic:*" lists default to SEMANTIC
LEXICAL_WEIGHT = 1.0
SEMANTIC_WEIGHT = 1.0
#: a document containing every identifier the query names (``lexical.identifiers``) gains this
#: much (a share of it for some): more than any cosine difference, so it comes first
NAMED_WEIGHT = 1.0


@dataclass
class Fused:
    path: str
    score: float
    lexical_rank: int | None = None  # 1-based
    lexical_score: float | None = None
    semantic: float | None = None  # the best cosine over the embedders that ranked it
    ranks: dict[str, int] = field(default_factory=dict)  # tier -> 1-based rank
    named: int = 0  # how many of the query's identifiers it contains


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
          weights: Mapping[str, float] | None = None,
          lexical_scale: float | None = BM25_SCALE) -> list[Fused]:
    """A weighted sum of calibrated scores: each embedder's cosine, and BM25 squashed to 0..1
    as ``s / (s + lexical_scale)`` — absolute, so a query whose best lexical match is a stray
    common word (BM25 ~5–10 on the dev set) does not score like one naming the memory (~20–40);
    ``lexical_scale=None`` divides by the query's best BM25 instead. A tier that did not list
    a document contributes its list's lowest score (0 for the lexical tier)."""
    w = dict(weights or {})
    entries: dict[str, Fused] = {}
    if lexical_scale is None:
        top = max((s for _, s in lexical), default=0.0)
        lex = {p: (s / top if top > 0 else 0.0) for p, s in lexical}
    else:
        lex = {p: max(s, 0.0) / (max(s, 0.0) + lexical_scale) for p, s in lexical}
    for i, (path, score) in enumerate(lexical):
        entries[path] = Fused(path=path, score=0.0, lexical_rank=i + 1, lexical_score=score,
                              ranks={"lexical": i + 1})
    cosines: dict[str, dict[str, float]] = {}
    floors: dict[str, float] = {}
    for name, ranked in semantic.items():
        cosines[name] = dict(ranked)
        floors[name] = ranked[-1][1] if ranked else 0.0
        for i, (path, cos) in enumerate(ranked):
            e = entries.setdefault(path, Fused(path=path, score=0.0))
            e.ranks[name] = i + 1
            e.semantic = cos if e.semantic is None else max(e.semantic, cos)
    lw = w.get("lexical", LEXICAL_WEIGHT)
    for e in entries.values():
        total = lw * lex.get(e.path, 0.0)
        for name, by_path in cosines.items():
            total += w.get(name, SEMANTIC_WEIGHT) * by_path.get(e.path, floors[name])
        e.score = total
    return sorted(entries.values(), key=lambda e: (-e.score, e.lexical_rank or 10**9))


def prefer_named(fused: Sequence[Fused], named: Mapping[str, int], groups: int, *,
                 weight: float = NAMED_WEIGHT) -> list[Fused]:
    """``fused`` with each document that contains some of the query's ``groups`` identifiers
    (``named``: path -> how many) raised by ``weight`` × that share, re-sorted."""
    if not named or groups <= 0:
        return list(fused)
    for e in fused:
        n = named.get(e.path, 0)
        if n:
            e.named = n
            e.score += weight * min(n, groups) / groups
    return sorted(fused, key=lambda e: (-e.score, e.lexical_rank or 10**9))
