"""memory.check_write through the socket: a path that names a memory dir but whose topic dir
(or file) is a symlink out of the tree is not allowed; honest paths still are."""

from __future__ import annotations

import os
from pathlib import Path

from qwenctxd.testing.spawn import SpawnedDaemon


def _repo(home: Path) -> Path:
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    return repo


def _replace_with_link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        path.rmdir()  # the scaffolded topic dir (empty)
    os.symlink(target, path)


def test_symlinked_topic_dir_out_of_the_tree_is_refused(daemon: SpawnedDaemon) -> None:
    repo = _repo(daemon.home)
    roots = daemon.call("memory.status", {"cwd": str(repo)})["roots"]
    project, user = Path(roots["project"]), Path(roots["user"])
    outside = daemon.root / "outside"
    outside.mkdir()
    project.mkdir(parents=True, exist_ok=True)
    _replace_with_link(project / "project", outside)  # the topic dir leaves the tree
    r = daemon.call("memory.check_write", {"cwd": str(repo),
                                           "path": str(project / "project" / "x.md"),
                                           "content": "harmless"})
    assert r.pop("verdict") == "refuse" and "resolves outside" in r.pop("reason")
    assert r == {"allowed": False, "scope": "project", "rules": []}
    # a leaf symlink out of the user tree, too
    (user / "feedback").mkdir(parents=True, exist_ok=True)
    os.symlink(outside / "y.md", user / "feedback" / "y.md")
    r = daemon.call("memory.check_write", {"cwd": str(repo),
                                           "path": str(user / "feedback" / "y.md"),
                                           "content": "harmless"})
    assert r.pop("verdict") == "refuse" and "resolves outside" in r.pop("reason")
    assert r == {"allowed": False, "scope": "user", "rules": []}
    # honest paths inside the tree stay allowed, and so does a path outside every root
    for ok_path in (project / "feedback" / "z.md", user / "user" / "me.md", repo / "notes.md"):
        r = daemon.call("memory.check_write", {"cwd": str(repo), "path": str(ok_path),
                                               "content": "harmless"})
        assert r["allowed"] is True, ok_path
    # a topic dir symlinked to another place inside the same tree is fine
    (project / "reference").mkdir(exist_ok=True)
    _replace_with_link(project / "user", project / "reference")
    r = daemon.call("memory.check_write", {"cwd": str(repo),
                                           "path": str(project / "user" / "me.md"),
                                           "content": "harmless"})
    assert r == {"allowed": True, "scope": "project", "rules": [], "verdict": "allow"}
    assert not (outside / "x.md").exists() and daemon.proc.poll() is None
