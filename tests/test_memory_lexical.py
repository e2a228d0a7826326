"""Recall tokenization, the FTS5 lexical index and the seed's linear scoring."""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwenctxd.memory import store
from qwenctxd.memory.lexical import (
    Hit,
    LexicalIndex,
    identifiers,
    match_expression,
    seed_score,
    seed_score_search,
    type_boosts,
)
from qwenctxd.memory.tokenize import cjk_bigrams, fts_text, tokens


@dataclass(frozen=True)
class Doc:
    path: str
    scope: str = "project"
    type: str = "project"
    name: str = ""
    description: str = ""
    body: str = ""
    mtime: float = 1000.0
    size: int = 100
    keywords: tuple[str, ...] = ()


def corpus() -> list[Doc]:
    return [
        Doc("/m/project/project/deploy.md", name="Deploy pipeline",
            description="how we deploy services to staging and production",
            body="Run make deploy-staging first; deploying to production needs two approvals."),
        Doc("/m/project/feedback/tests.md", type="feedback", name="Integration tests use Postgres",
            description="never mock the database in integration tests",
            body="**Why:** mocks hid a broken migration.\n**How to apply:** use testcontainers."),
        Doc("/m/user/user/editor.md", scope="user", type="user", name="Editor is Neovim",
            description="user edits in neovim with gopls", body="No VS Code instructions."),
        Doc("/m/project/reference/search-zh.md", type="reference", name="搜索服务监控",
            description="商品搜索的监控面板在 Grafana 上",
            body="部署之后先看搜索延迟和错误率。"),
        Doc("/m/project/project/release-zh.md", name="生产发布流程",
            description="生产环境通过 Argo CD 部署，需要两人审批",
            body="合并到 main 后自动构建镜像。"),
        Doc("/m/user/feedback/terse.md", scope="user", type="feedback", name="Keep answers short",
            description="no long preambles", body="Answer first, explain after."),
    ]


# -- tokens ------------------------------------------------------------------------------------------


def test_tokens_latin_runs_need_three_chars_and_split_on_punctuation() -> None:
    assert tokens("Go CI is OK, but deploy_staging-now!") == ["but", "deploy", "staging", "now"]


def test_tokens_nfkc_lowercase_and_dedupe() -> None:
    assert tokens("ＤＥＰＬＯＹ deploy Deploy café") == ["deploy", "café"]


def test_tokens_cjk_bigrams_and_a_single_char_run_is_noise() -> None:
    assert tokens("部署流程") == ["部署", "署流", "流程"]
    assert tokens("改 bug 的") == ["bug"]
    assert tokens("部") == tokens("認") == tokens("배") == []
    # punctuation ends a CJK run (no "署。" bigram); Latin glued to Han is its own token
    assert tokens("部署。然后用pytest测试") == ["部署", "然后", "后用", "pytest", "测试"]
    assert tokens("カタカナ 한국어") == ["カタ", "タカ", "カナ", "한국", "국어"]


def test_tokens_combining_marks_stay_in_the_word() -> None:
    assert tokens("हिन्दी") == ["हिन्दी"]


def test_tokens_cap_64_first_32_and_last_32_unique() -> None:
    words = [f"w{i:03d}" for i in range(100)]
    out = tokens(" ".join(words))
    assert len(out) == 64
    assert out == words[:32] + words[-32:]


def test_tokens_tail_is_lru() -> None:
    words = [f"w{i:03d}" for i in range(70)]
    out = tokens(" ".join([*words, "w040", "w000"]))  # w040 is in the tail: moves to the end
    assert len(out) == 64
    assert out[:32] == words[:32]
    assert out[-1] == "w040"
    assert out.count("w000") == 1


def test_cjk_bigrams_and_fts_text() -> None:
    assert cjk_bigrams("用 Go 写搜索服务。部署") == "用 写搜 搜索 索服 服务 部署"
    assert cjk_bigrams("plain english") == ""
    assert fts_text("用pytest跑测试").split() == ["用", "pytest", "跑测", "测试"]
    assert fts_text("Plain English") == "plain english"


# -- the index ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sync_add_update_delete(tmp_path: Path) -> None:
    docs = corpus()
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        st = await ix.sync(docs)
        assert (st.added, st.updated, st.removed) == (len(docs), 0, 0)
        assert await ix.count() == len(docs)
        st = await ix.sync(docs)
        assert (st.added, st.updated, st.removed) == (0, 0, 0)

        # same (mtime, size): not rewritten, so the index still holds the old text
        quiet = dataclasses.replace(docs[0], body="kubernetes helm chart")
        st = await ix.sync([quiet, *docs[1:]])
        assert st.updated == 0
        assert await ix.search("kubernetes") == []

        changed = dataclasses.replace(docs[0], body="kubernetes helm chart", mtime=2000.0)
        extra = Doc("/m/project/project/new.md", name="Redis usage", body="sessions cache")
        st = await ix.sync([changed, extra, *docs[2:]])  # docs[1] is gone
        assert (st.added, st.updated, st.removed) == (1, 1, 1)
        assert await ix.count() == len(docs)
        assert [h.path for h in await ix.search("kubernetes helm")] == [docs[0].path]
        assert await ix.search("testcontainers") == []
        assert [h.path for h in await ix.search("redis")] == [extra.path]
        assert await ix.search("approvals") == []  # the old body is no longer indexed

        st = await ix.sync([])
        assert st.removed == len(docs)
        assert await ix.count() == 0
        assert await ix.search("redis") == []


@pytest.mark.asyncio
async def test_english_query_ranks_the_obvious_doc_first(tmp_path: Path) -> None:
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync(corpus())
        hits = await ix.search("how do I deploy to production?")
        assert hits and hits[0].path == "/m/project/project/deploy.md"
        assert all(isinstance(h, Hit) and h.score > 0 for h in hits)
        assert hits == sorted(hits, key=lambda h: -h.score)
        hits = await ix.search("can I mock the database in the integration suite")
        assert hits[0].path == "/m/project/feedback/tests.md"
        # tokens of 5+ characters match as prefixes: "approv" finds "approvals"
        assert [h.path for h in await ix.search("approv")] == ["/m/project/project/deploy.md"]
        assert await ix.search("pipelin x") != []
        assert await ix.search("pip") == []  # shorter tokens match whole words only


@pytest.mark.asyncio
async def test_chinese_two_character_words(tmp_path: Path) -> None:
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync(corpus())
        assert (await ix.search("搜索"))[0].path == "/m/project/reference/search-zh.md"
        paths = [h.path for h in await ix.search("部署")]
        assert set(paths) == {"/m/project/reference/search-zh.md",
                              "/m/project/project/release-zh.md"}
        hits = await ix.search("生产环境部署需要谁审批？")
        assert hits[0].path == "/m/project/project/release-zh.md"
        # a lone CJK character is noise, as upstream treats it: it matches nothing
        assert await ix.search("审 x") == []
        assert await ix.search("部") == []


@pytest.mark.asyncio
async def test_latin_glued_to_han_is_searchable(tmp_path: Path) -> None:
    doc = Doc("/m/p/zh.md", name="测试规范", body="用pytest跑单元测试，不要用unittest")
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync([doc])
        assert [h.path for h in await ix.search("pytest")] == [doc.path]
        assert [h.path for h in await ix.search("unittest")] == [doc.path]


@pytest.mark.parametrize("query", [
    '"', '""', '"deploy', 'deploy"', "OR", "deploy OR", "OR deploy", "AND NOT deploy",
    "NEAR(deploy staging)", "NEAR(deploy staging, 2)", "deploy*", "*", "title:deploy",
    "{title body}: deploy", "^deploy", "(deploy", "deploy)", "-deploy", "+", "'", "deploy; --",
    "col:\"x\" AND y", "\x00deploy", "部署\" OR \"x", "rank MATCH 'x'",
])
@pytest.mark.asyncio
async def test_fts_syntax_in_the_query_is_plain_text(tmp_path: Path, query: str) -> None:
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync(corpus())
        hits = await ix.search(query)
        assert isinstance(hits, list)
        if "deploy" in query.lower():
            assert hits and hits[0].path == "/m/project/project/deploy.md"


def test_match_expression_quotes_every_term() -> None:
    assert match_expression(["near", "部署", "改", "deploy"]) == \
        '"near" OR "部署" OR "改"* OR "deploy"*'
    assert match_expression(['a"b']) == '"a""b"'


@pytest.mark.asyncio
async def test_empty_queries_and_limits(tmp_path: Path) -> None:
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync(corpus())
        assert await ix.search("") == []
        assert await ix.search("a b c ! ?") == []  # no token of 3+ characters
        assert await ix.search("deploy", limit=0) == []
        assert len(await ix.search("the and for deploy neovim postgres", limit=2)) == 2
        # only stop words: they are kept rather than answering nothing
        stop_only = Doc("/m/p/stop.md", name="What about this", body="")
        await ix.sync([*corpus(), stop_only])
        assert [h.path for h in await ix.search("what about")] == [stop_only.path]


@pytest.mark.asyncio
async def test_scopes_and_exclude(tmp_path: Path) -> None:
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync(corpus())
        q = "neovim answers deploy production"
        everything = {h.path for h in await ix.search(q, limit=10)}
        assert {"/m/user/user/editor.md", "/m/project/project/deploy.md"} <= everything
        user = {h.path for h in await ix.search(q, scopes=["user"], limit=10)}
        assert user and all(p.startswith("/m/user/") for p in user)
        project = {h.path for h in await ix.search(q, scopes=("project",), limit=10)}
        assert project and all(p.startswith("/m/project/") for p in project)
        assert await ix.search(q, scopes=[]) == []
        rest = [h.path for h in await ix.search(q, limit=10,
                                                exclude=["/m/project/project/deploy.md"])]
        assert "/m/project/project/deploy.md" not in rest
        assert set(rest) == everything - {"/m/project/project/deploy.md"}
        both = await ix.search(q, scopes=["user"], exclude=["/m/user/user/editor.md"])
        assert "/m/user/user/editor.md" not in {h.path for h in both}


@pytest.mark.asyncio
async def test_type_boost_breaks_a_tie(tmp_path: Path) -> None:
    assert type_boosts(["user", "preference", "rule", "x"]) == {"user": 2.0, "feedback": 1.0}
    a = Doc("/m/a.md", type="project", name="tabs or spaces", body="indent")
    b = Doc("/m/b.md", type="user", name="tabs or spaces", body="indent")
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync([a, b])
        hits = await ix.search("user preference tabs")
        assert [h.path for h in hits] == ["/m/b.md", "/m/a.md"]
        assert hits[0].score == pytest.approx(hits[1].score + 2.0)


@pytest.mark.asyncio
async def test_real_memory_docs_and_reopen(tmp_path: Path) -> None:
    root = tmp_path / "mem"
    (root / "feedback").mkdir(parents=True)
    (root / "feedback" / "lint.md").write_text(
        "---\nname: Run make lint\ndescription: lint before pushing\ntype: feedback\n"
        "keywords: [golangci, ruff]\n---\n\nRun it before every push.\n")
    docs = store.scan(root, "project", uncapped=True).docs
    assert len(docs) == 1
    db = tmp_path / "state" / "recall.sqlite"
    ix = LexicalIndex(db)
    await ix.open()
    try:
        await ix.sync(docs)
        assert [h.path for h in await ix.search("golangci")] == [str(docs[0].path)]
    finally:
        await ix.close()
    await ix.close()  # idempotent
    async with LexicalIndex(db) as again:  # persisted, no sync needed
        assert [h.path for h in await again.search("ruff lint")] == [str(docs[0].path)]
        assert (await again.sync(docs)).updated == 0


@pytest.mark.asyncio
async def test_corrupt_database_is_set_aside(tmp_path: Path) -> None:
    db = tmp_path / "recall.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    async with LexicalIndex(db) as ix:
        assert ix.set_aside is not None and ix.set_aside.exists()
        await ix.sync(corpus())
        assert await ix.search("neovim")
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1
    conn.close()


@pytest.mark.asyncio
async def test_not_open_raises(tmp_path: Path) -> None:
    ix = LexicalIndex(tmp_path / "r.sqlite")
    with pytest.raises(RuntimeError):
        await ix.search("deploy")


# -- the seed's linear scan ------------------------------------------------------------------------


def test_seed_score_formula() -> None:
    doc = Doc("/m/a.md", type="feedback", name="Deploy rules",
              description="how to deploy", body="needs approvals")
    # deploy, rule: 2 hits → 4; "rule" is a feedback topic keyword → +1; body → +1
    assert seed_score(tokens("deploy rule"), doc) == 6
    assert seed_score(tokens("approvals"), doc) == 3
    empty_body = dataclasses.replace(doc, body="_No entries yet._")
    assert seed_score(tokens("deploy"), empty_body) == 2
    assert seed_score(tokens("kubernetes rule"), Doc("/m/b.md", name="x", body="y")) == 0
    # substring match, as the seed does: "deploy" is in "deployment"
    assert seed_score(tokens("deploy"), Doc("/m/c.md", name="Deployment", body="")) == 2


def test_seed_score_search_ranking() -> None:
    docs = corpus()
    hits = seed_score_search(docs, "deploy to production")
    assert hits[0].path == "/m/project/project/deploy.md"
    assert all(h.score > 0 for h in hits)
    assert seed_score_search(docs, "") == []
    assert seed_score_search(docs, "zzzz qqqq") == []
    assert len(seed_score_search(docs, "the and deploy neovim postgres short", limit=2)) == 2
    assert seed_score_search(docs, "部署")[0].path in {"/m/project/reference/search-zh.md",
                                                     "/m/project/project/release-zh.md"}
    # ties: newer first
    old = Doc("/m/old.md", name="tabs", mtime=1.0)
    new = Doc("/m/new.md", name="tabs", mtime=2.0)
    assert [h.path for h in seed_score_search([old, new], "tabs")] == ["/m/new.md", "/m/old.md"]


@pytest.mark.asyncio
async def test_integer_mtime_round_trips(tmp_path: Path) -> None:
    doc = Doc("/m/ns.md", name="nanoseconds", mtime=1_726_000_000_123_456_789)  # type: ignore[arg-type]
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync([doc])
        assert (await ix.sync([doc])).updated == 0


def test_identifiers_are_the_words_that_name_something_exactly() -> None:
    assert identifiers("where is marker0152 used") == [["marker0152"]]
    assert identifiers("ERR_CONN_RESET after getUserById in src/app/main.py, see #1234") == [
        ["err", "conn", "reset"], ["getuserbyid"], ["src", "app", "main"], ["1234"]]
    assert identifiers("how do we deploy to staging") == []
    assert identifiers("port 80 and 8080") == [["8080"]]
    assert len(identifiers(" ".join(f"id{i}x" for i in range(50)))) == 8


@pytest.mark.asyncio
async def test_naming_counts_the_identifier_phrases_each_document_contains(tmp_path: Path) -> None:
    docs = [Doc(f"/m/project/project/f{i}.md", name=f"fact {i}",
                description=f"marker{i:04d} and ERR_CONN_RESET" if i == 3 else f"marker{i:04d}")
            for i in range(6)]
    docs.append(Doc("/m/project/project/reset.md", name="reset", description="conn err reset"))
    async with LexicalIndex(tmp_path / "r.sqlite") as ix:
        await ix.sync(docs)
        groups = identifiers("marker0003 ERR_CONN_RESET")
        everyone = [d.path for d in docs]
        assert await ix.naming(groups, everyone) == {"/m/project/project/f3.md": 2}
        # the tokens out of order are not the identifier; a path outside the list is not counted
        assert await ix.naming(groups, everyone[:3]) == {}
        assert await ix.naming([], everyone) == {}


@pytest.mark.asyncio
async def test_the_fast_ranking_query_equals_the_joined_one(tmp_path: Path) -> None:
    """Without type boosts or scopes, search ranks inside FTS5 and joins only its top rows;
    on a corpus with many equal scores (duplicated texts, newest first) and excluded paths it
    answers exactly what the general query (every match joined, here forced by naming every
    scope) answers."""
    import random

    rng = random.Random(5)
    words = ["deploy", "staging", "rollback", "cluster", "migration", "release", "certificate",
             "部署", "预发环境", "本番環境", "token", "cache"]
    docs = []
    for i in range(400):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))
        if i % 7 == 0 and docs:  # a duplicate of an earlier text: the same score, newer
            text = docs[rng.randrange(len(docs))].body
        docs.append(Doc(f"/m/project/project/m{i:03}.md", name=f"memo {i}", body=text,
                        mtime=1000.0 + i))
    async with LexicalIndex(tmp_path / "lexical.sqlite") as idx:
        await idx.sync(docs)
        for query in ("deploy staging", "rollback migration release", "部署 cache",
                      "certificate token cluster", "本番環境"):
            for limit in (1, 5, 40, 180):
                for exclude in ([], [d.path for d in docs[::9]]):
                    fast = await idx.search(query, limit=limit, exclude=exclude)
                    joined = await idx.search(query, limit=limit, exclude=exclude,
                                              scopes=["project", "user", "team"])
                    assert fast == joined, (query, limit, len(exclude))
                    assert len(fast) == min(limit, len(joined))
                    assert not {h.path for h in fast} & set(exclude)
