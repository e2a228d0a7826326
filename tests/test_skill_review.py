"""Skill review through the daemon with a scripted model playing the reviewer: the tool-call
threshold, staged drafts (list / accept / discard, through qwenctl too), the single-skill write
scope, the skills_edited and disabled gates, and writing straight into the project when
confirmation is off."""

from __future__ import annotations

import json
import os
import re
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

SKILL = ("---\nname: {name}\ndescription: Deploy the service to staging and check it\n---\n"
         "# Deploy\n1. make build\n2. make deploy ENV=staging\n3. curl the health endpoint\n")


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test"}


def is_reviewer(body: dict[str, Any]) -> bool:
    first = body.get("messages", [{}])[0]
    return first.get("role") == "system" and "skill reviewer" in str(first.get("content"))


def write_base(body: dict[str, Any]) -> Path:
    task = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    m = re.search(r"Write location \(the only place you may write\): (\S+)", task)
    assert m, task
    return Path(m.group(1))


def call(i: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, env={"COLUMNS": "300"})


def settings(path: Path, memory: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"memory": memory}))


def make_repo(home: Path, name: str) -> Path:
    repo = home / name
    (repo / ".git").mkdir(parents=True)
    return repo


def tool_turn(d: SpawnedDaemon, sid: str, text: str, calls: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """A user turn in which the main agent makes ``calls`` (one reply) and then answers."""
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
    if calls:
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": None, "tool_calls": calls}})
        d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": c["id"], "name": c["function"]["name"], "content": "ok"}
            for c in calls]})
    return d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "done"}})


def three_reads(repo: Path, prefix: str = "r") -> list[dict[str, Any]]:
    return [call(f"{prefix}1", "read_file", file_path=str(repo / "Makefile")),
            call(f"{prefix}2", "run_shell_command", command="make build"),
            call(f"{prefix}3", "run_shell_command", command="make deploy ENV=staging")]


def started_with_auto_skill(spawn, stub: ScriptedOpenAI) -> tuple[SpawnedDaemon, Path]:  # type: ignore[no-untyped-def]
    """A daemon whose user settings review after 3 tool calls, and a project ``~/repo``."""
    d: SpawnedDaemon = spawn(env=model_env(stub))
    settings(d.home / ".qwen" / "settings.json", {"enableAutoSkill": True,
                                                  "autoSkillToolCalls": 3})
    d.start()
    return d, make_repo(d.home, "repo")


@pytest.fixture
def stub():  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as s:
        s.handler = lambda body: Reply(content="ok")
        yield s


def test_draft_list_accept_discard(spawn, stub: ScriptedOpenAI) -> None:  # type: ignore[no-untyped-def]
    d, repo = started_with_auto_skill(spawn, stub)
    reviews: list[dict[str, Any]] = []
    names = iter(["deploy-staging", "release-notes"])

    def handler(body: dict[str, Any]) -> Reply:
        if not is_reviewer(body):
            return Reply(content="ok")
        reviews.append(body)
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="drafted one skill")
        base = write_base(body)
        name = next(names)
        return Reply(tool_calls=[
            call("w1", "write_file", file_path=str(base / name / "SKILL.md"),
                 content=SKILL.format(name=name)),
            call("w2", "write_file", file_path=str(base / "other" / "SKILL.md"), content="x"),
            call("w3", "write_file", file_path=str(repo / ".qwen" / "skills" / "x" / "SKILL.md"),
                 content="x"),
            call("w4", "write_file", file_path=str(base / "SKILL.md"), content="x")])

    stub.handler = handler
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
    # below the threshold: two tool calls, nothing runs
    rec = tool_turn(d, sid, "look around", three_reads(repo)[:2])
    assert rec["turn_complete"] and "skill-review" not in rec["scheduled"]
    rec = tool_turn(d, sid, "deploy to staging", three_reads(repo, "s")[:1])
    assert "skill-review" in rec["scheduled"]
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    assert len(reviews) == 2
    # the reviewer saw the session's procedure, and why its other writes were refused
    forked = json.dumps(reviews[0]["messages"][1:-1])
    assert "deploy to staging" in forked and "make build" in forked
    results = {m["tool_call_id"]: m["content"] for m in reviews[1]["messages"]
               if m.get("role") == "tool"}
    assert results["w1"].startswith("Created"), results
    assert "one skill per review" in results["w2"]
    assert results["w3"].startswith("Error: write refused")
    assert results["w4"].startswith("Error: write refused")
    assert {t["function"]["name"] for t in reviews[0]["tools"]} == {
        "read_file", "list_directory", "glob", "grep_search", "write_file", "edit"}

    drafts = d.call("skills.review.list", {"cwd": str(repo)})["drafts"]
    assert len(drafts) == 1
    draft = drafts[0]
    assert draft["name"] == "deploy-staging" and draft["updates_existing"] is False
    assert draft["description"] == "Deploy the service to staging and check it"
    assert draft["session_id"] == sid and draft["problem"] is None
    staging = d.home / ".local" / "state" / "qwenctxd" / "skill-drafts"
    assert Path(draft["path"]) == (staging / re.sub(r"[^a-zA-Z0-9]", "-", str(repo))
                                   / draft["id"] / "deploy-staging" / "SKILL.md")
    assert not (repo / ".qwen" / "skills").exists()  # the project is untouched
    log = d.call("memory.log", {"limit": 10})["entries"]
    assert [(e["agent"], e["action"], e["path"]) for e in log] == [
        ("skill-review", "create", draft["path"])]
    # the count restarts after a review
    rec = tool_turn(d, sid, "again", three_reads(repo, "t")[:1])
    assert "skill-review" not in rec["scheduled"]

    human = qwenctl(d, "skills", "review", "--cwd", str(repo))
    assert human.returncode == 0, human.stderr
    row = next(ln for ln in human.stdout.splitlines() if draft["id"] in ln)
    assert "deploy-staging" in row and "Deploy the service" in row
    as_json = json.loads(qwenctl(d, "skills", "review", "--cwd", str(repo), "--json").stdout)
    assert [x["id"] for x in as_json["drafts"]] == [draft["id"]]

    acc = qwenctl(d, "skills", "review", "accept", draft["id"], "--cwd", str(repo))
    assert acc.returncode == 0, acc.stderr
    installed = repo / ".qwen" / "skills" / "deploy-staging" / "SKILL.md"
    assert str(installed) in acc.stdout
    assert installed.read_text() == SKILL.format(name="deploy-staging")
    assert not Path(draft["path"]).exists()
    assert d.call("skills.review.list", {"cwd": str(repo)})["drafts"] == []

    def listed() -> dict[str, Any] | None:
        skills = d.call("skills.list", {"cwd": str(repo)})["skills"]
        return next((s for s in skills if s["name"] == "deploy-staging"), None)

    got = until(listed, what="the accepted skill in the listing")
    assert got["level"] == "project" and got["path"] == str(installed)
    log = d.call("memory.log", {"limit": 1})["entries"]
    assert (log[0]["agent"], log[0]["action"], log[0]["path"]) == (
        "skill-review", "create", str(installed))
    again = qwenctl(d, "skills", "review", "accept", draft["id"], "--cwd", str(repo))
    assert again.returncode == 1 and "no skill draft" in again.stderr

    # a manual run ignores the count; its draft is discarded
    assert d.call("skills.review.run", {"session_id": sid}) == {"scheduled": True,
                                                                 "reason": None}
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    drafts = d.call("skills.review.list", {"cwd": str(repo)})["drafts"]
    assert [x["name"] for x in drafts] == ["release-notes"]
    out = qwenctl(d, "skills", "review", "discard", drafts[0]["id"], "--cwd", str(repo),
                  "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == {"ok": True}
    assert d.call("skills.review.list", {"cwd": str(repo)})["drafts"] == []
    assert not Path(drafts[0]["path"]).parent.parent.exists()
    assert not (repo / ".qwen" / "skills" / "release-notes").exists()


def test_gates_skills_edited_disabled_and_direct_writes(spawn, stub: ScriptedOpenAI) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub))
    settings(d.home / ".qwen" / "settings.json", {"enableAutoSkill": True,
                                                  "autoSkillToolCalls": 3})
    edited = make_repo(d.home, "edited")
    off = make_repo(d.home, "off")
    settings(off / ".qwen" / "settings.json", {"enableAutoSkill": False})
    direct = make_repo(d.home, "direct")
    settings(direct / ".qwen" / "settings.json", {"autoSkillConfirm": False})
    d.start()
    reviews: list[dict[str, Any]] = []

    def handler(body: dict[str, Any]) -> Reply:
        if not is_reviewer(body):
            return Reply(content="ok")
        reviews.append(body)
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="wrote the skill")
        base = write_base(body)
        return Reply(tool_calls=[call("w1", "write_file", file_path=str(
            base / "deploy-staging" / "SKILL.md"), content=SKILL.format(name="deploy-staging"))])

    stub.handler = handler

    # the session itself wrote a skill → skills_edited
    sid = d.call("session.open", {"cwd": str(edited), "model": "stub-model"})["session_id"]
    calls = [*three_reads(edited)[:2], call("e1", "write_file", content="---\n",
                                            file_path=".qwen/skills/mine/SKILL.md")]
    rec = tool_turn(d, sid, "write me a skill", calls)
    assert "skill-review" not in rec["scheduled"]
    assert d.call("skills.review.run", {"session_id": sid}) == {
        "scheduled": False, "reason": "skills_edited"}

    # disabled for this project
    sid = d.call("session.open", {"cwd": str(off), "model": "stub-model"})["session_id"]
    rec = tool_turn(d, sid, "deploy", three_reads(off))
    assert "skill-review" not in rec["scheduled"]
    assert d.call("skills.review.run", {"session_id": sid}) == {
        "scheduled": False, "reason": "disabled"}
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    assert reviews == []

    # confirmation off: straight into the project's .qwen/skills, audited, no draft
    sid = d.call("session.open", {"cwd": str(direct), "model": "stub-model"})["session_id"]
    rec = tool_turn(d, sid, "deploy", three_reads(direct))
    assert "skill-review" in rec["scheduled"]
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    assert write_base(reviews[0]) == direct / ".qwen" / "skills"
    target = direct / ".qwen" / "skills" / "deploy-staging" / "SKILL.md"
    assert target.read_text() == SKILL.format(name="deploy-staging")
    assert d.call("skills.review.list", {"cwd": str(direct)})["drafts"] == []
    log = d.call("memory.log", {"limit": 1})["entries"]
    assert (log[0]["agent"], log[0]["path"]) == ("skill-review", str(target))
    assert d.call("skills.review.list", {"cwd": str(off)})["drafts"] == []


def test_kill_9_mid_review_leaves_no_orphan_draft(spawn, stub: ScriptedOpenAI) -> None:  # type: ignore[no-untyped-def]
    d, repo = started_with_auto_skill(spawn, stub)

    def handler(body: dict[str, Any]) -> Reply:
        if not is_reviewer(body):
            return Reply(content="ok")
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="never seen", delay_s=30)  # the daemon dies meanwhile
        return Reply(tool_calls=[call("w1", "write_file", content=SKILL.format(name="half"),
                                      file_path=str(write_base(body) / "half" / "SKILL.md"))])

    stub.handler = handler
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
    assert "skill-review" in tool_turn(d, sid, "deploy", three_reads(repo))["scheduled"]
    staging = d.home / ".local" / "state" / "qwenctxd" / "skill-drafts"
    half = until(lambda: list(staging.glob("*/*/half/SKILL.md")),
                 what="the reviewer to write its half draft")
    assert d.call("skills.review.list", {"cwd": str(repo)})["drafts"] == []  # still running
    assert half[0].exists()
    d.kill9()
    again: SpawnedDaemon = spawn(root=d.root, env=model_env(stub))
    again.log_path = d.root / "again.log"
    again.start()
    # a finished draft of the same project survives the pruning of the orphan
    kept = half[0].parent.parent.parent / "1700000000-0123abcd"
    (kept / "kept").mkdir(parents=True)
    (kept / "kept" / "SKILL.md").write_text(SKILL.format(name="kept"))
    (kept / ".draft.json").write_text(json.dumps({"name": "kept", "created_at": 1.0}))
    drafts = again.call("skills.review.list", {"cwd": str(repo)})["drafts"]
    assert [x["name"] for x in drafts] == ["kept"]
    assert not half[0].parent.parent.exists()


# -- units --------------------------------------------------------------------------------------


def test_edited_skills_detection() -> None:
    from qwenctxd.agents.skill_review import edited_skills

    def msg(name: str, **args: Any) -> dict[str, Any]:
        return {"role": "assistant", "tool_calls": [call("1", name, **args)]}

    assert edited_skills([msg("write_file", file_path="/r/.qwen/skills/a/SKILL.md")])
    assert edited_skills([msg("edit", file_path=".agents/skills/a/SKILL.md")])
    assert edited_skills([msg("write_file", path="/home/u/.qwen/skills/x/notes.md")])
    assert not edited_skills([msg("read_file", file_path="/r/.qwen/skills/a/SKILL.md")])
    assert not edited_skills([msg("write_file", file_path="/r/src/skills/a.py")])
    assert not edited_skills([{"role": "user", "content": "edit .qwen/skills/a/SKILL.md"}])


def test_single_skill_scope(tmp_path: Path) -> None:
    from qwenctxd.agents.skill_review import _SingleSkillScope

    base = tmp_path / "drafts" / "123-abc"
    scope = _SingleSkillScope(writable_roots=[base])
    assert not scope.check_write(base / "SKILL.md").allowed
    assert not scope.check_write(base / "Bad Name" / "SKILL.md").allowed
    assert scope.check_write(base / "good" / "SKILL.md").allowed
    assert scope.check_write(base / "good" / "scripts" / "run.sh").allowed
    v = scope.check_write(base / "other" / "SKILL.md")
    assert not v.allowed and "one skill per review" in v.reason
    assert not scope.check_write(tmp_path / "elsewhere" / "good" / "SKILL.md").allowed


def test_accept_refuses_bad_drafts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qwenctxd.agents.audit import AuditLog
    from qwenctxd.agents.skill_review import MARKER, SkillReviewer, drafts_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "repo"
    root.mkdir()
    reviewer = SkillReviewer(audit=AuditLog(tmp_path / "audit"))

    def draft(draft_id: str, name: str, text: str) -> None:
        d = drafts_dir(root) / draft_id
        (d / name).mkdir(parents=True)
        (d / name / "SKILL.md").write_text(text)
        (d / MARKER).write_text(json.dumps({"name": name, "created_at": 1.0}))

    draft("1700000000-aaaaaaaa", "Bad Name", SKILL.format(name="bad"))
    draft("1700000001-bbbbbbbb", "nofront", "just text\n")
    draft("1700000002-cccccccc", "ok-skill", SKILL.format(name="ok-skill"))
    os.makedirs(drafts_dir(root) / "1700000003-dddddddd" / "half")  # no marker: in progress
    listed = reviewer.list_drafts(root)
    assert [x.id for x in listed] == ["1700000000-aaaaaaaa", "1700000001-bbbbbbbb",
                                      "1700000002-cccccccc"]
    assert listed[0].problem and listed[1].problem and listed[2].problem is None
    with pytest.raises(ValueError, match="bad skill name"):
        reviewer.accept(root, "1700000000-aaaaaaaa")
    with pytest.raises(ValueError, match="not a valid skill"):
        reviewer.accept(root, "1700000001-bbbbbbbb")
    for bad in ("1700000003-dddddddd", "../x", "nope"):
        with pytest.raises(KeyError):
            reviewer.accept(root, bad)
    path = reviewer.accept(root, "1700000002-cccccccc")
    assert path == root / ".qwen" / "skills" / "ok-skill" / "SKILL.md" and path.exists()
    entries = reviewer.audit.entries() if reviewer.audit else []
    assert [(e.agent, e.path) for e in entries] == [("skill-review", str(path))]
    reviewer.discard(root, "1700000000-aaaaaaaa")
    with pytest.raises(KeyError):
        reviewer.discard(root, "1700000000-aaaaaaaa")
