"""memory.recall's model selector, through the socket of a spawned daemon and the scripted
OpenAI server: it is shown only the fused top ``SELECTOR_CANDIDATES`` (headers, never bodies,
never a memory outside them), a pick outside them is ignored, and a selector that is late
(past memory.recall's 5 s), fails or picks nothing leaves the fused order — the very order a
daemon without a model answers with — and says why (``fell_back``, the selector tier)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.memory.recall import SELECTOR_CANDIDATES
from qwenctxd.server.methods.memory_methods import RECALL_SELECTOR_WAIT_S
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

QUERY = "how do we deploy the payments service to the staging cluster"
N = 40  # memories; every one says "deploy", so all of them are lexical hits (fused: 40 > 20)
SERVICES = ["payments", "search", "billing", "auth", "gateway", "ledger", "mailer", "reports"]
PLACES = ["staging", "production", "the canary pool", "a laptop", "the EU region"]
MANIFEST_LINE = re.compile(r"^- \[\w+\] (\S+\.md) \(", re.M)


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}


def body_marker(i: int) -> str:
    return f"BODYONLY{i:02d}"


def seed(d: SpawnedDaemon, cwd: Path) -> list[Path]:
    project = Path(d.call("memory.status", {"cwd": str(cwd)})["roots"]["project"])
    paths = []
    for i in range(N):
        svc, place = SERVICES[i % len(SERVICES)], PLACES[i % len(PLACES)]
        path = project / "project" / f"note-{i:02d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"---\nname: Deploy note {i:02d}\ndescription: deploy the {svc} service to {place}"
            f" (runbook {i:02d})\ntype: project\n---\n{body_marker(i)} run make ship-{svc}"
            f" and watch the dashboard for {i} minutes.\n")
        paths.append(path)
    until(lambda: len(d.call("memory.list", {"cwd": str(cwd)})["docs"]) >= N,
          what="the memories to be listed")
    return paths


def semantic_ok(r: dict[str, Any]) -> bool:
    [tier] = [t for t in r["tiers"] if t["name"] == "semantic"]
    return tier["status"] == "ok" and "detail" not in tier


def tier(r: dict[str, Any], name: str) -> dict[str, Any]:
    [t] = [t for t in r["tiers"] if t["name"] == name]
    return t


@dataclass
class World:
    d: SpawnedDaemon
    stub: ScriptedOpenAI
    cwd: Path
    paths: list[Path]
    fused: list[str]  # the no-model daemon's answer for QUERY, limit 20: the fused top 20

    def recall(self, **kw: Any) -> dict[str, Any]:
        return self.d.call("memory.recall", {"cwd": str(self.cwd), "query": QUERY, **kw})

    def selector_requests(self) -> list[dict[str, Any]]:
        return [q.body for q in self.stub.chat_requests
                if "Available memories" in json.dumps(q.body.get("messages", []))]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The fused order from a daemon without a model, then the same HOME served by a daemon
    whose model is the scripted server (the vectors are on disk already)."""
    plain = SpawnedDaemon().start()
    again: SpawnedDaemon | None = None
    try:
        cwd = plain.home / "src" / "shop"
        (cwd / ".git").mkdir(parents=True)
        paths = seed(plain, cwd)
        box: dict[str, Any] = {}

        def answered() -> bool:
            box["r"] = r = plain.call("memory.recall", {"cwd": str(cwd), "query": QUERY,
                                                        "limit": SELECTOR_CANDIDATES})
            return semantic_ok(r)

        until(answered, what="the semantic tier to answer", timeout=90)
        r = box["r"]
        assert r["strategy"] == "heuristic" and tier(r, "selector")["status"] == "off"
        fused = [x["path"] for x in r["docs"]]
        assert [x["why"]["final_rank"] for x in r["docs"]] == list(range(1, 21))
        assert len(fused) == SELECTOR_CANDIDATES < N
        plain.stop()
        with ScriptedOpenAI() as stub:
            again = SpawnedDaemon(root=plain.root, env=model_env(stub)).start()
            w = World(again, stub, cwd, paths, fused)
            # warm up (the first model call imports the client) until a selector answer lands
            # and the semantic tier answers from the vectors on disk
            deadline = time.monotonic() + 60
            while True:
                if stub.pending == 0:
                    stub.push(Reply(content=json.dumps({"selected_memories": [fused[0]]})))
                warm = w.recall()
                if warm["strategy"] == "model" and semantic_ok(warm):
                    break
                assert time.monotonic() < deadline, warm
            assert stub.pending == 0
            yield w
            assert stub.rejected == []
    finally:
        if again is not None:
            again.stop()
        plain.cleanup()


def test_the_selector_sees_only_the_fused_top_candidates_as_headers(world: World) -> None:
    w = world
    outside = [str(p) for p in w.paths if str(p) not in w.fused]
    assert len(outside) == N - SELECTOR_CANDIDATES
    pick = [outside[0], "/not/a/memory.md", w.fused[7], w.fused[2], w.fused[7]]
    w.stub.push(Reply(content=json.dumps({"selected_memories": pick})))
    before = len(w.selector_requests())
    r = w.recall()
    assert semantic_ok(r) and w.stub.pending == 0
    [sent] = w.selector_requests()[before:]
    user = next(m["content"] for m in sent["messages"] if m["role"] == "user")
    # exactly the fused top 20, in the fused order, and nothing else of the project
    assert MANIFEST_LINE.findall(user) == w.fused
    text = json.dumps(sent)
    assert not [p for p in outside if p in text]
    assert not [i for i in range(N) if body_marker(i) in text]  # headers, never bodies
    assert "make ship-" not in text
    # the picks in the selector's order; the one outside the candidates (and an unknown path,
    # and a repeat) ignored — nothing of the fused order padded back in
    assert r["strategy"] == "model" and r["fell_back"] is None
    assert [x["path"] for x in r["docs"]] == [w.fused[7], w.fused[2]]
    assert [x["why"]["selector_rank"] for x in r["docs"]] == [1, 2]
    assert tier(r, "selector")["status"] == "ok"


def test_a_late_selector_leaves_the_fused_order(world: World) -> None:
    w = world
    w.stub.push(Reply(content=json.dumps({"selected_memories": [w.fused[5]]}),
                      delay_s=RECALL_SELECTOR_WAIT_S + 5))
    t0 = time.monotonic()
    r = w.recall(limit=SELECTOR_CANDIDATES)
    took = time.monotonic() - t0
    assert RECALL_SELECTOR_WAIT_S - 0.2 <= took < RECALL_SELECTOR_WAIT_S + 4, took  # not 10 s
    assert w.stub.pending == 0  # the request was made and its answer came too late
    assert r["strategy"] == "heuristic" and r["fell_back"] == "late"
    assert tier(r, "selector")["status"] == "late"
    assert semantic_ok(r)
    assert [x["path"] for x in r["docs"]] == w.fused
    assert all("selector_rank" not in x["why"] for x in r["docs"])


@pytest.mark.parametrize("reply", [Reply(fault="http_500"),
                                   Reply(content=json.dumps({"selected_memories": []})),
                                   Reply(content=json.dumps(
                                       {"selected_memories": ["/not/a/memory.md"]}))],
                         ids=["http_500", "empty", "unknown_only"])
def test_a_failed_or_empty_selector_leaves_the_fused_order(world: World, reply: Reply) -> None:
    w = world
    w.stub.push(reply)
    before = len(w.selector_requests())
    r = w.recall(limit=SELECTOR_CANDIDATES)
    # asked (a 500 may be retried once without json_schema, as for llama.cpp's server)
    assert len(w.selector_requests()) > before and w.stub.pending == 0
    assert r["strategy"] == "heuristic" and r["fell_back"]
    if reply.fault:
        assert tier(r, "selector")["status"] == "failed"
        assert r["fell_back"] == "http_500"
    else:
        assert r["fell_back"] == "model_selected_nothing"
        assert tier(r, "selector")["status"] == "ok"
    assert semantic_ok(r)
    assert [x["path"] for x in r["docs"]] == w.fused
    # the default limit: the fused top 5
    w.stub.push(reply)
    r = w.recall()
    assert r["fell_back"] and [x["path"] for x in r["docs"]] == w.fused[:5]
