"""``memory.save`` (what ``qwenctl mcp``'s save_memory calls) through the socket: the tests share
one daemon (``module_daemon``), each in a fresh project."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from qwenctxd.client import RemoteError
from qwenctxd.memory import save as msave
from qwenctxd.memory import store
from qwenctxd.testing.spawn import SpawnedDaemon


@pytest.fixture
def daemon(module_daemon: SpawnedDaemon) -> SpawnedDaemon:
    """This module's tests share one daemon; each works in a project of its own."""
    return module_daemon


def repo_in(home: Path) -> Path:
    """A new git project (its own name: the daemon is shared by the module's tests)."""
    repo = Path(tempfile.mkdtemp(prefix="repo-", dir=home))
    (repo / ".git").mkdir()
    return repo


def save(d: SpawnedDaemon, repo: Path, **kw: str) -> dict:  # type: ignore[type-arg]
    params = {"cwd": str(repo), "type": "project", "name": "Release day",
              "description": "when we release", "body": "We release on Thursdays.", **kw}
    return d.call("memory.save", params)


def test_save_lands_and_the_same_name_updates(daemon: SpawnedDaemon) -> None:
    repo = repo_in(daemon.home)
    first = save(daemon, repo)
    assert first["created"] is True and first["scope"] == "project"
    path = Path(first["path"])
    assert path.name == "release-day.md" and path.parent.name == "project"
    again = save(daemon, repo, body="We release on Wednesdays now.")
    assert again == {**first, "created": False}
    docs = daemon.call("memory.list", {"cwd": str(repo)})["docs"]
    assert [(d["path"], d["name"], d["type"]) for d in docs] == [(str(path), "Release day",
                                                                  "project")]
    assert "Wednesdays" in path.read_text() and "Thursdays" not in path.read_text()
    index = (path.parent.parent / "MEMORY.md").read_text()
    assert index.count("Release day") == 1
    log = daemon.call("memory.log", {"limit": 2})["entries"]
    assert [e["action"] for e in log] == ["create", "edit"]
    undone = daemon.call("memory.undo", {"id": log[-1]["id"]})
    assert undone["restored"] == str(path) and "Thursdays" in path.read_text()
    recalled = daemon.call("memory.recall", {"cwd": str(repo), "query": "when do we release"})
    assert [d["path"] for d in recalled["docs"]] == [str(path)]


@pytest.mark.parametrize(("params", "field"), [
    ({"type": "diary"}, "type"),
    ({"scope": "everyone"}, "scope"),
    ({"name": " \n "}, "name"),
    ({"body": ""}, "body"),
    ({"name": "x" * 201}, "name"),
    ({"scope": "team"}, "scope"),  # team memory is off by default
])
def test_bad_params_name_the_field_and_write_nothing(daemon: SpawnedDaemon,
                                                     params: dict, field: str) -> None:  # type: ignore[type-arg]
    repo = repo_in(daemon.home)
    with pytest.raises(RemoteError) as err:
        save(daemon, repo, **params)
    assert err.value.code == -32602 and err.value.data["field"] == field
    assert daemon.call("memory.list", {"cwd": str(repo)})["docs"] == []


def test_a_symlinked_topic_dir_is_refused(daemon: SpawnedDaemon, tmp_path: Path) -> None:
    repo = repo_in(daemon.home)
    root = Path(daemon.call("memory.status", {"cwd": str(repo)})["roots"]["project"])
    (root / "reference").rmdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "reference")
    with pytest.raises(RemoteError) as err:
        save(daemon, repo, type="reference")
    assert err.value.code == -32003
    assert list(outside.iterdir()) == []


@settings(max_examples=300, deadline=None)
@given(name=st.text(min_size=1, max_size=80), description=st.text(max_size=120),
       body=st.text(min_size=1, max_size=400),
       mem_type=st.sampled_from(["user", "feedback", "project", "reference"]))
def test_a_saved_document_reads_back_as_written(name: str, description: str, body: str,
                                                mem_type: str) -> None:
    """Whatever the text (YAML specials, newlines, any script), the rendered file parses back
    to the same one-line name and description and the type, and its slug is a safe stem."""
    assume(name.strip() and body.strip() and "\x00" not in name + description + body)
    text = msave.render_document(mem_type, msave.one_line(name), msave.one_line(description),
                                 body)
    stem = msave.slug(name)
    assert stem and "/" not in stem and not stem.startswith(".") and len(stem) <= 80
    root = Path("/m")
    fake = os.stat_result((0o100644, 0, 0, 1, 0, 0, len(text), 0, 0, 0))
    doc = store.parse_doc(root / mem_type / f"{stem}.md", root, "project", text, fake)
    assert not isinstance(doc, str), doc
    assert (doc.name, doc.description, doc.type) == (msave.one_line(name),
                                                     msave.one_line(description), mem_type)
