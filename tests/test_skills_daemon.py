"""Skills through the socket: levels and precedence, live watching at depth 2, errors,
conditional activation with cache-stable delivery, the listing budget."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def skill(base: Path, name: str, description: str, extra: str = "", body: str = "Do it.") -> Path:
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    path = d / "SKILL.md"
    path.write_text(f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}\n")
    return path


def listed(d: SpawnedDaemon, cwd: Path, **kw) -> dict:  # type: ignore[no-untyped-def]
    return d.call("skills.list", {"cwd": str(cwd), **kw})


def project(home: Path) -> Path:
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True, exist_ok=True)
    return repo


def test_precedence_sorting_and_a_broken_level(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    repo = project(d.home)
    skill(repo / ".qwen" / "skills", "review-checklist", "from project .qwen")
    skill(repo / ".agents" / "skills", "review-checklist", "from project .agents")
    skill(d.home / ".qwen" / "skills", "review-checklist", "from user")
    skill(d.home / ".qwen" / "skills", "alpha", "user alpha")
    skill(d.home / ".agents" / "skills", "zeta", "user zeta")
    blocked = d.home / ".agents" / "skills"
    os.chmod(blocked, 0)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv cannot make a directory unreadable")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    try:
        d.start(argv_prefix=prefix)
        r = listed(d, repo)
    finally:
        os.chmod(blocked, 0o755)
    by_name = {s["name"]: s for s in r["skills"]}
    assert by_name["review-checklist"]["description"] == "from project .qwen"
    assert by_name["review-checklist"]["level"] == "project"
    names = [s["name"] for s in r["skills"]]
    assert names == sorted(names) and "alpha" in names and "stuck" in names  # bundled too
    assert "zeta" not in names  # its level could not be read...
    assert any(str(blocked) in e["path"] for e in r["errors"])  # ...and that is reported
    assert len([s for s in r["shadowed"] if s["name"] == "review-checklist"]) >= 2


def test_live_create_edit_delete_and_deep_churn(daemon: SpawnedDaemon) -> None:
    repo = project(daemon.home)
    base = repo / ".qwen" / "skills"
    base.mkdir(parents=True)
    assert "fresh" not in [s["name"] for s in listed(daemon, repo)["skills"]]
    path = skill(base, "fresh", "first words")
    until(lambda: any(s["name"] == "fresh" for s in listed(daemon, repo)["skills"]),
          what="the new skill in the listing")
    path.write_text("---\nname: fresh\ndescription: second words\n---\nbody\n")
    until(lambda: any(s["description"] == "second words" for s in listed(daemon, repo)["skills"]),
          what="the edited description in the listing")
    path.unlink()
    until(lambda: all(s["name"] != "fresh" for s in listed(daemon, repo)["skills"]),
          what="the deleted skill to leave the listing")
    # 2 000 files under a depth-3 node_modules inside a skill dir: not even seen by the hub
    keep = skill(base, "keeper", "stays")
    until(lambda: any(s["name"] == "keeper" for s in listed(daemon, repo)["skills"]),
          what="the keeper skill in the listing")
    watch = until(lambda: (st := daemon.call("daemon.status")["watch"])["synced"] and st,
                  what="the watch hub to register the keeper dir")
    nm = keep.parent / "node_modules" / "pkg"
    nm.mkdir(parents=True)
    for i in range(2000):
        (nm / f"f{i}.js").write_text("x")
    # then an edit that does matter: once it is listed, the hub (which hands changes out in
    # order) has dealt with everything the churn could have caused
    keep.write_text("---\nname: keeper\ndescription: stays, edited\n---\nDo it.\n")
    until(lambda: any(s["description"] == "stays, edited" for s in listed(daemon, repo)["skills"]),
          what="the keeper edit in the listing")
    handled = daemon.call("daemon.status")["watch"]["changes"] - watch["changes"]
    assert 1 <= handled < 2000, handled  # the edit was handed out, the churn never arrived


def test_parse_errors_are_listed_and_others_work(daemon: SpawnedDaemon) -> None:
    repo = project(daemon.home)
    base = repo / ".qwen" / "skills"
    (base / "broken").mkdir(parents=True)
    (base / "broken" / "SKILL.md").write_text("---\nname: broken\ndescription: [unclosed\n---\n")
    (base / "nodesc").mkdir()
    (base / "nodesc" / "SKILL.md").write_text("---\nname: nodesc\n---\nbody\n")
    skill(base, "globby", "has one bad glob", 'paths: ["src/**/*.py", 12]\n')
    skill(base, "good", "works")
    r = listed(daemon, repo)
    names = [s["name"] for s in r["skills"]]
    assert "good" in names and "globby" in names
    paths = [e["path"] for e in r["errors"]]
    assert any(p.endswith("broken/SKILL.md") for p in paths)
    assert any(p.endswith("nodesc/SKILL.md") for p in paths)
    assert any("globby/SKILL.md#paths[" in p for p in paths)
    loaded = daemon.call("skills.load", {"cwd": str(repo), "name": "good"})
    assert loaded["content"].startswith(f"Base directory for this skill: {base / 'good'}")
    assert "Do it." in loaded["content"]


def test_conditional_activation_is_delivered_as_a_delta(daemon: SpawnedDaemon) -> None:
    repo = project(daemon.home)
    base = repo / ".qwen" / "skills"
    skill(base, "ts-style", "TypeScript conventions", 'paths: ["src/**/*.ts", "*.js"]\n')
    skill(base, "always", "always there")
    sid = daemon.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    p1 = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
    snapshot = next(r for r in p1["reminders"] if r["kind"] == "skills")["text"]
    assert "always" in snapshot and "ts-style" not in snapshot
    assert any(t["function"]["name"] == "skill" for t in p1["tools"])
    assert "ts-style" not in str(p1["tools"]) and "always" not in str(p1["tools"])
    daemon.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                          "content": "ok"}})
    p2 = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "again",
                                      "touched_paths": ["/etc/x.js", "../outside.ts"]})
    assert not [r for r in p2["reminders"] if r["kind"].startswith("skills")]
    daemon.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                          "content": "ok"}})
    p3 = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "lint",
                                      "touched_paths": [str(repo / ".eslintrc.js")]})
    delta = [r for r in p3["reminders"] if r["kind"] == "skills_delta"]
    assert len(delta) == 1 and "ts-style" in delta[0]["text"]
    assert p1["prefix_hash"] == p2["prefix_hash"] == p3["prefix_hash"]
    assert p3["messages"][:len(p2["messages"])] == p2["messages"]  # history prefix untouched
    active = {s["name"]: s["active"] for s in listed(daemon, repo, session_id=sid)["skills"]}
    assert active["ts-style"] is True and active["always"] is True


def test_listing_budget_with_many_skills(daemon: SpawnedDaemon) -> None:
    repo = project(daemon.home)
    base = repo / ".qwen" / "skills"
    for i in range(300):
        skill(base, f"skill-{i:03d}", "A long description that goes on and on. " * 8)
    sid = daemon.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    p = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
    text = next(r for r in p["reminders"] if r["kind"] == "skills")["text"]
    assert len(text) <= 8000
    assert "left out" in text or "not listed" in text
    assert len(listed(daemon, repo)["skills"]) >= 300
