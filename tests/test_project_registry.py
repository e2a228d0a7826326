"""ProjectRegistry (qwenctxd.project): one Project per repository, re-resolved when a ``.git``
appears or vanishes on the way up, settings that follow the settings file — in process with a
real WatchHub and ConfigStore, and through the socket of a spawned daemon."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from qwenctxd.config import ConfigStore
from qwenctxd.project import Project, ProjectRegistry
from qwenctxd.tasks import TaskRegistry
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until, until_async
from qwenctxd.watch import WatchHub

SETTLE_S = 15.0  # liveness bound only


@asynccontextmanager
async def registry(home: Path) -> AsyncIterator[ProjectRegistry]:
    environ = {**os.environ, "HOME": str(home)}
    environ.pop("QWEN_HOME", None)
    config = ConfigStore(home=home, xdg_config=home / ".config", environ=environ)
    config.load_global()
    hub, tasks = WatchHub(), TaskRegistry()
    projects = ProjectRegistry(config, hub=hub, tasks=tasks, environ=environ)
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await tg.start(hub.run)
        await tg.start(config.run, hub)
        try:
            yield projects
        finally:
            tasks.close()
            tasks.cancel_all()
            await tasks.drain(5)
            tg.cancel_scope.cancel()


async def eventually_root(projects: ProjectRegistry, cwd: Path, root: Path | None) -> Project:
    return await until_async(lambda: (p := projects.get(cwd)).root == root and p,
                             timeout=SETTLE_S, what=f"{cwd} to belong to the root {root}")


def test_subdirectories_share_one_project(tmp_path: Path) -> None:
    async def main() -> None:
        repo = tmp_path / "repo"
        (repo / ".git").mkdir(parents=True)
        (repo / "a" / "b").mkdir(parents=True)
        async with registry(tmp_path) as projects:
            top = projects.get(repo)
            assert top.root == top.anchor == repo
            assert projects.get(repo / "a") is top
            assert projects.get(repo / "a" / "b") is top
            assert top.qwen_home == tmp_path / ".qwen" and top.home == tmp_path
            resolved = projects.resolutions
            assert projects.get(repo / "a" / "b") is top
            assert projects.resolutions == resolved  # warm: no lookup at all
            plain = tmp_path / "plain"
            plain.mkdir()
            other = projects.get(plain)
            assert other.root is None and other.anchor == plain and other is not top

    anyio.run(main)


def test_new_and_removed_git_re_resolve(tmp_path: Path) -> None:
    async def main() -> None:
        repo = tmp_path / "repo"
        (repo / ".git").mkdir(parents=True)
        sub = repo / "vendor" / "lib"
        sub.mkdir(parents=True)
        async with registry(tmp_path) as projects:
            assert projects.get(sub).root == repo
            (sub / ".git").write_text("gitdir: /nowhere\n")  # a nested worktree / submodule
            nested = await eventually_root(projects, sub, sub)
            assert nested.anchor == sub
            assert projects.get(repo).root == repo  # the outer repository is unaffected
            (sub / ".git").unlink()
            assert await eventually_root(projects, sub, repo) is projects.get(repo)
            os.rmdir(repo / ".git")
            assert (await eventually_root(projects, sub, None)).anchor == sub

    anyio.run(main)


def test_a_moved_in_settings_file_changes_the_projects_settings(tmp_path: Path) -> None:
    async def main() -> None:
        repo = tmp_path / "repo"
        (repo / ".git").mkdir(parents=True)
        (repo / ".qwen").mkdir()
        async with registry(tmp_path) as projects:
            project = projects.get(repo / ".qwen")
            assert project.settings.context.file_name != ["NOTES.md"]
            staged = tmp_path / "staged.json"
            staged.write_text(json.dumps({"context": {"fileName": ["NOTES.md"]}}))
            os.replace(staged, repo / ".qwen" / "settings.json")
            await until_async(
                lambda: projects.get(repo).settings.context.file_name == ["NOTES.md"],
                timeout=SETTLE_S, what="the replaced settings.json to apply")
            assert projects.get(repo) is project  # same project, current settings

    anyio.run(main)


def test_daemon_notices_a_git_init_after_the_first_prompt(daemon: SpawnedDaemon) -> None:
    work = daemon.home / "work" / "later"
    work.mkdir(parents=True)
    (work / "AGENTS.md").write_text("later agents\n")
    first = daemon.call("prompt.system", {"cwd": str(work)})
    assert first["project_root"] is None
    (work / ".git").mkdir()
    r = until(lambda: (p := daemon.call("prompt.system", {"cwd": str(work)}))["project_root"]
              and p, timeout=SETTLE_S, what="the new .git to make a project root")
    assert r["project_root"] == str(work)
    assert "later agents" in r["text"]


def test_the_project_is_resolved_once_and_handed_on() -> None:
    """cwd → root → settings is worked out by the registry alone: a project's settings are
    read through ``Project.settings`` (config internals aside), the one registry is built by
    the composition, and nothing outside ``qwenctxd.project`` walks up for ``.git``."""
    package = Path(__file__).resolve().parent.parent / "qwenctxd"
    sources = {p.relative_to(package).as_posix(): p.read_text(encoding="utf-8")
               for p in sorted(package.rglob("*.py"))}
    settings_from_root = sorted(name for name, text in sources.items()
                                if "for_project(" in text and not name.startswith("config/"))
    registries = sorted(name for name, text in sources.items() if "ProjectRegistry(" in text)
    root_walks = sorted(name for name, text in sources.items()
                        if "find_project_root" in text and not name.startswith("project/"))
    assert settings_from_root == ["project/registry.py"]
    assert registries == ["server/compose.py"]
    assert root_walks == []
