"""WatchHub: one non-recursive watcher for the daemon, missing directories, restarts."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchfiles import Change

from qwenctxd.testing.wait import until_async
from qwenctxd.watch import FileChange, WatchHub


class Recorder:
    """A subscriber callback that keeps every change it was given."""

    def __init__(self, fail_first: int = 0) -> None:
        self.changes: list[FileChange] = []
        self.calls = 0
        self.fail_first = fail_first

    async def __call__(self, changes: set[FileChange]) -> None:
        self.calls += 1
        self.changes.extend(changes)
        if self.calls <= self.fail_first:
            raise RuntimeError("subscriber bug")

    def paths(self) -> set[str]:
        return {p for _, p in self.changes}


@asynccontextmanager
async def running_hub() -> AsyncIterator[WatchHub]:
    hub = WatchHub()
    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)
        try:
            yield hub
        finally:
            tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_write_in_watched_dir_reaches_callback(tmp_path: Path) -> None:
    rec = Recorder()
    async with running_hub() as hub:
        hub.watch("k", [tmp_path], rec)
        await hub.wait_synced()
        assert hub.directories == {tmp_path}
        (tmp_path / "a.md").write_text("hello")
        await until_async(lambda: str(tmp_path / "a.md") in rec.paths(), what="write delivered")
        assert all(change in (Change.added, Change.modified) for change, _ in rec.changes)
        assert hub.batches >= 1


@pytest.mark.asyncio
async def test_not_recursive(tmp_path: Path) -> None:
    deep = tmp_path / "sub" / "subsub"
    deep.mkdir(parents=True)
    rec = Recorder()
    async with running_hub() as hub:
        hub.watch("k", [tmp_path], rec)
        await hub.wait_synced()
        (deep / "hidden.md").write_text("x")
        (tmp_path / "sub" / "also-hidden.md").write_text("x")
        # one inotify queue, in order: once the later marker is delivered, anything the
        # hidden writes could have produced has been delivered too
        (tmp_path / "marker").write_text("x")
        await until_async(lambda: str(tmp_path / "marker") in rec.paths(), what="marker delivered")
        assert str(deep / "hidden.md") not in rec.paths()
        assert str(tmp_path / "sub" / "also-hidden.md") not in rec.paths()
        assert hub.directories == {tmp_path}


@pytest.mark.asyncio
async def test_missing_dir_is_watched_once_created(tmp_path: Path) -> None:
    target = tmp_path / "config" / "qwenctxd"
    rec = Recorder()
    async with running_hub() as hub:
        hub.watch("k", [target], rec)
        await hub.wait_synced()
        assert hub.directories == {tmp_path}  # the nearest existing ancestor stands in
        # Created in one go: the file exists before the hub can watch the new directory, so
        # it arrives as a synthetic "added".
        target.mkdir(parents=True)
        (target / "config.toml").write_text("[daemon]\n")
        await until_async(lambda: str(target / "config.toml") in rec.paths(), what="file delivered")
        assert (Change.added, str(target / "config.toml")) in rec.changes
        await until_async(lambda: hub.directories == {target}, what="real dir watched")
        # ...and from then on it is watched for real.
        (target / "later.toml").write_text("x")
        await until_async(lambda: str(target / "later.toml") in rec.paths(), what="later delivered")
        # Changes in the stand-in ancestor itself are not the subscriber's business.
        assert str(tmp_path / "config") not in rec.paths()


@pytest.mark.asyncio
async def test_deleted_dir_falls_back_to_ancestor(tmp_path: Path) -> None:
    target = tmp_path / "proj" / ".qwen"
    target.mkdir(parents=True)
    rec = Recorder()
    async with running_hub() as hub:
        hub.watch("k", [target], rec)
        await hub.wait_synced()
        assert hub.directories == {target}
        shutil.rmtree(tmp_path / "proj")
        await until_async(lambda: hub.directories == {tmp_path}, what="fell back to the ancestor")
        target.mkdir(parents=True)
        (target / "settings.json").write_text("{}")
        await until_async(lambda: str(target / "settings.json") in rec.paths(), what="recreated")


@pytest.mark.asyncio
async def test_changing_subscriptions_restarts(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    rec_a, rec_b = Recorder(), Recorder()
    async with running_hub() as hub:
        hub.watch("a", [a], rec_a)
        await hub.wait_synced()
        restarts = hub.restarts
        hub.watch("b", [b], rec_b)
        await hub.wait_synced()
        assert hub.restarts == restarts + 1
        assert hub.directories == {a, b}
        (b / "f").write_text("x")
        (a / "g").write_text("x")
        await until_async(lambda: str(b / "f") in rec_b.paths(), what="b delivered")
        await until_async(lambda: str(a / "g") in rec_a.paths(), what="a delivered")
        assert str(a / "g") not in rec_b.paths() and str(b / "f") not in rec_a.paths()
        # Same directories again (only the callback changes): no restart.
        hub.watch("b", [b], rec_b)
        await hub.wait_synced()
        assert hub.restarts == restarts + 1
        hub.unwatch("a")
        hub.unwatch("b")
        await hub.wait_synced()
        assert hub.directories == frozenset()


@pytest.mark.asyncio
async def test_changes_while_the_watcher_restarts_are_delivered(tmp_path: Path) -> None:
    """A new subscription restarts the watcher: what the old one had not reported yet (its
    debounce) and what happened before the new one registered still reaches the subscriber."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "gone.md").write_text("x")
    (a / "edited.md").write_text("x")
    rec = Recorder()
    async with running_hub() as hub:
        hub.watch("a", [a], rec)
        await hub.wait_synced()
        restarts = hub.restarts
        (a / "new.md").write_text("x")
        (a / "gone.md").unlink()
        (a / "edited.md").write_text("edited")
        hub.watch("b", [b], Recorder())  # the old watcher stops before it reports them
        await hub.wait_synced()
        assert hub.restarts == restarts + 1
        want = {(Change.added, str(a / "new.md")), (Change.deleted, str(a / "gone.md")),
                (Change.modified, str(a / "edited.md"))}
        await until_async(lambda: want <= set(rec.changes), what="the restart's changes")
        # one more restart with nothing changed in between reports nothing new for a
        seen = len(rec.changes)
        hub.unwatch("b")
        await hub.wait_synced()
        assert hub.restarts == restarts + 2
        (a / "marker").write_text("x")
        await until_async(lambda: str(a / "marker") in rec.paths(), what="marker delivered")
        assert {p for _, p in rec.changes[seen:]} == {str(a / "marker")}


@pytest.mark.asyncio
@pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux-only")
async def test_inotify_watch_count(tmp_path: Path) -> None:
    dirs = [tmp_path / name for name in ("x", "y", "z")]
    for d in dirs:
        (d / "deep" / "deeper").mkdir(parents=True)
    async with running_hub() as hub:
        before = hub.inotify_watches()
        hub.watch("k", dirs, Recorder())
        await hub.wait_synced()
        count = hub.inotify_watches()
        assert count >= len(dirs)
        assert count - before == len(dirs)  # non-recursive: the subdirectories cost nothing


@pytest.mark.asyncio
async def test_raising_callback_does_not_stop_deliveries(tmp_path: Path) -> None:
    broken, healthy = Recorder(fail_first=1), Recorder()
    async with running_hub() as hub:
        hub.watch("broken", [tmp_path], broken)
        hub.watch("healthy", [tmp_path], healthy)
        await hub.wait_synced()
        (tmp_path / "one").write_text("1")
        await until_async(lambda: broken.calls >= 1, what="first delivery")
        (tmp_path / "two").write_text("2")
        await until_async(lambda: str(tmp_path / "two") in broken.paths(), what="second delivery")
        assert {str(tmp_path / "one"), str(tmp_path / "two")} <= healthy.paths()


@pytest.mark.asyncio
async def test_default_filter_applies_to_entries_not_to_explicit_dirs(tmp_path: Path) -> None:
    git = tmp_path / ".git"
    git.mkdir()
    top, inside = Recorder(), Recorder()
    async with running_hub() as hub:
        hub.watch("top", [tmp_path], top)
        hub.watch("git", [git], inside)
        await hub.wait_synced()
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        (tmp_path / "x.pyc").write_bytes(b"")
        (tmp_path / "node_modules").mkdir()
        (tmp_path / "QWEN.md").write_text("x")
        await until_async(lambda: str(git / "HEAD") in inside.paths(), what=".git/HEAD delivered")
        await until_async(lambda: str(tmp_path / "QWEN.md") in top.paths(), what="QWEN.md delivered")
        assert not {str(tmp_path / "x.pyc"), str(tmp_path / "node_modules")} & top.paths()


@pytest.mark.asyncio
async def test_cancel_is_prompt_and_idle_hub_is_ready(tmp_path: Path) -> None:
    hub = WatchHub()
    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)  # no subscriber yet: started at once
        await hub.wait_synced()
        hub.watch("k", [tmp_path], Recorder())
        await hub.wait_synced()
        t0 = time.monotonic()
        tg.cancel_scope.cancel()
    assert time.monotonic() - t0 < 1.0  # not the 5 s rust_timeout
    assert hub.directories == frozenset()


@pytest.mark.asyncio
async def test_start_failure_is_reported_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watchfiles import awatch as real_awatch

    calls = 0

    async def flaky_awatch(*args: Any, **kwargs: Any) -> AsyncIterator[set[FileChange]]:
        nonlocal calls
        calls += 1
        if calls == 1:  # as RustNotify fails on the first iteration
            raise OSError(28, "OS file watch limit reached")
        async for batch in real_awatch(*args, **kwargs):
            yield batch

    monkeypatch.setattr("qwenctxd.watch.hub.awatch", flaky_awatch)
    rec = Recorder()
    async with running_hub() as hub:
        hub.watch("k", [tmp_path], rec)
        await hub.wait_synced()  # returns on failure too, never hangs
        assert hub.last_error is not None and "watch limit" in hub.last_error
        await until_async(lambda: hub.directories == {tmp_path}, what="retried after back-off")
        (tmp_path / "f").write_text("x")
        await until_async(lambda: str(tmp_path / "f") in rec.paths(), what="delivered after retry")
