"""Foreground first, through the socket: the daemon's side queries yield to the requests of a
session's own agent on the same model server (model/scheduler.py).

A session names its agent's server with ``session.open`` ``model_base_url`` (the proxy names
its upstream). From ``session.turn`` until ``session.record_model`` that session is foreground
there: a background side query (here the recall selector of ``memory.recall``) waits until it
ends, and one already in flight is cancelled when it begins — the lexical answer stands."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def _model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "sk-test"}


def _remember(root: Path, name: str, title: str, description: str, body: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.md"
    path.write_text(f"---\nname: {title}\ndescription: {description}\ntype: project\n---\n"
                    f"{body}\n")
    return path


@pytest.fixture
def setup(spawn):  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=_model_env(stub)).start()
        repo = d.home / "work" / "repo"
        (repo / ".git").mkdir(parents=True)
        roots = d.call("memory.status", {"cwd": str(repo)})["roots"]
        freeze = _remember(Path(roots["project"]), "release", "Release freeze",
                           "release freeze starts every Thursday at noon",
                           "No merges to main after Thursday noon.")
        until(lambda: d.call("memory.list", {"cwd": str(repo)})["docs"], what="indexing")
        # the openai import and the connection, outside the timed parts
        stub.push(Reply(content=json.dumps({"selected_memories": [str(freeze)]})))
        d.call("memory.recall", {"cwd": str(repo), "query": "release freeze warm-up"})
        yield d, stub, repo, freeze


def _recall_requests(stub: ScriptedOpenAI) -> list[Any]:
    return [r for r in stub.chat_requests
            if r.headers.get("x-qwenctxd-feature") == "recall"]


def _scheduler(d: SpawnedDaemon) -> dict[str, Any]:
    return d.call("daemon.status")["model"]["scheduler"]


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except Exception as exc:  # surfaced by the test's assertion on box
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_a_side_query_waits_while_the_agent_is_asking(setup) -> None:  # type: ignore[no-untyped-def]
    d, stub, repo, freeze = setup
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                  "model_base_url": stub.base_url})["session_id"]
    before = len(_recall_requests(stub))
    p = d.call("session.turn", {"session_id": sid, "kind": "user",
                                "text": "is there a release freeze?"})
    # the selector is off for a turn whose agent shares the local side-query server ("auto"),
    # and the lexical hit rides on the turn
    assert [r for r in p["reminders"] if r["kind"] == "memory"]
    assert _scheduler(d)["foreground"] == 1
    stub.push(Reply(content=json.dumps({"selected_memories": [str(freeze)]})))
    t, box = _in_thread(lambda: d.call("memory.recall", {"cwd": str(repo),
                                                         "query": "release freeze"}))
    until(lambda: _scheduler(d)["waits"] >= 1, what="the selector to wait for the agent")
    assert len(_recall_requests(stub)) == before  # nothing was sent while the agent asks
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "Yes, from Thursday noon."}})
    t.join(timeout=30)
    assert "error" not in box, box
    r = box["result"]
    assert r["strategy"] == "model"
    assert len(_recall_requests(stub)) == before + 1
    assert [x["name"] for x in r["tiers"]] == ["lexical", "semantic", "selector"]
    assert r["tiers"][0]["status"] == "ok" and r["tiers"][-1]["status"] == "ok"


def test_an_agent_request_preempts_a_side_query_in_flight(setup) -> None:  # type: ignore[no-untyped-def]
    d, stub, repo, freeze = setup
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                  "model_base_url": stub.base_url})["session_id"]
    before = len(_recall_requests(stub))
    stub.push(Reply(content=json.dumps({"selected_memories": [str(freeze)]}), delay_s=20))
    t, box = _in_thread(lambda: d.call("memory.recall", {"cwd": str(repo),
                                                         "query": "release freeze"}))
    until(lambda: len(_recall_requests(stub)) > before, what="the slow selector to be sent")
    t0 = time.monotonic()
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "hello there"})
    t.join(timeout=10)
    assert time.monotonic() - t0 < 5  # liveness: the 20 s selector did not hold anyone
    assert "error" not in box, box
    r = box["result"]
    assert r["fell_back"] == "preempted" and r["strategy"] == "heuristic", r
    assert r["docs"] and r["docs"][0]["path"] == str(freeze)  # the lexical answer stands
    assert r["tiers"][-1]["name"] == "selector" and r["tiers"][-1]["status"] == "failed"
    assert _scheduler(d)["preempted"] == 1


def test_a_session_on_another_server_does_not_hold_side_queries(setup) -> None:  # type: ignore[no-untyped-def]
    d, stub, repo, freeze = setup
    sid = d.call("session.open", {"cwd": str(repo), "model": "cloud",
                                  "model_base_url": "https://api.example.invalid/v1"})["session_id"]
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "hello there"})
    stub.push(Reply(content=json.dumps({"selected_memories": [str(freeze)]})))
    r = d.call("memory.recall", {"cwd": str(repo), "query": "release freeze"})
    assert r["strategy"] == "model"
    assert _scheduler(d)["waits"] == 0 and _scheduler(d)["preempted"] == 0
