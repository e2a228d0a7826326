"""The semantic tier of memory recall, through the socket of a spawned daemon with the real
embedding worker (the packaged Universal Sentence Encoder): paraphrases the lexical tier misses,
scope, vectors kept in step with edits and removals, a corrupt vector cache, missing weights,
an OpenAI-compatible embeddings endpoint and its outage, ``--explain`` and ``daemon.status``."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from qwenctxd.memory.semantic.worker import NICE
from qwenctxd.testing.openai_stub import ScriptedOpenAI
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

# a memory and a query that share no word (the lexical tier finds nothing)
ESPRESSO = ("Espresso machine upkeep", "descale the office espresso machine every second Friday",
            "The descaler tablets are in the kitchen cupboard, top shelf.")
PARAPHRASE = "coffee maker cleaning schedule"
FREEZE = ("Release freeze", "no merges to main after Thursday noon",
          "QA needs a stable branch for the weekend release.")
FREEZE_ZH = "周四中午以后还能合并代码吗？"  # "may I still merge code after Thursday noon?"


def remember(root: Path, slug: str, name: str, description: str, body: str,
             type_: str = "project") -> Path:
    path = root / type_ / f"{slug}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\ntype: {type_}\n---\n"
                    f"{body}\n")
    return path


def repo(d: SpawnedDaemon, name: str = "repo") -> Path:
    r = d.home / "src" / name
    (r / ".git").mkdir(parents=True, exist_ok=True)
    return r


def roots(d: SpawnedDaemon, cwd: Path) -> dict[str, str]:
    return d.call("memory.status", {"cwd": str(cwd)})["roots"]


def seeded(d: SpawnedDaemon, cwd: Path) -> Path:
    project = Path(roots(d, cwd)["project"])
    espresso = remember(project, "espresso", *ESPRESSO)
    remember(project, "lint", "Lint before pushing", "run the linters locally",
             "`make lint` runs ruff and mypy; CI fails on any warning.")
    remember(project, "oncall", "On-call rota", "who carries the pager this week",
             "The rota lives in PagerDuty; swap shifts in #oncall.")
    until(lambda: len(d.call("memory.list", {"cwd": str(cwd)})["docs"]) >= 3,
          what="the memories to be listed")
    return espresso


def recall(d: SpawnedDaemon, cwd: Path, query: str, **kw: Any) -> dict[str, Any]:
    return d.call("memory.recall", {"cwd": str(cwd), "query": query, **kw})


def semantic_tier(r: dict[str, Any]) -> dict[str, Any]:
    [tier] = [t for t in r["tiers"] if t["name"] == "semantic"]
    return tier


def recall_when_ready(d: SpawnedDaemon, cwd: Path, query: str,
                      models: set[str] | None = None) -> dict[str, Any]:
    """The first answer whose semantic tier is ok (the first use starts the worker and builds
    the vectors in the background; a recall meanwhile says ``late``)."""
    box: dict[str, Any] = {}

    def ready() -> bool:
        box["r"] = r = recall(d, cwd, query)
        tier = semantic_tier(r)
        return tier["status"] == "ok" and "detail" not in tier and (
            models is None or models <= set(tier.get("models") or ()))

    until(ready, what="the semantic tier to answer", timeout=90)
    return box["r"]


def test_a_paraphrase_the_lexical_tier_misses_is_found(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    cwd = repo(d)
    espresso = seeded(d, cwd)
    r = recall_when_ready(d, cwd, PARAPHRASE)
    assert r["docs"] and r["docs"][0]["path"] == str(espresso), r
    why = r["docs"][0]["why"]
    assert "lexical_rank" not in why and why["final_rank"] == 1 and why["semantic"] > 0.3
    assert why["semantic_ranks"] == {"usem3": 1}
    assert [t["name"] for t in r["tiers"]] == ["lexical", "semantic", "selector"]
    assert semantic_tier(r)["models"] == ["usem3"]
    # the words of the memory itself still rank it first (no regression on overlap queries)
    r = recall(d, cwd, "descaler tablets for the espresso machine")
    assert r["docs"][0]["path"] == str(espresso) and r["docs"][0]["why"]["lexical_rank"] == 1
    # an unrelated query recalls nothing, semantic neighbours or not
    r = recall(d, cwd, "xylophone")
    assert r["strategy"] == "none" and r["docs"] == []
    # daemon.status names the embedder and its vectors
    emb = d.call("daemon.status")["memory"]["embedder"]
    assert emb["source"] == "packaged" and emb["model"].startswith("usem3-")
    assert emb["vectors"] >= 9 and emb["built_at"] is not None
    # qwenctl explains every rank
    out = qwenctl(d, "memory", "recall", PARAPHRASE, "--explain", cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert re.search(r"tier semantic: ok \[usem3\] [\d.]+ ms", out.stdout), out.stdout
    row = next(line for line in out.stdout.splitlines() if "Espresso machine" in line)
    assert row.split()[:2] == ["1", "-"]  # final rank 1, no lexical rank
    assert float(row.split()[2]) == round(why["semantic"], 3)


def test_scope_rules_hold_for_the_semantic_tier(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    mine, other = repo(d, "mine"), repo(d, "other")
    seeded(d, mine)
    user = remember(Path(roots(d, mine)["user"]), "font", "Terminal text size",
                    "the user likes large 16pt text in their shell window",
                    "Set 16pt in every terminal profile.", type_="user")
    until(lambda: len(d.call("memory.list", {"cwd": str(mine)})["docs"]) >= 4,
          what="the user memory to be listed")
    theirs = remember(Path(roots(d, other)["project"]), "espresso", *ESPRESSO)
    until(lambda: len(d.call("memory.list", {"cwd": str(other)})["docs"]) >= 2,
          what="the other project's memory to be listed")
    r = recall_when_ready(d, mine, PARAPHRASE)
    assert str(theirs) not in {x["path"] for x in r["docs"]}
    r = recall_when_ready(d, mine, "what size do I want my fonts?")
    assert r["docs"][0]["path"] == str(user) and r["docs"][0]["scope"] == "user"
    r = recall_when_ready(d, other, PARAPHRASE)
    assert r["docs"][0]["path"] == str(theirs)


def test_edited_memory_vectors_refresh_and_a_removed_one_is_gone(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    cwd = repo(d)
    espresso = seeded(d, cwd)
    assert recall_when_ready(d, cwd, PARAPHRASE)["docs"][0]["path"] == str(espresso)
    vectors = d.call("daemon.status")["memory"]["embedder"]["vectors"]
    name, description, body = FREEZE
    espresso.write_text(f"---\nname: {name}\ndescription: {description}\ntype: project\n---\n{body}\n")

    def refreshed() -> bool:
        r = recall(d, cwd, FREEZE_ZH)
        return bool(r["docs"]) and r["docs"][0]["path"] == str(espresso) and \
            "lexical_rank" not in r["docs"][0]["why"]

    until(refreshed, what="the edited memory's new vectors", timeout=60)
    assert str(espresso) not in {x["path"] for x in recall(d, cwd, PARAPHRASE)["docs"]}
    espresso.unlink()
    until(lambda: str(espresso) not in {x["path"] for x in recall(
        d, cwd, FREEZE_ZH)["docs"]}, what="the removed memory gone")
    until(lambda: d.call("daemon.status")["memory"]["embedder"]["vectors"] < vectors,
          what="the removed memory's vectors pruned")


def test_a_corrupt_vector_cache_is_rebuilt(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    cwd = repo(d)
    espresso = seeded(d, cwd)
    recall_when_ready(d, cwd, PARAPHRASE)
    [cache] = list(d.home.rglob("recall-vectors.sqlite"))
    d.stop()
    cache.write_bytes(b"this is not a database " * 512)
    again = SpawnedDaemon(root=d.root).start()
    try:
        r = recall_when_ready(again, cwd, PARAPHRASE)
        assert r["docs"][0]["path"] == str(espresso)
        assert list(cache.parent.glob("recall-vectors.sqlite.corrupt-*"))
        assert again.logged("vector cache was corrupt: rebuilding")
    finally:
        again.stop()


def test_missing_weights_leave_the_lexical_tier_answering(spawn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shadow = tmp_path / "shadow" / "usem3"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('weights not installed')\n")
    d: SpawnedDaemon = spawn(env={"PYTHONPATH": str(shadow.parent)}).start()
    cwd = repo(d)
    espresso = seeded(d, cwd)

    def said_so() -> bool:
        tier = semantic_tier(recall(d, cwd, "descale the espresso machine"))
        return tier["status"] == "failed" and "not installed" in tier.get("detail", "")

    until(said_so, what="the semantic tier to report the missing package", timeout=60)
    r = recall(d, cwd, "descale the espresso machine")
    assert r["strategy"] == "heuristic" and r["docs"][0]["path"] == str(espresso)
    assert r["docs"][0]["why"]["lexical_rank"] == 1 and "semantic" not in r["docs"][0]["why"]
    emb = d.call("daemon.status")["memory"]["embedder"]
    assert "not installed" in emb["error"] and emb["vectors"] == 0


CONCEPTS = [("coffee", "espresso", "maker", "machine", "descale", "descaler"),
            ("cleaning", "upkeep", "schedule", "every", "friday"),
            ("lint", "linters", "ruff", "mypy"), ("pager", "rota", "oncall", "on-call")]


def concept_vector(text: str) -> list[float]:
    words = re.findall(r"[\w-]+", text.lower())
    vec = [sum(w in group for w in words) + 0.01 for group in CONCEPTS]
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec]


def test_an_embeddings_endpoint_is_used_and_its_outage_falls_back(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        stub.embed = lambda texts: [concept_vector(t) for t in texts]
        stub.max_inputs = 2  # DashScope-like: a larger batch is refused, and split
        d: SpawnedDaemon = spawn()
        conf = d.home / ".config" / "qwenctxd" / "config.toml"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(f'[memory]\nembeddings = {{ base_url = "{stub.base_url}", '
                        f'model = "concepts-1", api_key_env = "EMBED_KEY" }}\n')
        d.env["EMBED_KEY"] = "sk-embed"
        d.start()
        cwd = repo(d)
        espresso = seeded(d, cwd)
        r = recall_when_ready(d, cwd, PARAPHRASE, models={"endpoint", "usem3"})
        assert r["docs"][0]["path"] == str(espresso)
        assert r["docs"][0]["why"]["semantic_ranks"]["endpoint"] == 1
        sent = [q for q in stub.requests if q.path.endswith("/embeddings")]
        sizes = [len(q.body["input"]) for q in sent]
        assert max(sizes) > 2 and sizes[-1] <= 2  # refused once, then split to fit
        assert all(q.headers["authorization"] == "Bearer sk-embed" for q in sent)
        assert all(q.body["encoding_format"] == "float" for q in sent)
        emb = d.call("daemon.status")["memory"]["embedder"]
        assert emb["source"] == "endpoint" and emb["model"].startswith("endpoint:concepts-1@")
        stub.embeddings_down = True
        r = recall(d, cwd, PARAPHRASE)
        assert r["docs"][0]["path"] == str(espresso)  # the packaged embedder answers
        tier = semantic_tier(r)
        assert tier["status"] == "ok" and tier["models"] == ["usem3"]
        assert "endpoint failed" in tier["detail"]
        assert d.logged("embeddings endpoint failed")


def test_memory_recall_limit_is_checked(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    cwd = repo(d)
    from qwenctxd.client.errors import ClientError

    try:
        recall(d, cwd, "deploy", limit=50)
    except ClientError as exc:
        assert exc.code == -32602 and "limit" in json.dumps(exc.data)
    else:
        raise AssertionError("limit 50 was accepted")


def test_the_worker_reads_the_embedding_table_from_a_file_copy(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    cwd = repo(d)
    seeded(d, cwd)
    assert recall_when_ready(d, cwd, PARAPHRASE)["docs"]
    worker = d.call("daemon.status")["memory"]["worker"]["pid"]
    [copy] = list(d.root.rglob("usem3-*-table.npy"))  # in the daemon's own state dir
    assert Path(d.root) in copy.parents
    fds = Path(f"/proc/{worker}/fd")
    assert any(os.readlink(fd) == str(copy) for fd in fds.iterdir())  # read from, not loaded
    # a build's embedding runs below the daemon's priority (it never takes the event loop's
    # core), a query's at it (a recall waits for it): Linux keeps a niceness per thread
    assert d.proc is not None
    daemon_nice = os.getpriority(os.PRIO_PROCESS, d.proc.pid)
    threads = {int(t.name): os.getpriority(os.PRIO_PROCESS, int(t.name))
               for t in Path(f"/proc/{worker}/task").iterdir()}
    assert threads[worker] == daemon_nice, threads  # the main thread answers queries
    assert min(19, daemon_nice + NICE) in threads.values(), threads  # the build thread
    status = Path(f"/proc/{worker}/status").read_text()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    # neither the 65 MB table nor the package's 45 MB tokenizer dict is resident (155 MB
    # holding both, 95 with the dict)
    assert rss_kb < 80 * 1024, status


def test_a_corrupt_table_copy_is_rewritten_and_vectors_do_not_change(tmp_path: Path,
                                                                      monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from qwenctxd.memory.semantic import worker

    texts = ["rollback the staging deploy", "部署前先在预发环境验证", "デプロイ前に確認する"]
    monkeypatch.delenv(worker.MODEL_CACHE_ENV, raising=False)
    plain = worker.load("usem3").embed(texts, False)
    monkeypatch.setenv(worker.MODEL_CACHE_ENV, str(tmp_path))
    mapped = worker.load("usem3")
    [copy] = list(tmp_path.glob("usem3-*-table.npy"))
    assert mapped.embed(texts, False).tolist() == plain.tolist()
    copy.write_bytes(b"not an array")
    again = worker.load("usem3")
    assert copy.stat().st_size > 60_000_000  # written anew
    assert again.embed(texts, False).tolist() == plain.tolist()


def test_a_turns_prefetch_query_is_embedded_below_a_waited_for_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The worker embeds a query someone waits for (``memory.recall``) at the daemon's
    priority and a ``background`` one (a turn's prefetch: the turn waits only for the lexical
    answer) in its build thread, NICE steps below: under a CPU contest the turns being served
    go first. Both answer with normalised vectors, in order."""
    import io
    import threading

    import msgspec
    import numpy as np

    from qwenctxd.memory.semantic import worker

    ran: list[tuple[str, bool, int]] = []

    class Recording:
        id, dim = "recording", 2

        def embed(self, texts: list[str], query: bool) -> Any:
            ran.append((texts[0], query,
                        os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            return np.full((len(texts), 2), 3.0, dtype=np.float32)

    monkeypatch.setattr(worker, "load", lambda name: Recording())
    inp, out = io.BytesIO(), io.BytesIO()
    for text, background in (("waited for", False), ("prefetch", True)):
        worker.write_frame(inp, {"op": "embed", "model": "m", "query": True,
                                 "background": background, "texts": [text]})
    inp.seek(0)
    worker.serve(inp, out)
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert ran == [("waited for", True, here), ("prefetch", True, min(19, here + NICE))]
    out.seek(0)
    replies = [msgspec.msgpack.decode(f) for f in iter(lambda: worker.read_frame(out), None)]
    assert [r["ok"] for r in replies] == [True, True]
    vec = np.frombuffer(replies[1]["data"], dtype=np.float32)
    assert np.allclose(vec, [2 ** -0.5, 2 ** -0.5])
