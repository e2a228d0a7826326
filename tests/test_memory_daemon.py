"""Auto memory through the daemon (in-process, or spawned with a scripted model): layout,
recall (model and lexical), prefetch timing in session turns, team-memory secret guard,
two-step forget."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.paths import project_slug
from qwenctxd.testing.inprocess import InProcessDaemon
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon, wait_until
from qwenctxd.testing.wait import until


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}


def repo_in(home: Path, name: str = "repo") -> Path:
    repo = home / name
    (repo / ".git").mkdir(parents=True, exist_ok=True)
    return repo


def remember(root: Path, type_: str, slug: str, name: str, description: str, body: str) -> Path:
    path = root / type_ / f"{slug}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\ntype: {type_}\n---\n{body}\n")
    return path


def is_recall(body: dict[str, Any]) -> bool:
    return "Available memories" in json.dumps(body.get("messages", []))


@pytest.fixture
def daemon(inprocess_daemon: InProcessDaemon) -> InProcessDaemon:
    """This module's handler tests need no process: they run on the in-process daemon."""
    return inprocess_daemon


def test_layout_and_scaffold(daemon: InProcessDaemon) -> None:
    repo = repo_in(daemon.home)
    st = daemon.call("memory.status", {"cwd": str(repo)})
    project = Path(st["roots"]["project"])
    assert project == daemon.home / ".qwen" / "projects" / project_slug(repo) / "memory"
    assert Path(st["roots"]["user"]) == daemon.home / ".qwen" / "memories"
    assert st["roots"]["team"] is None
    for t in ("user", "feedback", "project", "reference"):
        assert (project / t).is_dir()
    assert (project / "MEMORY.md").exists() and (project.parent / "meta.json").exists()
    before = {p: p.stat().st_mtime_ns for p in project.parent.rglob("*") if p.is_file()}
    daemon.call("memory.status", {"cwd": str(repo)})
    # a worktree (a .git file) gets its own memory dir; the scaffold is idempotent
    wt = daemon.home / "wt"
    wt.mkdir()
    (wt / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n")
    st2 = daemon.call("memory.status", {"cwd": str(wt)})
    assert Path(st2["roots"]["project"]).parent.name == project_slug(wt)
    assert {p: p.stat().st_mtime_ns for p in project.parent.rglob("*") if p.is_file()} == before


def _seed(d: SpawnedDaemon | InProcessDaemon, repo: Path) -> tuple[Path, Path, Path]:
    st = d.call("memory.status", {"cwd": str(repo)})
    project = Path(st["roots"]["project"])
    user = Path(st["roots"]["user"])
    a = remember(project, "project", "release", "Release freeze",
                 "release freeze starts every Thursday at noon",
                 "No merges to main after Thursday noon.\n**Why:** QA needs a stable branch.")
    b = remember(user, "user", "tabs", "Indentation preference",
                 "user prefers tabs over spaces in Go code", "Always use tabs in Go files.")
    c = remember(project, "reference", "dashboard", "Grafana dashboard",
                 "latency dashboard for the checkout service", "https://grafana.example/d/checkout")
    until(lambda: len(d.call("memory.list", {"cwd": str(repo)})["docs"]) >= 3,
          what="the three memory files to be indexed")
    return a, b, c


def test_lexical_recall_without_a_model(daemon: InProcessDaemon) -> None:
    repo = repo_in(daemon.home)
    a, b, _ = _seed(daemon, repo)
    r = daemon.call("memory.recall", {"cwd": str(repo), "query": "when is the release freeze?"})
    assert r["strategy"] == "heuristic"
    assert r["docs"][0]["path"] == str(a)
    assert "## Relevant memory" in r["prompt"] and "Saved today." in r["prompt"]
    listed = {x["path"]: x for x in daemon.call("memory.list", {"cwd": str(repo)})["docs"]}
    assert listed[str(a)]["hits"] == 1 and listed[str(b)]["scope"] == "user"


def test_chinese_recall(daemon: InProcessDaemon) -> None:
    repo = repo_in(daemon.home)
    st = daemon.call("memory.status", {"cwd": str(repo)})
    zh = remember(Path(st["roots"]["project"]), "project", "deploy", "部署流程",
                  "生产环境部署需要先通知运维", "每次部署前在群里通知运维同事。")
    until(lambda: daemon.call("memory.list", {"cwd": str(repo)})["docs"],
          what="the Chinese memory file to be indexed")
    r = daemon.call("memory.recall", {"cwd": str(repo), "query": "怎么部署"})
    assert [x["path"] for x in r["docs"]] == [str(zh)]


def test_model_recall_sees_headers_only_and_falls_back(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = repo_in(d.home)
        a, b, c = _seed(d, repo)
        stub.push(Reply(content=json.dumps({"selected_memories": [str(c), "/not/a/memory.md"]})))
        r = d.call("memory.recall", {"cwd": str(repo), "query": "where do I see checkout latency"})
        assert r["strategy"] == "model" and [x["path"] for x in r["docs"]] == [str(c)]
        sent = json.dumps(stub.requests[-1].body)
        assert str(c) in sent and "grafana.example" not in sent  # headers, no bodies
        assert stub.requests[-1].body.get("temperature") == 0
        # a model error falls back to lexical
        stub.push(Reply(fault="http_500"))
        r = d.call("memory.recall", {"cwd": str(repo), "query": "release freeze"})
        assert r["strategy"] == "heuristic" and r["docs"][0]["path"] == str(a)
        assert r["fell_back"]


def test_prefetch_slow_model_arrives_on_the_next_tool_turn(spawn) -> None:  # type: ignore[no-untyped-def]
    """A selector slower than the user turn's grace: the turn does not wait for it and still
    carries the lexical hit (recall is never worse with a model than without); what the
    selector chose beyond that arrives on the next tool-results turn."""
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = repo_in(d.home)
        a, _, c = _seed(d, repo)
        project = Path(d.call("memory.status", {"cwd": str(repo)})["roots"]["project"])
        # more candidates than a turn delivers (5): the selector sees them all (its top 20)
        # and may choose one the fused order left out
        extra = [remember(project, "project", f"freeze-{i}", f"Calendar note {i}",
                          f"team calendar entry {i} mentions the freeze",
                          f"Calendar entry {i}.") for i in range(6)]
        until(lambda: len(d.call("memory.list", {"cwd": str(repo)})["docs"]) >= 9,
              what="the extra memory files to be indexed")
        stub.push(Reply(content=json.dumps({"selected_memories": [str(a)]})))
        d.call("memory.recall", {"cwd": str(repo), "query": "release freeze"})  # openai import
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        stub.push(Reply(content=json.dumps({"selected_memories": [str(e) for e in extra[:5]]}),
                        delay_s=1.5))
        t0 = time.monotonic()
        p = d.call("session.turn", {"session_id": sid, "kind": "user",
                                    "text": "is there a release freeze?"})
        assert time.monotonic() - t0 < 1.2  # never waits for the (1.5 s) recall
        mem = [r for r in p["reminders"] if r["kind"] == "memory"]
        assert len(mem) == 1 and "Release freeze" in mem[0]["text"]  # the fused answer
        first = {i for i in range(6) if f"Calendar note {i}" in mem[0]["text"]}
        assert len(first) == 4  # five delivered: the release freeze and four notes
        assert "Grafana" not in mem[0]["text"]
        late = {i for i in range(5) if i not in first}  # what the selector chose beyond them
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": None, "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "glob", "arguments": "{}"}}]}})
        wait_until(lambda: not [t for t in d.call("daemon.status")["background"]["in_flight"]
                                if t["kind"] == "recall"], what="the slow recall to land")
        p = d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": "t1", "name": "glob", "content": "a.py"}]})
        mem = [r for r in p["reminders"] if r["kind"] == "memory"]
        # the selector's picks beyond the first answer; those already delivered are not repeated
        assert late and len(mem) == 1
        assert {i for i in range(6) if f"Calendar note {i}" in mem[0]["text"]} == late
        assert "Release freeze" not in mem[0]["text"]
        assert p["reminders"][-1]["kind"] == "memory"  # pushed at the end
        assert p["messages"][-1]["role"] == "user" and "Calendar note" in json.dumps(
            p["messages"][-1])


def test_prefetch_instant_model_arrives_on_the_user_turn(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub))
        repo = repo_in(d.home)
        # the default 50 ms grace fits an instant model on a quiet machine; give a busy CI
        # machine room, which still proves the recall rides on the user turn itself
        (repo / ".qwen").mkdir()
        (repo / ".qwen" / "settings.json").write_text(
            json.dumps({"memory": {"prefetchGraceMs": 2000}}))
        d.start()
        a, _, _ = _seed(d, repo)
        stub.push(Reply(content=json.dumps({"selected_memories": [str(a)]})))
        d.call("memory.recall", {"cwd": str(repo), "query": "warm the client"})  # openai import
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        stub.push(Reply(content=json.dumps({"selected_memories": [str(a)]})))
        p = d.call("session.turn", {"session_id": sid, "kind": "user",
                                    "text": "is there a release freeze?"})
        assert p["reminders"][0]["kind"] == "memory"  # unshifted: first
        first = p["messages"][-1]["content"]
        assert "Release freeze" in first[0]["text"] and first[-1]["text"].startswith("is there")


def test_team_secret_guard_and_symlink_decoy(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    settings = d.home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{"memory": {"enableTeamMemory": true}}')
    d.start()
    repo = repo_in(d.home)
    team = repo / ".qwen" / "team-memory"
    secret = "token ghp_" + "a1B2c3D4e5" * 3 + "a1B2c3"
    r = d.call("memory.check_write", {"cwd": str(repo), "path": str(team / "project" / "x.md"),
                                      "content": secret})
    assert r["verdict"] == "refuse" and "cannot be written to team memory" in r["reason"]
    assert {k: r[k] for k in ("allowed", "scope", "rules")} == {
        "allowed": False, "scope": "team",
        "rules": [{"id": "github-pat", "label": r["rules"][0]["label"]}]}
    assert "ghp_" not in json.dumps(r)
    ok = d.call("memory.check_write", {"cwd": str(repo), "path": str(team / "project" / "x.md"),
                                       "content": "use the staging cluster for load tests"})
    assert ok["allowed"] is True
    # a dangling symlink elsewhere in the repo pointing into team memory is still team
    decoy = repo / "notes.md"
    os.symlink(team / "project" / "not-yet.md", decoy)
    r = d.call("memory.check_write", {"cwd": str(repo), "path": str(decoy), "content": secret})
    assert r["allowed"] is False and r["scope"] == "team"
    private = d.call("memory.check_write", {"cwd": str(repo), "path": str(repo / "plain.md"),
                                            "content": secret})
    assert private["allowed"] is True and private["rules"] == []


def test_forget_in_two_steps(daemon: InProcessDaemon) -> None:
    repo = repo_in(daemon.home)
    a, b, c = _seed(daemon, repo)
    project = a.parent.parent
    index = project / "MEMORY.md"
    cands = daemon.call("memory.forget_candidates", {"cwd": str(repo), "query": "tabs"})
    assert [x["path"] for x in cands["candidates"]] == [str(b)]
    assert b.exists()  # nothing removed yet
    r = daemon.call("memory.forget", {"cwd": str(repo), "paths": [str(b)]})
    assert r["removed"] == [str(b)] and not b.exists() and a.exists() and c.exists()
    with pytest.raises(RemoteError) as exc:
        daemon.call("memory.forget", {"cwd": str(repo), "paths": ["/etc/passwd"]})
    assert exc.value.code == -32003
    assert Path("/etc/passwd").exists()
    assert str(b) not in [x["path"] for x in daemon.call("memory.list", {"cwd": str(repo)})["docs"]]
    assert "tabs" not in (project.parent.parent.parent / "memories" / "MEMORY.md").read_text()
    assert index.exists()


def test_memory_section_in_the_system_prompt(daemon: InProcessDaemon) -> None:
    repo = repo_in(daemon.home)
    text = daemon.call("prompt.system", {"cwd": str(repo)})["text"]
    assert "# auto memory" in text and "MEMORY.md" in text
    st = daemon.call("memory.status", {"cwd": str(repo)})
    index = Path(st["roots"]["project"]) / "MEMORY.md"
    index.write_text("- [Release freeze](project/release.md) — Thursdays at noon\n")
    until(lambda: "Release freeze](project/release.md)" in daemon.call(
        "prompt.system", {"cwd": str(repo)})["text"], what="the MEMORY.md edit in the prompt")
    sections = [s["name"] for s in daemon.call("prompt.system", {"cwd": str(repo)})["sections"]]
    assert "memory" in sections


def test_model_timeout_falls_back_within_the_timeout(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env={**model_env(stub), "QWENCTXD_MODEL_TIMEOUT_S": "1"}).start()
        repo = repo_in(d.home)
        a, _, _ = _seed(d, repo)
        # warm up (the openai import) until a model answer arrives: on a loaded machine the
        # first call may time out before its request is sent, leaving its reply queued
        deadline = time.monotonic() + 30
        while True:
            if stub.pending == 0:
                stub.push(Reply(content=json.dumps({"selected_memories": [str(a)]})))
            warm = d.call("memory.recall", {"cwd": str(repo), "query": "release freeze"})
            if warm["strategy"] == "model":
                break
            assert time.monotonic() < deadline, warm
        assert stub.pending == 0
        stub.push(Reply(fault="slow", delay_s=5))
        t0 = time.monotonic()
        r = d.call("memory.recall", {"cwd": str(repo), "query": "release freeze"})
        assert time.monotonic() - t0 < 3
        assert r["strategy"] == "heuristic" and r["fell_back"] == "timeout"
        assert r["docs"][0]["path"] == str(a)


def test_a_one_character_cjk_query_recalls_nothing(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d = spawn(env=model_env(stub)).start()
        repo = repo_in(d.home)
        st = d.call("memory.status", {"cwd": str(repo)})
        project = Path(st["roots"]["project"])
        remember(project, "project", "deploy", "部署流程", "生产环境部署需要先通知运维",
                 "每次部署前在群里通知运维同事。")
        remember(project, "project", "ninsho", "認証の手順", "認証サーバーの設定", "認証は毎朝確認する。")
        remember(project, "project", "baepo", "배포 절차", "배포 전에 공지", "배포는 금요일 금지.")
        until(lambda: len(d.call("memory.list", {"cwd": str(repo)})["docs"]) >= 3,
              what="the three CJK memory files to be indexed")
        before = len(stub.chat_requests)
        for q in ("部", "認", "배"):
            r = d.call("memory.recall", {"cwd": str(repo), "query": q})
            assert r["docs"] == [], (q, r)
        assert len(stub.chat_requests) == before  # noise never reaches the selector model
        # two characters are a word again
        assert d.call("memory.recall", {"cwd": str(repo), "query": "部署"})["docs"]
