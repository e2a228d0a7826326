"""The write scope and decision merging of background agents."""

from __future__ import annotations

import os
from pathlib import Path

from qwenctxd.agents.permissions import Decision, MemoryWriteScope, merge, shell_verdict


def test_merge_priority() -> None:
    assert merge(Decision.ALLOW, Decision.DEFAULT) is Decision.ALLOW
    assert merge(Decision.ALLOW, Decision.ASK) is Decision.ASK
    assert merge(Decision.ASK, Decision.DENY, Decision.ALLOW) is Decision.DENY
    assert merge() is Decision.DEFAULT


def test_write_scope(tmp_path: Path) -> None:
    mem = tmp_path / "mem"
    (mem / "user").mkdir(parents=True)
    team = tmp_path / "repo" / ".qwen" / "team-memory"
    team.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    scope = MemoryWriteScope(writable_roots=[mem], team_root=team)
    assert scope.check_write(mem / "user" / "a.md").allowed
    assert scope.check_write(mem / "new" / "deep" / "b.md").allowed  # nearest existing parent
    assert not scope.check_write(mem / ".." / "outside" / "x.md").allowed
    assert not scope.check_write(mem).allowed  # the root itself is not a file to write
    assert not scope.check_write("relative/x.md").allowed
    assert not scope.check_write(team / "project" / "x.md").allowed
    os.symlink(outside, mem / "escape")
    assert not scope.check_write(mem / "escape" / "x.md").allowed
    os.symlink(outside / "missing.md", mem / "user" / "dangling.md")
    verdict = scope.check_write(mem / "user" / "dangling.md")
    assert not verdict.allowed and "missing target" in verdict.reason
    os.symlink(team, mem / "to-team")
    assert "team memory" in scope.check_write(mem / "to-team" / "x.md").reason


def test_touched_topics_need_a_slash_after_the_root(tmp_path: Path) -> None:
    mem = tmp_path / "mem"
    scope = MemoryWriteScope(writable_roots=[mem])
    assert scope.touched_topic(f"{mem}/feedback/x.md") == "feedback"
    assert scope.touched_topic(f"{mem}/notatype/x.md") is None
    assert scope.touched_topic(f"{mem}-other/feedback/x.md") is None
    assert scope.touched_topic(f"{mem}/MEMORY.md") is None


def test_shell_verdicts() -> None:
    assert shell_verdict("git log --oneline | head -5").allowed
    v = shell_verdict("rm -rf /")
    assert not v.allowed and v.decision is Decision.DENY and "read-only" in v.reason
