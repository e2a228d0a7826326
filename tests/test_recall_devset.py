"""The recall dev set (bench/recall_devset) keeps its promised shape, its paraphrases really
share no content word with their memories, it materializes where the daemon looks, and the
quality harness scores rankings as documented."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest

from bench.recall_quality import Metrics, evaluate, first_relevant
from qwenctxd.memory import store
from qwenctxd.paths import project_slug
from qwenctxd.testing.inprocess import InProcessDaemon
from qwenctxd.testing.recall_devset import (
    KINDS,
    LANGS,
    PROJECTS,
    SPLITS,
    USER_SCOPE,
    DevSet,
    Query,
    content_tokens,
    load,
    materialize,
    materialize_layout,
    shared_content,
)


@pytest.fixture(scope="module")
def devset() -> DevSet:
    return load()


# -- memories -------------------------------------------------------------------------------------


def test_memories_span_three_projects_and_the_user_scope(devset: DevSet) -> None:
    per_scope = Counter(m.scope_key for m in devset.memories.values())
    assert len(devset.memories) >= 300
    assert set(per_scope) == {*PROJECTS, USER_SCOPE}
    assert all(n >= 40 for n in per_scope.values()), per_scope
    # the daemon scans at most 200 documents a private scope: every memory must stay visible
    assert max(per_scope.values()) <= store.MAX_SCANNED_MEMORY_FILES
    assert {m.type for m in devset.memories.values()} == {"user", "feedback", "project",
                                                           "reference"}
    for m in devset.memories.values():
        assert m.name and m.description and m.body, m.id


def test_memories_are_in_english_chinese_and_japanese(devset: DevSet) -> None:
    langs = Counter(m.lang for m in devset.memories.values())
    total = len(devset.memories)
    assert langs["zh"] >= 0.2 * total and langs["ja"] >= 0.2 * total, langs
    assert langs["en"] >= 0.3 * total, langs


def test_memory_names_are_distinct_within_a_scope(devset: DevSet) -> None:
    seen: Counter[tuple[str, str]] = Counter(
        (m.scope_key, m.name.casefold()) for m in devset.memories.values())
    assert [k for k, n in seen.items() if n > 1] == []


# -- queries --------------------------------------------------------------------------------------


def test_query_counts_languages_and_kinds(devset: DevSet) -> None:
    qs = devset.queries
    assert len(qs) >= 100
    assert len({q.id for q in qs}) == len(qs)
    langs = Counter(q.lang for q in qs)
    assert set(langs) == set(LANGS) and min(langs.values()) >= 15, langs
    assert {q.kind for q in qs} == set(KINDS)
    assert sum(q.kind == "paraphrase" for q in qs) >= 40
    assert {q.project for q in qs} == set(PROJECTS)
    for q in qs:
        assert q.query.strip() and q.relevant, q.id


def test_splits_are_halves_balanced_per_language_and_kind(devset: DevSet) -> None:
    splits = Counter(q.split for q in devset.queries)
    assert set(splits) == set(SPLITS)
    assert abs(splits["tune"] - splits["heldout"]) <= 0.1 * len(devset.queries), splits
    for lang in LANGS:
        for kind in KINDS:
            group = Counter(q.split for q in devset.queries if q.lang == lang and q.kind == kind)
            assert abs(group["tune"] - group["heldout"]) <= 1, (lang, kind, group)


def test_every_relevant_memory_exists_and_is_in_the_query_scope(devset: DevSet) -> None:
    for q in devset.queries:
        for mid in q.relevant:
            assert mid in devset.memories, (q.id, mid)
            assert devset.in_scope(mid, q.project), (q.id, mid)
    other = next(p for p in PROJECTS if p != "harbor")
    assert not devset.in_scope(f"{other}/project/what-is-ferrite", "harbor")


def test_paraphrases_share_no_content_word_with_their_memories(devset: DevSet) -> None:
    for q in devset.queries:
        if q.kind != "paraphrase":
            continue
        assert content_tokens(q.query), q.id  # not an empty or stop-word-only query
        for mid in q.relevant:
            assert shared_content(q.query, devset.memories[mid].text) == set(), (q.id, mid)


def test_overlap_queries_do_share_words_with_a_memory(devset: DevSet) -> None:
    for q in devset.queries:
        if q.kind == "overlap":
            assert any(shared_content(q.query, devset.memories[m].text) for m in q.relevant), q.id


def test_the_set_has_user_scope_answers_cross_language_queries_and_near_neighbours(
        devset: DevSet) -> None:
    user_only = [q.id for q in devset.queries
                 if all(devset.memories[m].scope_key == USER_SCOPE for m in q.relevant)]
    assert len(user_only) >= 10, user_only
    cross = [q.id for q in devset.queries if q.kind == "paraphrase" and q.lang != "mixed"
             and all(devset.memories[m].lang != q.lang for m in q.relevant)]
    assert len(cross) >= 12, cross
    assert {devset.queries[[q.id for q in devset.queries].index(i)].lang for i in cross} == {
        "en", "zh", "ja"}
    # an overlap query usually has an in-scope distractor sharing its words, often more than one
    distracted = 0
    overlap = [q for q in devset.queries if q.kind == "overlap"]
    for q in overlap:
        rivals = [m for m in devset.visible(q.project)
                  if m.id not in q.relevant and shared_content(q.query, m.text)]
        distracted += len(rivals) >= 2
    assert distracted >= 0.6 * len(overlap), (distracted, len(overlap))


# -- the on-disk layout ---------------------------------------------------------------------------


def test_materialize_writes_qwen_codes_layout(tmp_path: Path, devset: DevSet) -> None:
    home = tmp_path / "home"
    cwds = materialize(home, devset)
    assert set(cwds) == set(PROJECTS)
    base = home.resolve() / ".qwen"
    for project, cwd in cwds.items():
        assert (cwd / ".git").is_dir()
        root = base / "projects" / project_slug(cwd) / "memory"
        docs = store.scan(root, "project", uncapped=True).docs
        want = sum(m.scope_key == project for m in devset.memories.values())
        assert len(docs) == want
    user = store.scan(base / "memories", "user", uncapped=True).docs
    assert len(user) == sum(m.scope_key == USER_SCOPE for m in devset.memories.values())


def test_layout_maps_ids_and_paths_both_ways(tmp_path: Path, devset: DevSet) -> None:
    layout = materialize_layout(tmp_path / "home", devset)
    for mid, path in layout.files.items():
        assert path == layout.path_of(mid) and path.is_file()
        assert layout.id_of(path) == mid
        assert path.read_bytes() == devset.memories[mid].source.read_bytes()
    assert layout.id_of(tmp_path / "elsewhere.md") is None
    assert layout.ids_of([tmp_path / "x.md", layout.files["user/user/fish-shell"]]) == [
        "user/user/fish-shell"]


def test_the_daemon_resolves_the_materialized_projects(
        inprocess_daemon: InProcessDaemon, devset: DevSet) -> None:
    layout = materialize_layout(inprocess_daemon.home, devset)
    for project, cwd in layout.cwds.items():
        st = inprocess_daemon.call("memory.status", {"cwd": str(cwd)})
        assert Path(st["roots"]["project"]) == layout.root_of(project)
        assert Path(st["roots"]["user"]) == layout.root_of(USER_SCOPE)
    q = next(q for q in devset.queries if q.id == "en02")  # Kafka topic naming, harbor
    r = inprocess_daemon.call("memory.recall", {"cwd": str(layout.cwds[q.project]),
                                                "query": q.query})
    ids = layout.ids_of(d["path"] for d in r["docs"])
    assert ids and ids[0] in q.relevant, ids
    for mid in ids:  # scope rules: harbor's memories and the user's only
        assert devset.memories[mid].scope_key in ("harbor", USER_SCOPE)


# -- the harness ----------------------------------------------------------------------------------


def _queries(devset: DevSet) -> list[Query]:
    return devset.queries[:40]


def test_evaluate_scores_a_perfect_and_a_useless_ranker(devset: DevSet) -> None:
    qs = _queries(devset)

    def oracle(q: Query) -> list[str]:
        return list(q.relevant)

    async def useless(q: Query) -> list[str]:
        return [m for m in devset.memories if m not in q.relevant][:10]

    perfect = anyio.run(evaluate, oracle, qs).summary()
    assert perfect["all"]["hit5"] == 1.0 and perfect["all"]["mrr10"] == 1.0
    assert perfect["misses"] == []
    none = anyio.run(evaluate, useless, qs).summary()
    assert none["all"]["hit5"] == 0.0 and none["all"]["mrr10"] == 0.0
    assert len(none["misses"]) == len(qs)


def test_evaluate_ranks_mrr_and_slices(devset: DevSet) -> None:
    qs = _queries(devset)

    def third(q: Query) -> list[str]:  # first relevant at rank 3 for paraphrases, 7 otherwise
        pad = [m for m in devset.memories if m not in q.relevant]
        at = 2 if q.kind == "paraphrase" else 6
        return pad[:at] + [q.relevant[0]] + pad[at:9]

    m: Metrics = anyio.run(evaluate, third, qs)
    s = m.summary()
    para = s["paraphrase"]
    assert para["hit5"] == 1.0 and para["mrr10"] == pytest.approx(1 / 3, abs=1e-3)
    assert s["overlap"]["hit5"] == 0.0 and s["overlap"]["hit10"] == 1.0
    assert s["overlap"]["mrr10"] == pytest.approx(1 / 7, abs=1e-3)
    assert s["all"]["para_hit5"] == 1.0
    assert s["tune"]["n"] + s["heldout"]["n"] == len(qs)
    assert sum(s[lang]["n"] for lang in LANGS if s[lang]["n"]) == len(qs)
    assert first_relevant(["a", "b", "c"], ["c"]) == 3
    assert first_relevant(["a"] * 10 + ["c"], ["c"]) is None
