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

The cases share a few spawned daemons per module (one per deadline and settings: the hang
cases get a 1 s deadline to wait out), each case in a fresh git project of its own and
asserting on what the daemon's counters gained during the case.
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
from qwenctxd.testing.wait import until

DEADLINE_S = 2.0
HANG_DEADLINE_S = 1.0  # the hang cases wait their deadline out: keep it short
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


class SharedDaemon:
    """One spawned daemon (and the scripted server all its model requests go to) that the cases
    of this module share, each in a project of its own: small feature deadlines, auto-skill on,
    the openai client already imported (its cold import on a loaded machine can take longer than
    the small deadlines)."""

    def __init__(self, stub: ScriptedOpenAI, deadline_s: float,
                 memory_settings: dict[str, Any]) -> None:
        self.stub, self.deadline_s, self.cases = stub, deadline_s, 0
        d = SpawnedDaemon(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
                               "OPENAI_API_KEY": "k", "QWENCTXD_FAST_MODEL": "stub-fast"})
        self.d = d
        conf = d.home / ".config" / "qwenctxd" / "config.toml"
        conf.parent.mkdir(parents=True)
        conf.write_text("[model.deadlines]\n" + "".join(f"{f}_s = {deadline_s}\n"
                                                         for f in FEATURES))
        settings = d.home / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True)
        settings.write_text(json.dumps({"memory": {"enableAutoSkill": True,
                                                   "autoSkillToolCalls": 1000,
                                                   **memory_settings}}))
        d.start()
        assert d.call("daemon.status")["model"]["deadlines"]["extract"] == deadline_s
        warm = d.home / "warm-up"
        (warm / ".git").mkdir(parents=True)
        stub.handler = lambda body: GARBAGE["random_text"]
        d.call("memory.recall", {"cwd": str(warm), "query": "warm up"})
        until(lambda: d.call("daemon.status")["model"]["imported"], timeout=30,
              what="the openai client loaded")
        assert d.call("daemon.drain", {"timeout_s": 30})["drained"] is True


class Rig:
    """One case on a shared daemon whose every model request gets ``fault``: a fresh git
    project ``~/case-N`` with one project memory, and what the daemon had counted before the
    case (its counters are the daemon's, so a case asserts on what changed since)."""

    def __init__(self, shared: SharedDaemon, fault: str) -> None:
        self.fault, self.stub, self.d = fault, shared.stub, shared.d
        self.deadline_s = shared.deadline_s
        d = self.d
        self.drain()  # nothing of an earlier case is still running
        shared.cases += 1
        self.stub.handler = lambda body: reply_for(fault)
        self.repo = d.home / f"case-{shared.cases}"
        (self.repo / ".git").mkdir(parents=True)
        (self.repo / "app.py").write_text("print('hi')\n")
        roots = d.call("memory.status", {"cwd": str(self.repo)})["roots"]
        self.project_mem, self.user_mem = Path(roots["project"]), Path(roots["user"])
        self.memory = self.project_mem / "project" / "release.md"
        self.memory.write_text("---\nname: Release freeze\ndescription: the release freeze "
                               "starts every Thursday\ntype: project\n---\nNo merges on "
                               "Thursdays after noon.\n")
        until(lambda: d.call("memory.list", {"cwd": str(self.repo)})["docs"],
              what="the seeded memory listed")
        self.bg_before = self.background()
        self.requests_before = len(self.stub.chat_requests)

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

    def failed(self, kind: str) -> int:
        """How many ``kind`` runs failed during this case."""
        now = self.background()["failed_by_kind"].get(kind, 0)
        return int(now - self.bg_before["failed_by_kind"].get(kind, 0))

    def agent_saw(self) -> list[dict[str, Any]]:
        """The bodies of this case's requests the agents made (the system prompt is theirs)."""
        return [r.body for r in self.stub.chat_requests[self.requests_before:]
                if any(m.get("role") == "tool" for m in r.body.get("messages", []))]

    def assert_failed_run(self, kind: str, started: float) -> None:
        """A background ``kind`` run failed with the fault's cause, and said so in time."""
        took = time.monotonic() - started
        assert took < self.deadline_s + SLACK_S, took
        causes = ENDPOINT_FAULTS[self.fault][1]
        assert self.failed(kind) >= 1, self.background()
        earlier = {f["id"] for f in self.bg_before["recent_failures"]}
        failures = [f for f in self.background()["recent_failures"]
                    if f["kind"] == kind and f["id"] not in earlier]
        assert failures and all(f["cause"] in causes for f in failures), (causes, failures)

    def assert_alive(self) -> None:
        assert self.d.call("daemon.ping") == "pong"
        assert self.d.call("memory.list", {"cwd": str(self.repo)})["docs"]


@pytest.fixture(scope="module")
def shared_daemons() -> Any:
    """(deadline, memory settings) → the module's daemon for it, started on first use: the hang
    cases get the short deadline, the others the usual one; all are stopped after the module."""
    made: dict[str, SharedDaemon] = {}
    with ScriptedOpenAI() as stub:
        def get(deadline_s: float, memory_settings: dict[str, Any]) -> SharedDaemon:
            key = json.dumps([deadline_s, memory_settings], sort_keys=True)
            if key not in made:
                made[key] = SharedDaemon(stub, deadline_s, memory_settings)
            return made[key]
        try:
            yield get
        finally:
            for shared in made.values():
                shared.d.cleanup()


@pytest.fixture
def rig_for(shared_daemons: Any) -> Any:
    """``rig_for(fault, memory_settings=None)`` → a fresh case on the matching shared daemon."""
    def make(fault: str, memory_settings: dict[str, Any] | None = None) -> Rig:
        deadline = HANG_DEADLINE_S if fault == "hang" else DEADLINE_S
        return Rig(shared_daemons(deadline, memory_settings or {}), fault)
    return make


def garbage_tool_errors(rig: Rig) -> None:
    """For a garbage tool call, the model was told its call failed (the tool never ran)."""
    if rig.fault not in ("bad_tool_args", "unknown_tool"):
        return
    results = [m["content"] for body in rig.agent_saw() for m in body["messages"]
               if m.get("role") == "tool" and m.get("tool_call_id") in ("g1", "g2")]
    assert results and all(r.startswith("Error:") for r in results), results


@pytest.mark.parametrize("fault", FAULTS)
def test_extraction(rig_for: Any, fault: str) -> None:
    rig = rig_for(fault)
    before = rig.guarded()
    sid = rig.session()
    rig.drain()  # the turn's own extraction
    started = time.monotonic()
    assert rig.d.call("memory.extract", {"session_id": sid})["scheduled"] is (
        fault in ENDPOINT_FAULTS)  # after a no-op run the cursor moved: nothing new
    rig.drain()
    if fault in ENDPOINT_FAULTS:
        rig.assert_failed_run("extract", started)
        assert rig.background()["last_extract_at"] == rig.bg_before["last_extract_at"]
    else:
        assert rig.failed("extract") == 0, rig.background()
        assert rig.background()["last_extract_at"] not in (None,
                                                           rig.bg_before["last_extract_at"])
        garbage_tool_errors(rig)
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_dream(rig_for: Any, fault: str) -> None:
    rig = rig_for(fault)
    before = rig.guarded()
    started = time.monotonic()
    assert rig.d.call("memory.dream", {"cwd": str(rig.repo), "force": True})["scheduled"]
    rig.drain()
    st = rig.d.call("memory.status", {"cwd": str(rig.repo)})
    assert st["lock"] is None
    if fault in ENDPOINT_FAULTS:
        rig.assert_failed_run("dream", started)
        assert st["last_dream_at"] is None
        assert rig.background()["last_dream_at"] == rig.bg_before["last_dream_at"]
    else:
        assert rig.failed("dream") == 0
        assert st["last_dream_at"] is not None
        garbage_tool_errors(rig)
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_skill_review(rig_for: Any, fault: str) -> None:
    rig = rig_for(fault)
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
        assert rig.failed("skill-review") == 0
        garbage_tool_errors(rig)
    assert rig.d.call("skills.review.list", {"cwd": str(rig.repo)})["drafts"] == []
    assert rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_speculation(rig_for: Any, fault: str) -> None:
    rig = rig_for(fault)
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
        assert rig.failed("speculation") == 0
        if fault == "unknown_tool":
            assert status["boundary_tool"] == "frobnicate_everything"
    assert status["changed"] == [], status
    accepted = rig.d.call("speculation.accept", spec)
    assert accepted["applied"] == [] and accepted["conflicts"] == []
    assert tree_hash(rig.repo) == project and rig.guarded() == before
    rig.assert_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_recall_falls_back_to_the_lexical_index(rig_for: Any, fault: str) -> None:
    rig = rig_for(fault)
    before = rig.guarded()
    started = time.monotonic()
    r = rig.d.call("memory.recall", {"cwd": str(rig.repo), "query": "release freeze Thursday"})
    assert time.monotonic() - started < rig.deadline_s + SLACK_S
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
def test_forget_candidates_fall_back_to_term_matching(rig_for: Any, fault: str) -> None:
    rig = rig_for(fault)
    before = rig.guarded()
    started = time.monotonic()
    r = rig.d.call("memory.forget_candidates", {"cwd": str(rig.repo),
                                                "query": "the release freeze"})
    assert time.monotonic() - started < rig.deadline_s + SLACK_S
    assert [c["path"] for c in r["candidates"]] == [str(rig.memory)], r
    assert rig.memory.exists() and rig.guarded() == before  # candidates remove nothing
    rig.assert_alive()


SKILL = ("---\nname: deploy-staging\ndescription: Deploy to staging and check it\n---\n"
         "1. make build\n2. make deploy ENV=staging\n")
MEMORY = ("---\nname: Deploys\ndescription: deploys go through make deploy\ntype: project\n"
          "---\nUse make deploy.\n")


@pytest.mark.parametrize("fault", list(ENDPOINT_FAULTS))
@pytest.mark.parametrize("kind", ["extract", "dream", "skill-review"])
def test_a_run_failing_after_a_write_leaves_nothing(rig_for: Any, kind: str, fault: str
                                                    ) -> None:
    """The agent writes a whole file in its first turn and the endpoint fails on the next: the
    run is counted failed with its cause, and its write is undone (through the audit log)."""
    rig = rig_for(fault, memory_settings={"autoSkillConfirm": False})
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
        until(lambda: not any(s["name"] == "deploy-staging"  # the watcher sees the folder go
                              for s in rig.d.call("skills.list", {"cwd": str(rig.repo)})["skills"]),
              what="the undone skill no longer listed")
    log = rig.d.call("memory.log", {"limit": 1000})["entries"]
    mine = [e for e in log if e["path"] == str(target)]
    assert [e["action"] for e in mine] == ["create", "delete", "undo"], log  # then undone
    assert mine[2]["undoes"] == mine[0]["id"]
    rig.assert_alive()
