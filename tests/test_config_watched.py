"""The config store on the one WatchedCache: project settings read from any thread follow
their files, an edit racing the first read is not lost, a forgotten project is unwatched —
with a real WatchHub, real files and the store's own task group."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread

from qwenctxd.config import ConfigStore
from qwenctxd.tasks import TaskRegistry
from qwenctxd.testing.wait import until_async
from qwenctxd.watch import WatchHub


@asynccontextmanager
async def running_store(home: Path) -> AsyncIterator[tuple[ConfigStore, WatchHub]]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "QWEN"))}
    environ["HOME"] = str(home)
    store = ConfigStore(home=home, xdg_config=home / ".config", environ=environ)
    store.load_global()
    hub, tasks = WatchHub(), TaskRegistry()
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await tg.start(hub.run)
        await tg.start(lambda *, task_status: store.run(hub, tasks=tasks,
                                                       task_status=task_status))
        try:
            yield store, hub
        finally:
            tasks.close()
            tasks.cancel_all()
            await tasks.drain(5)
            tg.cancel_scope.cancel()


def write_settings(root: Path, fast_model: str) -> None:
    (root / ".qwen").mkdir(parents=True, exist_ok=True)
    staged = root / ".qwen" / "settings.json.tmp"
    staged.write_text(json.dumps({"fastModel": fast_model}))
    os.replace(staged, root / ".qwen" / "settings.json")


async def until_fast_model(store: ConfigStore, root: Path, expected: str) -> None:
    await until_async(lambda: store.for_project(root).fast_model == expected,
                      what=f"{root} settings with fastModel {expected!r}")


def test_settings_read_first_from_a_worker_thread_follow_the_file(tmp_path: Path) -> None:
    async def main() -> None:
        repo = tmp_path / "repo"
        write_settings(repo, "first")
        async with running_store(tmp_path) as (store, hub):
            first = await anyio.to_thread.run_sync(store.for_project, repo)
            assert first.fast_model == "first"
            assert any(key.startswith("config:") and str(repo) in key
                       for key in hub.subscriptions())
            write_settings(repo, "second")
            await until_fast_model(store, repo, "second")

    anyio.run(main)


def test_an_edit_racing_the_first_read_is_not_lost(tmp_path: Path) -> None:
    """Each project is read, then edited at once — before the hub can have re-planned its
    watches — so the edit lands in the gap the re-check exists for (or is seen as an event):
    either way the store ends on the edited value."""

    async def main() -> None:
        async with running_store(tmp_path) as (store, _hub):
            for i in range(6):
                repo = tmp_path / f"repo{i}"
                write_settings(repo, f"before-{i}")
                assert store.for_project(repo).fast_model == f"before-{i}"
                write_settings(repo, f"after-{i}")  # nothing awaited since the read
                await until_fast_model(store, repo, f"after-{i}")

    anyio.run(main)


def test_a_bad_edit_keeps_the_last_good_project_settings_then_recovers(tmp_path: Path) -> None:
    async def main() -> None:
        repo = tmp_path / "repo"
        write_settings(repo, "good")
        async with running_store(tmp_path) as (store, _hub):
            assert store.for_project(repo).fast_model == "good"
            (repo / ".qwen" / "settings.json").write_text("{not json")
            await until_async(lambda: repo in store.project_errors, what="the bad edit reported")
            assert store.for_project(repo).fast_model == "good"
            write_settings(repo, "fixed")
            await until_fast_model(store, repo, "fixed")
            assert repo not in store.project_errors

    anyio.run(main)


def test_a_forgotten_project_is_no_longer_watched(tmp_path: Path) -> None:
    async def main() -> None:
        repo = tmp_path / "repo"
        write_settings(repo, "x")
        async with running_store(tmp_path) as (store, hub):
            store.for_project(repo)
            assert any(str(repo) in key for key in hub.subscriptions() if key.startswith("config:"))
            store.forget_project(repo)
            assert not any(str(repo) in key for key in hub.subscriptions()
                           if key.startswith("config:"))
            # the global files are still watched
            assert "config:None" in hub.subscriptions()

    anyio.run(main)
