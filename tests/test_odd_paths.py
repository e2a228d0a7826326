"""Plain input never gives -32603 (issue 24): an OS error a client's path causes (a name too
long, a directory where a file belongs, …) is -32602 naming the field (``data.field``), through
the socket for every method that takes a cwd or a path; a memory whose name is 200 multi-byte
characters is saved (slugs capped in UTF-8 bytes); a write that succeeded is never reported as
failed; and ``instructions.add_memory`` writes a project's QWEN.md only inside a project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing.spawn import SpawnedDaemon

#: Required params besides ``cwd``, by name, so every method gets past its own validation.
_FILLERS: dict[str, Any] = {
    "scope": "project", "text": "t", "paths": ["a.py"], "path": "/x.md", "content": "c",
    "query": "q", "type": "user", "name": "n", "description": "d", "body": "b", "model": "m",
    "draft_id": "d1"}


def _error(d: SpawnedDaemon, method: str, params: dict[str, Any]) -> RemoteError:
    with pytest.raises(RemoteError) as err:
        d.call(method, params)
    return err.value


def _repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / ".git").mkdir(parents=True)
    return repo


def test_a_cwd_with_a_component_over_255_bytes_is_invalid_params_on_every_method(
        module_daemon: SpawnedDaemon, tmp_path: Path) -> None:
    d = module_daemon
    long_cwd = str(tmp_path / ("é" * 150) / "sub")  # 300 bytes in one component
    doc = d.call("rpc.discover")
    taking_cwd = [m for m in doc["methods"] if any(p["name"] == "cwd" for p in m["params"])]
    assert len(taking_cwd) >= 10, [m["name"] for m in taking_cwd]
    for m in taking_cwd:
        params = {p["name"]: _FILLERS[p["name"]] for p in m["params"]
                  if p["required"] and p["name"] in _FILLERS}
        params["cwd"] = long_cwd
        exc = _error(d, m["name"], params)
        assert exc.code == -32602, (m["name"], exc.code, exc.data)
        assert exc.data["field"] == "cwd" and exc.data["errno"] == "ENAMETOOLONG", m["name"]
    assert d.call("daemon.ping") == "pong"


@pytest.mark.parametrize("method", ["prompt.system", "session.open"])
@pytest.mark.parametrize("var", ["QWEN_SYSTEM_MD", "QWEN_SYSTEM_IDENTITY_MD"])
def test_a_system_prompt_file_named_too_long_names_the_env_field(
        module_daemon: SpawnedDaemon, tmp_path: Path, method: str, var: str) -> None:
    repo = _repo(tmp_path)
    exc = _error(module_daemon, method, {"cwd": str(repo), "model": "m",
                                         "env": {var: str(repo / ("x" * 300))}})
    assert exc.code == -32602 and exc.data["field"] == f"env.{var}", exc.data


def test_a_memory_named_with_200_multibyte_characters_is_saved(
        module_daemon: SpawnedDaemon, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    for name in ("記" * 200, "é" * 200, "𝔘" * 200):  # 3, 2 and 4 bytes a character
        out = module_daemon.call("memory.save", {"cwd": str(repo), "type": "user", "name": name,
                                                 "description": "d", "body": "remember me"})
        path = Path(out["path"])
        assert len(path.name.encode()) <= 255 and out["warnings"] == []
        assert "remember me" in path.read_text() and f"name: {name}" in path.read_text()
    listed = module_daemon.call("memory.list", {"cwd": str(repo)})["docs"]
    assert {"記" * 200, "é" * 200, "𝔘" * 200} <= {doc["name"] for doc in listed}


def test_memory_save_where_memory_md_is_a_directory_saves_and_warns(
        module_daemon: SpawnedDaemon, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    roots = module_daemon.call("memory.status", {"cwd": str(repo)})["roots"]
    index = Path(roots["project"]) / "MEMORY.md"
    index.unlink(missing_ok=True)
    index.mkdir(parents=True)
    out = module_daemon.call("memory.save", {"cwd": str(repo), "type": "feedback",
                                             "name": "tabs", "description": "indentation",
                                             "body": "Use tabs."})
    assert out["created"] is True and "Use tabs." in Path(out["path"]).read_text()
    assert len(out["warnings"]) == 1 and "MEMORY.md" in out["warnings"][0], out
    names = [doc["name"] for doc in module_daemon.call("memory.list", {"cwd": str(repo)})["docs"]]
    assert "tabs" in names


def test_add_memory_where_qwen_md_is_a_directory_is_invalid_params(
        module_daemon: SpawnedDaemon, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "QWEN.md").mkdir()
    exc = _error(module_daemon, "instructions.add_memory",
                 {"cwd": str(repo), "scope": "project", "text": "prefers tabs"})
    assert exc.code == -32602 and exc.data["field"] == "cwd" and exc.data["errno"] == "EISDIR"
    assert list((repo / "QWEN.md").iterdir()) == []


def test_add_memory_outside_any_project_is_refused_and_writes_nothing(
        module_daemon: SpawnedDaemon, tmp_path: Path) -> None:
    plain = tmp_path / "plain" / "deeper"
    plain.mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    exc = _error(module_daemon, "instructions.add_memory",
                 {"cwd": str(plain), "scope": "project", "text": "prefers tabs"})
    assert exc.code == -32602 and exc.data["field"] == "cwd", exc.data
    assert exc.data["message"] == "not inside a project"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("marker", ["QWEN.md", ".qwen"])
def test_add_memory_without_git_lands_in_the_nearest_marked_directory(
        module_daemon: SpawnedDaemon, tmp_path: Path, marker: str) -> None:
    project = tmp_path / "notes"
    (project / "a" / "b").mkdir(parents=True)
    if marker == "QWEN.md":
        (project / "QWEN.md").write_text("# notes\n")
    else:
        (project / ".qwen").mkdir()
    out = module_daemon.call("instructions.add_memory",
                             {"cwd": str(project / "a" / "b"), "scope": "project", "text": "x1"})
    assert out["path"] == str(project / "QWEN.md")
    assert (project / "QWEN.md").read_text().endswith("## Qwen Added Memories\n- x1\n")
    assert not (project / "a" / "b" / "QWEN.md").exists()


def test_add_memory_in_the_home_directory_is_not_a_project_by_its_global_qwen_dir(
        module_daemon: SpawnedDaemon) -> None:
    home = module_daemon.home
    (home / ".qwen").mkdir(exist_ok=True)  # the global config dir, not a project marker
    exc = _error(module_daemon, "instructions.add_memory",
                 {"cwd": str(home), "scope": "project", "text": "x"})
    assert exc.code == -32602 and exc.data["field"] == "cwd"
    assert not (home / "QWEN.md").exists()


def test_a_project_under_a_very_deep_path_never_gives_internal_error(
        module_daemon: SpawnedDaemon, tmp_path: Path) -> None:
    """Every component is short, but the project's slug (one component under ~/.qwen/projects)
    is over 255 bytes."""
    repo = _repo(tmp_path / ("a" * 120) / ("b" * 120))
    for method, params in (("memory.list", {}), ("memory.status", {}),
                           ("session.open", {"model": "m"}),
                           ("memory.save", {"type": "user", "name": "n", "description": "d",
                                            "body": "b"})):
        try:
            module_daemon.call(method, {"cwd": str(repo), **params})
        except RemoteError as exc:
            assert exc.code == -32602 and exc.data["field"] == "cwd", (method, exc.data)
