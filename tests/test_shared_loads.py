"""Shared loads (tasks.shared_load) and the services built on them, in process with real files,
real SQLite, a real watch hub and task group: a waiter cancelled at a random point of a load
never leaves memory, instructions or skills empty, half-built or stale."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.config import ConfigStore
from qwenctxd.events import EventBus
from qwenctxd.instructions.service import InstructionsService
from qwenctxd.memory.service import MemoryService
from qwenctxd.model import ModelClient
from qwenctxd.project import Project, ProjectRegistry
from qwenctxd.skills.service import SkillsService
from qwenctxd.tasks import SharedLoads, TaskRegistry
from qwenctxd.testing.wait import until_async
from qwenctxd.watch import WatchHub

SETTLE_S = 15.0  # liveness bound for "eventually agrees with the disk"
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


# -- the primitive -------------------------------------------------------------------------------

def test_cancelled_waiter_does_not_cancel_the_load() -> None:
    async def main() -> None:
        tasks = TaskRegistry()
        loads: SharedLoads[str, int] = SharedLoads(tasks, "t")
        release = anyio.Event()
        runs = 0

        async def load() -> int:
            nonlocal runs
            runs += 1
            await release.wait()
            return 42

        async with anyio.create_task_group() as tg:
            tasks.attach(tg)
            with anyio.move_on_after(0.01) as scope:
                await loads.get("k", load)
            assert scope.cancelled_caught and loads.peek("k") is None and loads.loading("k")
            release.set()
            assert await loads.get("k", load) == 42  # joined the same load
            assert runs == 1 and loads.peek("k") == 42
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_load_scheduled_before_aclose_never_begins_and_later_ones_are_refused() -> None:
    """Shutdown closes the loads while one is only scheduled: it must not begin afterwards
    (a memory load opens a database connection whose thread would keep the process alive)."""
    async def main() -> None:
        tasks = TaskRegistry()
        loads: SharedLoads[str, int] = SharedLoads(tasks, "t")
        runs = 0

        async def load() -> int:
            nonlocal runs
            runs += 1
            return 1

        async with anyio.create_task_group() as tg:
            tasks.attach(tg)
            with anyio.move_on_after(0):  # schedules the load's task, leaves before it runs
                await loads.get("k", load)
            await loads.aclose()
            for _ in range(5):
                await anyio.lowlevel.checkpoint()  # let the scheduled task run
            assert runs == 0 and loads.peek("k") is None
            try:
                await loads.get("other", load)
            except anyio.ClosedResourceError as exc:
                assert "closed" in str(exc)
            else:
                raise AssertionError("a load after aclose() was not refused")
            assert runs == 0
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_failure_is_not_cached_and_invalidate_blocks_an_older_publish() -> None:
    async def main() -> None:
        tasks = TaskRegistry()
        loads: SharedLoads[str, int] = SharedLoads(tasks, "t")
        calls = 0

        async def flaky() -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise OSError("disk hiccup")
            return calls

        async with anyio.create_task_group() as tg:
            tasks.attach(tg)
            try:
                await loads.get("k", flaky)
            except OSError:
                pass
            else:
                raise AssertionError("the first load's failure must reach its waiter")
            assert loads.peek("k") is None
            assert await loads.get("k", flaky) == 2 and loads.peek("k") == 2
            gate = anyio.Event()

            async def slow() -> int:
                await gate.wait()
                return 99

            async with anyio.create_task_group() as inner:
                inner.start_soon(loads.reload, "k", slow)
                await anyio.wait_all_tasks_blocked()
                loads.invalidate("k")  # the files changed while it was reading
                gate.set()
            assert loads.peek("k") is None  # the stale load did not publish
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_without_a_task_group_the_caller_runs_it_and_a_cancel_publishes_nothing() -> None:
    async def main() -> None:
        loads: SharedLoads[str, int] = SharedLoads(TaskRegistry(), "t")

        calls = 0

        async def load() -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                await anyio.sleep_forever()  # the first call is cancelled mid-load
            return 7

        with anyio.move_on_after(0.01):
            await loads.get("k", load)
        assert loads.peek("k") is None and not loads.loading("k")
        assert await loads.get("k", load) == 7

    anyio.run(main)


# -- a daemon's subsystems, in process -----------------------------------------------------------

@dataclass
class Services:
    home: Path
    tasks: TaskRegistry
    memory: MemoryService
    instructions: InstructionsService
    skills: SkillsService
    projects: ProjectRegistry

    def at(self, cwd: Path) -> Project:
        """``cwd``'s project, as the wire edge resolves it for the services."""
        return self.projects.get(cwd)


@asynccontextmanager
async def services(home: Path) -> AsyncIterator[Services]:
    environ = {**os.environ, "HOME": str(home), "QWEN_CODE_MEMORY_BASE_DIR": str(home / ".qwen")}
    environ.pop("QWEN_HOME", None)
    config = ConfigStore(home=home, xdg_config=home / ".config", environ=environ)
    config.load_global()
    hub, tasks, bus = WatchHub(), TaskRegistry(), EventBus()
    projects = ProjectRegistry(config, hub=hub, tasks=tasks, environ=environ)
    instructions = InstructionsService(hub, tasks, environ=environ, projects=projects)
    memory = MemoryService(hub, tasks, bus, model=lambda: ModelClient(
        config.global_settings.endpoint()), environ=environ)
    skills = SkillsService(hub, tasks, bus)
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await tg.start(hub.run)
        try:
            yield Services(home, tasks, memory, instructions, skills, projects)
        finally:
            tasks.close()
            tasks.cancel_all()
            await tasks.drain(5)
            await memory.aclose()
            tg.cancel_scope.cancel()


async def cancelled_at(delay_s: float, fn: Callable[[], object]) -> None:
    """Call ``fn()`` (a coroutine function) and cancel the call after ``delay_s``."""
    with anyio.move_on_after(delay_s):
        await fn()  # type: ignore[misc]


def new_repo(home: Path, n: int) -> Path:
    repo = home / f"repo{n}"
    (repo / ".git").mkdir(parents=True)
    return repo


def write_memories(root: Path, ids: range) -> set[str]:
    out = set()
    for i in ids:
        p = root / "project" / f"fact-{i:04d}.md"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"---\nname: deploys fact {i}\ndescription: marker{i:04d} fact\n"
                     f"type: project\n---\nbody {i}\n")
        out.add(str(p))
    return out


async def memory_agrees(s: Services, repo: Path, expected: set[str]) -> bool:
    listed = {str(d.path) for d in await s.memory.list(s.at(repo))}
    if listed != expected:
        return False
    hits = await s.memory.recall(s.at(repo), "deploys fact", limit=len(expected) or 1)
    found = {str(d.path) for d in hits.docs}
    if expected and not found:
        return False
    for path in sorted(expected)[:: max(1, len(expected) // 5)]:
        marker = Path(path).stem.replace("fact-", "marker")
        r = await s.memory.recall(s.at(repo), marker)
        if [str(d.path) for d in r.docs] != [path]:
            return False
    return found <= expected


delays = st.lists(st.floats(0, 0.15), min_size=1, max_size=4)


def test_memory_load_and_resync_survive_cancelled_waiters(tmp_path: Path) -> None:
    counter = iter(range(10_000))

    @PROPERTY
    @given(n=st.integers(1, 250), first=delays, removed=st.integers(0, 100),
           added=st.integers(0, 60), later=delays)
    def example(n: int, first: list[float], removed: int, added: int,
                later: list[float]) -> None:
        async def main() -> None:
            async with services(tmp_path) as s:
                repo = new_repo(tmp_path, next(counter))
                mem = s.memory.roots(s.at(repo)).project
                assert mem is not None
                expected = write_memories(mem, range(n))
                for d in first:  # waiters of the first load, cancelled at random points
                    await cancelled_at(d, lambda: s.memory.recall(s.at(repo), "deploys fact"))
                assert await memory_agrees(s, repo, expected)
                # files change; the watcher's re-sync and forget-like waiters get cancelled
                gone = sorted(expected)[:min(removed, n)]
                for p in gone:
                    os.unlink(p)
                expected = (expected - set(gone)) | write_memories(mem, range(n, n + added))
                proj = await s.memory.load(s.at(repo))
                for d in later:
                    await cancelled_at(d, lambda: s.memory._refresh(proj))
                    await cancelled_at(d / 2, lambda: s.memory.recall(s.at(repo), "deploys"))
                await until_async(lambda: memory_agrees(s, repo, expected), timeout=SETTLE_S,
                                  what="recall to agree with the files")

        anyio.run(main)

    example()


def test_instructions_never_empty_or_stale_after_cancelled_waiters(tmp_path: Path) -> None:
    counter = iter(range(10_000))

    @PROPERTY
    @given(first=delays, edits=st.lists(delays, min_size=1, max_size=3))
    def example(first: list[float], edits: list[list[float]]) -> None:
        async def main() -> None:
            async with services(tmp_path) as s:
                repo = new_repo(tmp_path, next(counter))
                qwen = repo / "QWEN.md"
                qwen.write_text("rule version 0\n")
                for d in first:
                    await cancelled_at(d, lambda: s.instructions.system_prompt(s.at(repo), repo))
                prompt = await s.instructions.system_prompt(s.at(repo), repo)
                assert "rule version 0" in prompt.text
                for v, cancels in enumerate(edits, start=1):
                    # the length changes too: (mtime, size) fingerprints cannot see two
                    # same-size writes within one kernel timestamp tick (reported separately)
                    qwen.write_text(f"rule version {v}{'!' * v}\n")
                    for d in cancels:
                        await cancelled_at(d, lambda: s.instructions.system_prompt(
                            s.at(repo), repo))

                    async def fresh(v: int = v) -> bool:
                        text = (await s.instructions.system_prompt(s.at(repo), repo)).text
                        return f"rule version {v}" in text

                    await until_async(fresh, timeout=SETTLE_S, what="the new skills in the skill set")

        anyio.run(main)

    example()


def test_skills_never_empty_or_stale_after_cancelled_waiters(tmp_path: Path) -> None:
    counter = iter(range(10_000))

    def skill(root: Path, name: str) -> None:
        d = root / ".qwen" / "skills" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: does {name}\n---\nbody\n")

    @PROPERTY
    @given(first=delays, more=st.integers(1, 3), later=delays)
    def example(first: list[float], more: int, later: list[float]) -> None:
        async def main() -> None:
            async with services(tmp_path) as s:
                repo = new_repo(tmp_path, next(counter))
                skill(repo, "alpha")
                for d in first:
                    await cancelled_at(d, lambda: s.skills.skillset(s.at(repo), repo))
                ss, _ = await s.skills.skillset(s.at(repo), repo)
                assert "alpha" in ss.skills
                names = {"alpha"} | {f"extra{i}" for i in range(more)}
                for name in names - {"alpha"}:
                    skill(repo, name)
                for d in later:
                    await cancelled_at(d, lambda: s.skills.skillset(s.at(repo), repo))

                async def fresh() -> bool:
                    got, _ = await s.skills.skillset(s.at(repo), repo)
                    return names <= set(got.skills)

                await until_async(fresh, timeout=SETTLE_S, what="the new skills in the skill set")

        anyio.run(main)

    example()
