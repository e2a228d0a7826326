"""Recall's admission of the semantic lists (memory/recall.py ``admitted``): an embedder's
list counts when its best cosine reaches the floor, or when the query is about what the
memories are about (its cosine with their centroid reaches ``RELATED``); never otherwise."""

from __future__ import annotations

from qwenctxd.memory.recall import RELATED, THRESHOLDS, admitted

FLOOR = THRESHOLDS["usem3"][0]
MARK = RELATED["usem3"]


def lists(best: float) -> dict[str, list[tuple[str, float]]]:
    return {"usem3": [("/m/a.md", best), ("/m/b.md", best - 0.05)]}


def test_a_list_whose_best_reaches_the_floor_counts() -> None:
    assert admitted(lists(FLOOR + 0.01), set()) == {"/m/a.md", "/m/b.md"}


def test_under_the_floor_only_a_query_about_the_memories_subject_counts() -> None:
    under = lists(FLOOR - 0.08)
    assert admitted(under, set()) == set()  # no centroid known: the floor decides
    assert admitted(under, set(), {"usem3": MARK - 0.05}) == set()  # unrelated: nothing
    assert admitted(under, set(), {"usem3": MARK + 0.02}) == {"/m/a.md", "/m/b.md"}


def test_lexical_hits_always_stay_and_unknown_embedders_have_no_centroid_rule() -> None:
    assert admitted(lists(0.1), {"/m/lex.md"}, {"usem3": 0.0}) == {"/m/lex.md"}
    endpoint = {"bge-m3": [("/m/a.md", 0.3)]}  # its scale is unknown: the default floor
    assert admitted(endpoint, set(), {"bge-m3": 0.9}) == set()
