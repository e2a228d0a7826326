"""Every agent-driven feature against a broken endpoint, through the socket of a spawned daemon.

For each of extraction (``memory.extract``), dream (``memory.dream {force: true}``), skill
review (``skills.review.run``), speculation (``speculation.start``), recall
(``memory.recall``) and forget (``memory.forget_candidates``), parametrized over the faults of
the scripted server — a hang past the deadline (``slow``), HTTP 500, a cut stream, a non-JSON
body, a dropped connection — and over garbage a live model can send — a reply of random text,
a tool call whose arguments are not JSON, a call of a tool that does not exist: the feature
reaches a defined result (a failed run with its cause, a documented fallback, or a no-op)
within its configured deadline (``[model.deadlines]`` in config.toml, small here), a background
failure is counted in ``daemon.status`` with its cause, nothing is written to the memory or
skill directories, and the daemon keeps answering.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

DEADLINE_S = 2.0
SLACK_S = 6.0  # a generous liveness bound on a loaded machine, on top of the deadline
FEATURES = ("recall", "forget", "extract", "dream", "skill_review", "speculation")

#: endpoint faults → the cause the daemon reports (a model error reason)
ENDPOINT_FAULTS: dict[str, tuple[Reply, set[str]]] = {
    "hang": (Reply(fault="slow", delay_s=30), {"timeout"}),
    "http_500": (Reply(fault="http_500"), {"http_500"}),
    "cut_stream": (Reply(fault="cut_stream"), {"stream_cut", "connection", "invalid_json"}),
    "invalid_json": (Reply(fault="invalid_json"), {"invalid_json"}),
    "drop": (Reply(fault="drop"), {"connection"}),
}
#: garbage a model can answer with; the run ends normally (nothing learned, nothing written)
GARBAGE: dict[str, Reply] = {
    "random_text": Reply(content="zq8 ~~ lorem }{ \x07 ][ 42 ñ " * 20),
    "bad_tool_args": Reply(tool_calls=[{"id": "g1", "type": "function", "function": {
        "name": "write_file", "arguments": '{"file_path": "x.md", "content": "unterminated'}}]),
    "unknown_tool": Reply(tool_calls=[{"id": "g2", "type": "function", "function": {
        "name": "frobnicate_everything", "arguments": "{}"}}]),
}
FAULTS = [*ENDPOINT_FAULTS, *GARBAGE]


def reply_for(fault: str) -> Reply:
    return ENDPOINT_FAULTS[fault][0] if fault in ENDPOINT_FAULTS else GARBAGE[fault]


def tree_hash(*roots: Path) -> dict[str, str]:
    """Path → sha256 of every file under ``roots`` (missing roots contribute nothing)."""
    out: dict[str, str] = {}
    for root in roots:
        for p in sorted(root.rglob("*")) if root.exists() else []:
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


class Rig:
    """A spawned daemon with small feature deadlines whose every model request gets ``fault``,
    and a git project ``~/repo`` with one project memory."""

    def __init__(self, spawn: Any, stub: ScriptedOpenAI, fault: str,
                 memory_settings: dict[str, Any] | None = None) -> None:
        self.fault = fault
        stub.handler = lambda body: reply_for(fault)
        d: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": stub.base_url,
                                      "OPENAI_MODEL": "stub-model", "OPENAI_API_KEY": "k",
                                      "QWENCTXD_FAST_MODEL": "stub-fast"})
        conf = d.home / ".config" / "qwenctxd" / "config.toml"
        conf.parent.mkdir(parents=True)
        conf.write_text("[model.deadlines]\n" + "".join(f"{f}_s = {DEADLINE_S}\n"
                                                         for f in FEATURES))
        settings = d.home / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True)
        settings.write_text(json.dumps({"memory": {"enableAutoSkill": True,
                                                   "autoSkillToolCalls": 1000,
                                                   **(memory_settings or {})}}))
        self.d = d.start()
        self.stub = stub
        self.repo = d.home / "repo"
        (self.repo / ".git").mkdir(parents=True)
        (self.repo / "app.py").write_text("print('hi')\n")
        roots = d.call("memory.status", {"cwd": str(self.repo)})["roots"]
        self.project_mem, self.user_mem = Path(roots["project"]), Path(roots["user"])
        self.memory = self.project_mem / "project" / "release.md"
        self.memory.write_text("---\nname: Release freeze\ndescription: the release freeze "
                               "starts every Thursday\ntype: project\n---\nNo merges on "
                               "Thursdays after noon.\n")
        deadline = time.monotonic() + 10
        while not d.call("memory.list", {"cwd": str(self.repo)})["docs"]:
            assert time.monotonic() < deadline, "the seeded memory never showed up"
            time.sleep(0.05)
        assert d.call("daemon.status")["model"]["deadlines"]["extract"] == DEADLINE_S
        # the first model call imports the openai package, which a cold start on a loaded
        # machine can take longer than the small deadlines: warm it up before measuring
        d.call("memory.recall", {"cwd": str(self.repo), "query": "warm up"})
        while not d.call("daemon.status")["model"]["imported"]:
            assert time.monotonic() < deadline + 20, "the openai client never loaded"
            time.sleep(0.05)

    def guarded(self) -> dict[str, str]:
        """Everything a failed run must leave alone: memory roots, skill dirs and drafts."""
        return tree_hash(self.project_mem, self.user_mem, self.repo / ".qwen",
                         self.d.home / ".qwen" / "skills",
                         self.d.home / ".local" / "state" / "qwenctxd" / "skill-drafts")

    def session(self) -> str:
        """A session with one finished user turn (its own extraction is scheduled too)."""
        sid = self.d.call("session.open", {"cwd": str(self.repo),
                                           "model": "stub-model"})["session_id"]
        self.d.call("session.turn", {"session_id": sid, "kind": "user",
                                     "text": "print hello from app.py"})
        self.d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "Done: app.py prints hi."}})
        return sid

    def drain(self) -> None:
        drained = self.d.call("daemon.drain", {"timeout_s": 30})
        assert drained["drained"] is True, (drained, self.d.log_text()[-3000:])

    def background(self) -> dict[str, Any]:
        bg: dict[str, Any] = self.d.call("daemon.status")["background"]
        return bg

    def agent_saw(self) -> list[dict[str, Any]]:
        """The bodies of the requests the agents made (the system prompt is the agent's)."""
        return [r.body for r in self.stub.chat_requests
                if any(m.get("role") == "tool" for m in r.body.get("messages", []))]

    def assert_failed_run(self, kind: str, started: float) -> None:
        """A background ``kind`` run failed with the fault's cause, and said so in time."""
        took = time.monotonic() - started
        assert took < DEADLINE_S + SLACK_S, took
        causes = ENDPOINT_FAULTS[self.fault][1]
        bg = self.background()
        assert bg["failed_by_kind"].get(kind, 0) >= 1, bg
        failures = [f for f in bg["recent_failures"] if f["kind"] == kind]
        assert failures and all(f["cause"] in causes for f in failures), (causes, failures)

    def assert_alive(self) -> None:
        assert self.d.call("daemon.ping") == "pong"
        assert self.d.call("memory.list", {"cwd": str(self.repo)})["docs"]


@pytest.fixture
def stub() -> Any:
    with ScriptedOpenAI() as s:
        yield s


def garbage_tool_errors(rig: Rig) -> None:
    """For a garbage tool call, the model was told its call failed (the tool never ran)."""
    if rig.fault not in ("bad_tool_args", "unknown_tool"):
        return
    results = [m["content"] for body in rig.agent_saw() for m in body["messages"]
               if m.get("role") == "tool" and m.get("tool_call_id") in ("g1", "g2")]
    assert results and all(r.startswith("Error:") for r in results), results


@pytest.mark.parametrize("fault", FAULTS)
def test_extraction(spawn, stub: ScriptedOpenAI, fault: str) -> None:  # type: ignore[no-untyped-def]
    rig = Rig(spawn, stub, fault)
    before = rig.guarded()
    sid = rig.session()
    rig.drain()  # the turn's own extraction
    started = time.monotonic()
    assert rig.d.call("memory.extract", {"session_id": sid})["scheduled"] is (
        fault in ENDPOINT_FAULTS)  # after a no-op run the cursor moved: nothing new
    rig.drain()
    if fault in ENDPOINT_FAULTS:
        rig.assert_failed_run("extract", started)
        assert rig.background()["last_extract_at"] is None
    else:
        bg = rig.background()
        assert bg["failed_by_kind"].get("extract", 0) == 0, bg
        assert bg["last_extract_at"] is not None
        garbage_tool_errors(rig)
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_dream(spawn, stub: ScriptedOpenAI, fault: str) -> None:  # type: ignore[no-untyped-def]
    rig = Rig(spawn, stub, fault)
    before = rig.guarded()
    started = time.monotonic()
    assert rig.d.call("memory.dream", {"cwd": str(rig.repo), "force": True})["scheduled"]
    rig.drain()
    st = rig.d.call("memory.status", {"cwd": str(rig.repo)})
    assert st["lock"] is None
    if fault in ENDPOINT_FAULTS:
        rig.assert_failed_run("dream", started)
        assert st["last_dream_at"] is None and rig.background()["last_dream_at"] is None
    else:
        assert rig.background()["failed_by_kind"].get("dream", 0) == 0
        assert st["last_dream_at"] is not None
        garbage_tool_errors(rig)
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_skill_review(spawn, stub: ScriptedOpenAI, fault: str) -> None:  # type: ignore[no-untyped-def]
    rig = Rig(spawn, stub, fault)
    before = rig.guarded()
    sid = rig.session()
    rig.drain()
    started = time.monotonic()
    assert rig.d.call("skills.review.run", {"session_id": sid}) == {"scheduled": True,
                                                                     "reason": None}
    rig.drain()
    if fault in ENDPOINT_FAULTS:
        rig.assert_failed_run("skill-review", started)
    else:
        assert rig.background()["failed_by_kind"].get("skill-review", 0) == 0
        garbage_tool_errors(rig)
    assert rig.d.call("skills.review.list", {"cwd": str(rig.repo)})["drafts"] == []
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_speculation(spawn, stub: ScriptedOpenAI, fault: str) -> None:  # type: ignore[no-untyped-def]
    rig = Rig(spawn, stub, fault)
    sid = rig.session()
    rig.drain()
    before = rig.guarded()
    project = tree_hash(rig.repo)
    started = time.monotonic()
    spec = rig.d.call("speculation.start", {"session_id": sid,
                                            "suggestion": "add a docstring to app.py"})
    rig.drain()
    status = rig.d.call("speculation.status", spec)["status"]
    assert status["state"] == "ready", status
    if fault in ENDPOINT_FAULTS:
        assert status["outcome"] in ("failed", "timed_out"), status
        assert status["error"] in ENDPOINT_FAULTS[fault][1] | {None}, status
        rig.assert_failed_run("speculation", started)
    else:
        expected = {"random_text": "completed", "bad_tool_args": "turn_limit",
                    "unknown_tool": "boundary"}[fault]
        assert status["outcome"] == expected, status
        assert rig.background()["failed_by_kind"].get("speculation", 0) == 0
        if fault == "unknown_tool":
            assert status["boundary_tool"] == "frobnicate_everything"
    assert status["changed"] == [], status
    accepted = rig.d.call("speculation.accept", spec)
    assert accepted["applied"] == [] and accepted["conflicts"] == []
    assert tree_hash(rig.repo) == project and rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_recall_falls_back_to_the_lexical_index(spawn, stub: ScriptedOpenAI, fault: str) -> None:  # type: ignore[no-untyped-def]
    rig = Rig(spawn, stub, fault)
    before = rig.guarded()
    started = time.monotonic()
    r = rig.d.call("memory.recall", {"cwd": str(rig.repo), "query": "release freeze Thursday"})
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    assert r["strategy"] == "heuristic", r
    assert [x["path"] for x in r["docs"]] == [str(rig.memory)]
    assert "Release freeze" in r["prompt"]
    if fault in ENDPOINT_FAULTS:
        assert r["fell_back"] in ENDPOINT_FAULTS[fault][1], r
    else:
        assert r["fell_back"], r
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_forget_candidates_fall_back_to_term_matching(spawn, stub: ScriptedOpenAI, fault: str) -> None:  # type: ignore[no-untyped-def]
    rig = Rig(spawn, stub, fault)
    before = rig.guarded()
    started = time.monotonic()
    r = rig.d.call("memory.forget_candidates", {"cwd": str(rig.repo),
                                                "query": "the release freeze"})
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    assert [c["path"] for c in r["candidates"]] == [str(rig.memory)], r
    assert rig.memory.exists() and rig.guarded() == before  # candidates remove nothing
    rig.assert_alive()


SKILL = ("---\nname: deploy-staging\ndescription: Deploy to staging and check it\n---\n"
         "1. make build\n2. make deploy ENV=staging\n")
MEMORY = ("---\nname: Deploys\ndescription: deploys go through make deploy\ntype: project\n"
          "---\nUse make deploy.\n")


@pytest.mark.parametrize("fault", list(ENDPOINT_FAULTS))
@pytest.mark.parametrize("kind", ["extract", "dream", "skill-review"])
def test_a_run_failing_after_a_write_leaves_nothing(spawn, stub: ScriptedOpenAI, kind: str,  # type: ignore[no-untyped-def]
                                                    fault: str) -> None:
    """The agent writes a whole file in its first turn and the endpoint fails on the next: the
    run is counted failed with its cause, and its write is undone (through the audit log)."""
    rig = Rig(spawn, stub, fault, memory_settings={"autoSkillConfirm": False})
    target = {"extract": rig.project_mem / "project" / "deploys.md",
              "dream": rig.project_mem / "project" / "deploys.md",
              "skill-review": rig.repo / ".qwen" / "skills" / "deploy-staging" / "SKILL.md",
              }[kind]
    wrote: list[str] = []

    def handler(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if not body.get("tools") or last["role"] != "user" or wrote:
            return reply_for(fault)
        wrote.append(kind)
        return Reply(tool_calls=[{"id": "w1", "type": "function", "function": {
            "name": "write_file", "arguments": json.dumps({
                "file_path": str(target),
                "content": SKILL if kind == "skill-review" else MEMORY})}}])

    rig.stub.handler = handler
    before = rig.guarded()
    if kind == "dream":
        started = time.monotonic()
        assert rig.d.call("memory.dream", {"cwd": str(rig.repo), "force": True})["scheduled"]
    else:
        sid = rig.session()  # schedules the turn's own extraction
        if kind == "skill-review":
            rig.drain()
            wrote.clear()
            assert rig.d.call("skills.review.run", {"session_id": sid})["scheduled"] is True
        started = time.monotonic()
    rig.drain()
    assert wrote == [kind]
    rig.assert_failed_run(kind, started)
    assert not target.exists() and rig.guarded() == before
    if kind == "skill-review":
        assert not target.parent.exists()  # not even the empty skill folder
        deadline = time.monotonic() + 10  # the skills watcher sees the folder go
        while any(s["name"] == "deploy-staging"
                  for s in rig.d.call("skills.list", {"cwd": str(rig.repo)})["skills"]):
            assert time.monotonic() < deadline, "the undone skill is still listed"
            time.sleep(0.05)
    log = rig.d.call("memory.log", {})["entries"]
    mine = [e for e in log if e["path"] == str(target)]
    assert [e["action"] for e in mine] == ["create", "delete", "undo"], log  # then undone
    assert mine[2]["undoes"] == mine[0]["id"]
    rig.assert_alive()
