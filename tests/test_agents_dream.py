"""Dream: gates in order with their skipped reasons, the consolidation lock (dead PID, stale,
release-failure self-heal), a scripted agent merging duplicates over real HTTP, failures and
cancellation writing no metadata, and kill -9 in the middle of a dream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from qwenctxd.agents import dream as dream_mod
from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.dream import (
    GATE_ORDER,
    Dreamer,
    check_gates,
    count_sessions_since,
    parse_plan,
)
from qwenctxd.agents.lock import ConsolidationLock, pid_alive
from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.memory import store
from qwenctxd.memory.paths import MemoryRoots, roots_for
from qwenctxd.model import ModelClient
from qwenctxd.paths import chats_dir
from qwenctxd.protocol.errors import LockHeld
from qwenctxd.tasks import TaskRegistry
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI

HOUR = 3600.0


# -- fixtures and helpers ---------------------------------------------------------------------------


@dataclass
class Env:
    repo: Path
    roots: MemoryRoots
    audit: AuditLog
    chats: Path
    runtime: Path

    @property
    def root(self) -> Path:
        assert self.roots.project is not None
        return self.roots.project

    @property
    def state(self) -> Path:
        assert self.roots.state is not None
        return self.roots.state

    @property
    def lock(self) -> Path:
        return self.state / "consolidation.lock"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    runtime = tmp_path / "qwen"
    monkeypatch.setenv("QWEN_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("QWEN_CODE_MEMORY_BASE_DIR", raising=False)
    monkeypatch.delenv("QWEN_CODE_MEMORY_LOCAL", raising=False)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    roots = roots_for(repo, git_root=repo)
    store.ensure_scaffold(roots)
    chats = chats_dir(repo)
    chats.mkdir(parents=True)
    return Env(repo=repo, roots=roots, audit=AuditLog(tmp_path / "audit"), chats=chats,
               runtime=runtime)


@pytest.fixture
def sleeper() -> Iterator[int]:
    """The PID of a live process that is not us."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(60)"])  # sleep-ok: a live target process
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


def sessions(env: Env, n: int, *, mtime: float | None = None) -> list[str]:
    ids = []
    for _ in range(n):
        sid = str(uuid.uuid4())
        p = env.chats / f"{sid}.jsonl"
        p.write_text('{"type":"user","message":{"role":"user","content":"hello"}}\n')
        if mtime is not None:
            os.utime(p, (mtime, mtime))
        ids.append(sid)
    return ids


def iso(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def is_dreamer(body: dict[str, Any]) -> bool:
    first = body.get("messages", [{}])[0]
    return first.get("role") == "system" and "memory consolidator" in str(first.get("content"))


def call(i: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def client(stub: ScriptedOpenAI) -> ModelClient:
    return ModelClient(ModelEndpoint(base_url=stub.base_url, model="stub-model", timeout_s=5))


def memory(name: str, description: str, body: str, mem_type: str = "project") -> str:
    return f"---\nname: {name}\ndescription: {description}\ntype: {mem_type}\n---\n{body}\n"


def tool_results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m.get("role") == "tool"}


async def run_dream(env: Env, stub: ScriptedOpenAI, dreamer: Dreamer | None = None,
                    session_id: str | None = "cur-session") -> Any:
    model = client(stub)
    try:
        return await (dreamer or Dreamer()).run(model, roots=env.roots, cwd=env.repo,
                                                session_id=session_id, audit=env.audit,
                                                project_key=env.repo)
    finally:
        await model.aclose()


# -- gates ------------------------------------------------------------------------------------------


def test_gate_order_and_force() -> None:
    now = 1_000_000.0
    failing: dict[str, Any] = dict(
        enabled=False, memory_pressure=True, meta={"lastDreamSessionId": "s",
                                                   "lastDreamAt": iso(now - HOUR)},
        session_id="s", now=now, sessions_since=0, last_scan_at=now - 60,
        lock_holder={"pid": 1, "age_s": 1.0, "live": True}, running=True, force=False)
    fixes: dict[str, dict[str, Any]] = {
        "disabled": {"enabled": True}, "memory_pressure": {"memory_pressure": False},
        "same_session": {"session_id": "other"},
        "min_hours": {"meta": {"lastDreamSessionId": "s", "lastDreamAt": iso(now - 25 * HOUR)}},
        "scan_throttled": {"last_scan_at": now - 601}, "min_sessions": {"sessions_since": 5},
        "locked": {"lock_holder": {"pid": 1, "age_s": 4000.0, "live": False}},
        "running": {"running": False}}
    args = dict(failing)
    for reason in GATE_ORDER:
        assert check_gates(**args) == reason
        args.update(fixes[reason])
    assert check_gates(**args) is None
    # force skips same_session, min_hours, scan_throttled and min_sessions — nothing else
    forced = dict(failing, force=True)
    assert check_gates(**forced) == "disabled"
    assert check_gates(**dict(forced, enabled=True)) == "memory_pressure"
    assert check_gates(**dict(forced, enabled=True, memory_pressure=False)) == "locked"
    assert check_gates(**dict(forced, enabled=True, memory_pressure=False,
                              lock_holder=None)) == "running"
    assert check_gates(**dict(forced, enabled=True, memory_pressure=False, lock_holder=None,
                              running=False)) is None
    # the session scan is lazy: not done when an earlier gate fails
    scans: list[int] = []

    def scan() -> int:
        scans.append(1)
        return 9

    assert check_gates(**dict(args, last_scan_at=now - 1, sessions_since=scan)) \
        == "scan_throttled"
    assert scans == []
    assert check_gates(**dict(args, sessions_since=scan)) is None and scans == [1]
    # no lastDreamAt: min_hours passes; an unreadable one too
    assert check_gates(**dict(args, meta={})) is None
    assert check_gates(**dict(args, meta={"lastDreamAt": "garbage"})) is None


def test_count_sessions_since(env: Env) -> None:
    since = time.time() - HOUR
    fresh = sessions(env, 3)
    sessions(env, 2, mtime=since - 60)  # before the last dream
    (env.chats / "notes.jsonl").write_text("x")  # not a session file name
    (env.chats / f"{uuid.uuid4()}.json").write_text("x")
    (env.chats / f"{uuid.uuid4().hex}.jsonl").write_text("x")  # 32 hex digits: counts
    assert count_sessions_since(env.repo, since) == 4
    assert count_sessions_since(env.repo, since, exclude_session=fresh[0]) == 3
    assert count_sessions_since(env.repo, None) == 6
    assert count_sessions_since(env.repo / "elsewhere", None) == 0


def baseline(env: Env) -> str:
    """meta and session files under which every gate passes; returns the current session id."""
    store.write_meta(env.state, lastDreamAt=iso(time.time() - 48 * HOUR),
                     lastDreamSessionId="old-session")
    cur = sessions(env, 1)[0]
    sessions(env, 5)
    return cur


def gate(env: Env, dreamer: Dreamer, sid: str, **kw: Any) -> str | None:
    args: dict[str, Any] = dict(roots=env.roots, project_key=env.repo, session_id=sid,
                                enabled=True)
    args.update(kw)
    return dreamer.gate(**args)


def test_baseline_passes(env: Env) -> None:
    sid = baseline(env)
    assert gate(env, Dreamer(), sid) is None


def test_skip_disabled(env: Env) -> None:
    sid = baseline(env)
    assert gate(env, Dreamer(), sid, enabled=False) == "disabled"
    assert gate(env, Dreamer(), sid, enabled=False, force=True) == "disabled"


def test_skip_memory_pressure(env: Env) -> None:
    sid = baseline(env)
    assert gate(env, Dreamer(), sid, memory_pressure=True) == "memory_pressure"
    assert isinstance(dream_mod.memory_pressure(), bool)


def test_skip_same_session(env: Env) -> None:
    sid = baseline(env)
    store.write_meta(env.state, lastDreamSessionId=sid)
    assert gate(env, Dreamer(), sid) == "same_session"
    assert gate(env, Dreamer(), sid, force=True) is None


def test_skip_min_hours(env: Env) -> None:
    sid = baseline(env)
    store.write_meta(env.state, lastDreamAt=iso(time.time() - 23.5 * HOUR))
    assert gate(env, Dreamer(), sid) == "min_hours"
    store.write_meta(env.state, lastDreamAt=iso(time.time() - 24.1 * HOUR))
    assert gate(env, Dreamer(), sid) is None


def test_skip_scan_throttled(env: Env) -> None:
    sid = baseline(env)
    clock = [time.time()]
    dreamer = Dreamer(clock=lambda: clock[0])
    assert gate(env, dreamer, sid) is None  # this check scanned the session files
    clock[0] += 599
    assert gate(env, dreamer, sid) == "scan_throttled"
    assert gate(env, dreamer, sid, force=True) is None
    clock[0] += 2
    assert gate(env, dreamer, sid) is None


def test_skip_min_sessions_four_vs_five(env: Env) -> None:
    last = time.time() - 48 * HOUR
    store.write_meta(env.state, lastDreamAt=iso(last), lastDreamSessionId="old")
    cur = sessions(env, 1)[0]  # the current session never counts
    sessions(env, 3, mtime=last - 60)  # older than the last dream: never count
    sessions(env, 4)
    assert gate(env, Dreamer(), cur) == "min_sessions"
    assert gate(env, Dreamer(), cur, force=True) is None
    sessions(env, 1)
    assert gate(env, Dreamer(), cur) is None


def test_skip_locked_by_live_pid(env: Env, sleeper: int) -> None:
    sid = baseline(env)
    env.lock.write_text(str(sleeper))
    assert gate(env, Dreamer(), sid) == "locked"
    assert gate(env, Dreamer(), sid, force=True) == "locked"
    env.lock.write_text(str(os.getpid()))  # our own PID is live too
    assert gate(env, Dreamer(), sid) == "locked"
    assert Dreamer().status(env.roots)["lock"]["pid"] == os.getpid()


@pytest.mark.asyncio
async def test_skip_running_once_scheduled(env: Env) -> None:
    sid = baseline(env)
    dreamer = Dreamer()
    tasks = TaskRegistry()
    with ScriptedOpenAI(default=Reply(content="already tidy")) as stub:
        model = client(stub)
        try:
            async with anyio.create_task_group() as tg:
                tasks.attach(tg)
                ok, reason = dreamer.schedule(tasks, lambda: model, roots=env.roots,
                                              cwd=env.repo, session_id=sid, audit=env.audit,
                                              enabled=True)
                assert (ok, reason) == (True, None)
                # scheduled, lock not yet taken: exactly the "running" condition
                assert not env.lock.exists()
                assert gate(env, dreamer, sid, force=True) == "running"
                assert dreamer.schedule(tasks, lambda: model, roots=env.roots, cwd=env.repo,
                                        session_id=sid, audit=env.audit, enabled=True,
                                        force=True) == (False, "running")
                assert await tasks.drain(10)
                tasks.close()
        finally:
            await model.aclose()
    assert dreamer.last[str(env.root)].status == "noop"
    assert not dreamer.running(env.roots) and not env.lock.exists()
    # the dream wrote metadata: the next automatic check is min_hours... after same_session
    assert gate(env, dreamer, sid) == "same_session"
    assert gate(env, dreamer, "another") == "min_hours"


# -- the lock ---------------------------------------------------------------------------------------


def test_lock_acquire_holder_release(tmp_path: Path) -> None:
    path = tmp_path / "state" / "consolidation.lock"
    a = ConsolidationLock(path)
    assert a.holder() is None
    assert a.acquire()
    assert path.read_text() == str(os.getpid())
    h = a.holder()
    assert h is not None and h["pid"] == os.getpid() and h["live"] and h["age_s"] < 5
    b = ConsolidationLock(path)
    assert not b.acquire()  # live holder
    assert b.release() and path.exists()  # b holds nothing: releases nothing
    assert a.acquire()  # already held: still True
    assert a.release() and not path.exists()
    with ConsolidationLock(path) as held:
        assert held.held and path.exists()
        with pytest.raises(LockHeld) as err, ConsolidationLock(path):
            pass
        assert err.value.data["pid"] == os.getpid()
    assert not path.exists()


def test_lock_release_leaves_a_foreign_lock(tmp_path: Path, sleeper: int) -> None:
    path = tmp_path / "consolidation.lock"
    lock = ConsolidationLock(path)
    assert lock.acquire()
    path.write_text(str(sleeper))  # someone else's now
    assert lock.release()
    assert path.read_text() == str(sleeper)


def test_lock_dead_pid_is_cleared(tmp_path: Path) -> None:
    path = tmp_path / "consolidation.lock"
    path.write_text(str(dead_pid()))
    lock = ConsolidationLock(path)
    h = lock.holder()
    assert h is not None and not h["live"]
    assert lock.acquire()
    assert path.read_text() == str(os.getpid())


def test_lock_older_than_an_hour_is_stale(tmp_path: Path, sleeper: int) -> None:
    path = tmp_path / "consolidation.lock"
    path.write_text(str(sleeper))
    lock = ConsolidationLock(path)
    assert lock.holder()["live"]  # type: ignore[index]
    old = time.time() - HOUR - 30
    os.utime(path, (old, old))
    assert not lock.holder()["live"]  # type: ignore[index]
    assert lock.acquire() and path.read_text() == str(os.getpid())


def test_lock_empty_file_grace(tmp_path: Path) -> None:
    path = tmp_path / "consolidation.lock"
    path.write_text("")  # being written by its creator
    lock = ConsolidationLock(path)
    assert lock.holder() == {"pid": None, "age_s": pytest.approx(0, abs=2), "live": True}
    assert not lock.acquire()
    old = time.time() - 60
    os.utime(path, (old, old))
    assert lock.acquire()


def test_lock_release_failure_self_heals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    path = tmp_path / "consolidation.lock"
    lock = ConsolidationLock(path)
    assert lock.acquire()

    def refuse() -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(lock, "_unlink", refuse)
    assert lock.release() is False
    assert lock.release_failed
    assert lock.holder()["live"]  # type: ignore[index]  # fresh mtime, live PID: ours
    monkeypatch.undo()
    # another instance of the same process sees the flag too and force-cleans first
    other = ConsolidationLock(path)
    assert other.release_failed
    assert other.acquire()
    assert not other.release_failed and not lock.release_failed
    assert other.release() and not path.exists()


# -- running dreams -----------------------------------------------------------------------------------


def seed_duplicates(env: Env) -> tuple[Path, Path, Path]:
    a = env.root / "project" / "build.md"
    b = env.root / "project" / "build-commands.md"
    keep = env.root / "user" / "terse.md"
    a.write_text(memory("Build", "how to build", "Run `make build`."))
    b.write_text(memory("Build commands", "build commands", "Use make build; tests: make test."))
    keep.write_text(memory("Terse", "user likes terse replies", "Be terse.", "user"))
    (env.root / "MEMORY.md").write_text(
        "- [Build](project/build.md) — how to build\n"
        "- [Build commands](project/build-commands.md) — build commands\n"
        "- [Terse](user/terse.md) — user likes terse replies\n")
    return a, b, keep


@pytest.mark.asyncio
async def test_dream_merges_duplicates(env: Env) -> None:
    a, b, keep = seed_duplicates(env)
    cur = sessions(env, 1)[0]
    (env.chats / f"{cur}.jsonl").write_text('{"text":"we switched to make build-all"}\n')
    merged = env.root / "project" / "building.md"
    plan = env.root / ".dream-deletions"
    seen: list[dict[str, Any]] = []

    def handler(body: dict[str, Any]) -> Reply:
        if not is_dreamer(body):
            return Reply(content="?")
        seen.append(body)
        step = len(seen)
        if step == 1:
            return Reply(tool_calls=[
                call("l1", "list_directory", path=str(env.root)),
                call("r0", "read_file", file_path=str(env.root / "MEMORY.md")),
                call("r1", "read_file", file_path=str(a)),
                call("r2", "read_file", file_path=str(b)),
                call("g1", "grep_search", pattern="build-all", path=str(env.chats),
                     include="*.jsonl")])
        if step == 2:
            return Reply(tool_calls=[
                call("w1", "write_file", file_path=str(merged), content=memory(
                    "Building", "build and test commands",
                    "Build: `make build-all`. Tests: `make test`.")),
                call("w2", "write_file", file_path=str(env.roots.user / "x.md"),
                     content=memory("X", "x", "x", "user")),
                call("s1", "run_shell_command", command="ls"),
                call("p1", "write_file", file_path=str(plan), content="\n".join([
                    str(a), "project/build-commands.md", str(env.root / "MEMORY.md"),
                    str(merged), str(env.repo / "README.md"),
                    str(env.root / "project" / "missing.md"), "# comment", ""]))])
        if step == 3:
            return Reply(tool_calls=[call(
                "e1", "edit", file_path=str(env.root / "MEMORY.md"),
                old_string="- [Build](project/build.md) — how to build\n"
                           "- [Build commands](project/build-commands.md) — build commands\n",
                new_string="- [Building](project/building.md) — build and test commands\n")])
        return Reply(content="Merged two build memories into project/building.md.")

    with ScriptedOpenAI(handler=handler) as stub:
        result = await run_dream(env, stub, session_id=cur)

    assert result.status == "completed", result
    assert result.agent_status == "completed" and result.turns == 4
    assert not a.exists() and not b.exists() and keep.exists()
    assert "make build-all" in merged.read_text()
    assert not plan.exists()  # the plan never reaches the disk
    assert sorted(result.deleted) == sorted([str(a), str(b)])
    assert set(result.files) == {str(merged), str(env.root / "MEMORY.md")}
    assert result.topics == ["project"]
    refused = {r["path"]: r["reason"] for r in result.rejected}
    assert set(refused) == {str(env.root / "MEMORY.md"), str(merged), str(env.repo / "README.md"),
                            str(env.root / "project" / "missing.md")}
    assert "written in this run" in refused[str(merged)]
    assert "only files within" in refused[str(env.repo / "README.md")]
    # tool results the model saw: grep found the transcript; user memory and shell refused
    first = tool_results(seen[1])
    assert "build-all" in first["g1"] and f"{cur}.jsonl" in first["g1"]
    assert "MEMORY.md" in first["l1"] and "project/" in first["l1"]
    second = tool_results(seen[2])
    assert second["w1"].startswith("Created")
    assert second["w2"].startswith("Error:") and not (env.roots.user / "x.md").exists()
    assert "not available" in second["s1"]
    assert "run_shell_command" not in json.dumps(seen[0]["tools"])
    assert {t["function"]["name"] for t in seen[0]["tools"]} == set(dream_mod.DREAM_TOOLS)
    task = seen[0]["messages"][-1]["content"]
    for phase in ("Phase 1", "Phase 2", "Phase 3", "Phase 4"):
        assert phase in task
    assert str(env.chats) in task and str(plan) in task and str(a) in task
    # audit: create, edit, two deletes — nothing for the plan
    entries = env.audit.entries()
    assert [(e.action, e.path) for e in entries] == [
        ("create", str(merged)), ("edit", str(env.root / "MEMORY.md")),
        ("delete", str(a)), ("delete", str(b))]
    assert all(e.agent == "dream" and e.session == cur for e in entries)
    # metadata and index
    meta = store.read_meta(env.state)
    assert meta["lastDreamSessionId"] == cur and meta["lastDreamAt"]
    assert meta["lastDreamTouchedTopics"] == ["project"]
    assert meta["lastDreamStatus"] == "updated" and meta["recentSessionIdsSinceDream"] == []
    index = (env.root / "MEMORY.md").read_text()
    assert "project/building.md" in index and "build-commands" not in index
    assert "user/terse.md" in index
    assert not env.lock.exists()
    # the deletion is undoable through the audit log
    env.audit.undo(entries[2].id)
    assert a.exists()


@pytest.mark.asyncio
async def test_noop_dream_writes_metadata(env: Env) -> None:
    with ScriptedOpenAI(default=Reply(content="Memory is already tidy.")) as stub:
        result = await run_dream(env, stub)
    assert result.status == "noop" and result.files == [] and result.deleted == []
    meta = store.read_meta(env.state)
    assert meta["lastDreamStatus"] == "noop" and meta["lastDreamSessionId"] == "cur-session"
    assert env.audit.entries() == []


@pytest.mark.asyncio
async def test_failing_model_writes_no_metadata(env: Env) -> None:
    before = store.read_meta(env.state)
    with ScriptedOpenAI(default=Reply(fault="http_500")) as stub:
        result = await run_dream(env, stub)
    assert result.status == "failed" and result.reason == "http_500"
    assert store.read_meta(env.state) == before and "lastDreamAt" not in before
    assert not env.lock.exists()


@pytest.mark.asyncio
async def test_invalid_document_blocks_deletions(env: Env) -> None:
    a, b, _ = seed_duplicates(env)
    replies = [
        Reply(tool_calls=[
            call("w1", "write_file", file_path=str(a), content="no frontmatter at all"),
            call("p1", "write_file", file_path=str(env.root / ".dream-deletions"),
                 content=str(b))]),
        Reply(content="done")]
    with ScriptedOpenAI() as stub:
        stub.push_many(replies)
        result = await run_dream(env, stub)
    assert result.status == "failed" and result.reason == "invalid_memory_document"
    assert result.problems and result.problems[0]["path"] == str(a)
    assert b.exists() and result.deleted == []
    assert "lastDreamAt" not in store.read_meta(env.state)
    assert not env.lock.exists()


@pytest.mark.asyncio
async def test_locked_skip_and_running_while_in_flight_then_cancel(env: Env) -> None:
    dreamer = Dreamer()
    with ScriptedOpenAI(default=Reply(content="slow", delay_s=20)) as stub:
        model = client(stub)
        try:
            async with anyio.create_task_group() as tg:
                outcome: dict[str, Any] = {}

                async def first() -> None:
                    try:
                        await dreamer.run(model, roots=env.roots, cwd=env.repo,
                                          session_id="s1", audit=env.audit)
                    except anyio.get_cancelled_exc_class():
                        outcome["cancelled"] = True
                        raise

                tg.start_soon(first)
                await anyio.to_thread.run_sync(stub.wait_for_requests, 1, 5.0)
                holder = dreamer.status(env.roots)["lock"]
                assert holder["pid"] == os.getpid() and holder["live"]
                second = await dreamer.run(model, roots=env.roots, cwd=env.repo,
                                           session_id="s2", audit=env.audit)
                assert (second.status, second.skipped_reason) == ("skipped", "locked")
                assert gate(env, dreamer, "s2", force=True) == "locked"
                # the lock vanishes under the running dream: "running" still guards it
                env.lock.unlink()
                assert gate(env, dreamer, "s2", force=True) == "running"
                third = await dreamer.run(model, roots=env.roots, cwd=env.repo,
                                          session_id="s3", audit=env.audit)
                assert (third.status, third.skipped_reason) == ("skipped", "running")
                env.lock.write_text(str(os.getpid()))  # put it back as the dream's own
                tg.cancel_scope.cancel()
        finally:
            await model.aclose()
    assert outcome == {"cancelled": True}
    assert dreamer.last[str(env.root)].status == "cancelled"
    assert not env.lock.exists()  # released on the way out
    assert not dreamer.running(env.roots)
    assert "lastDreamAt" not in store.read_meta(env.state)


@pytest.mark.asyncio
async def test_dead_or_stale_lock_is_cleared_and_the_dream_runs(env: Env, sleeper: int) -> None:
    with ScriptedOpenAI(default=Reply(content="tidy")) as stub:
        env.lock.write_text(str(dead_pid()))
        assert (await run_dream(env, stub)).status == "noop"
        assert not env.lock.exists()
        env.lock.write_text(str(sleeper))
        old = time.time() - HOUR - 5
        os.utime(env.lock, (old, old))
        assert (await run_dream(env, stub, session_id="again")).status == "noop"
        assert not env.lock.exists()
        env.lock.write_text(str(sleeper))  # fresh and alive: skipped
        r = await run_dream(env, stub, session_id="third")
        assert (r.status, r.skipped_reason) == ("skipped", "locked")
        assert env.lock.read_text() == str(sleeper)


@pytest.mark.asyncio
async def test_release_failure_self_heals_in_the_dreamer(env: Env,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dreamer = Dreamer()
    lock = dreamer.lock_for(env.roots)

    def refuse() -> None:
        raise OSError(30, "Read-only file system")

    with ScriptedOpenAI(default=Reply(content="tidy")) as stub:
        monkeypatch.setattr(lock, "_unlink", refuse)
        assert (await run_dream(env, stub, dreamer)).status == "noop"
        assert env.lock.read_text() == str(os.getpid()) and lock.release_failed
        assert dreamer.status(env.roots)["release_failed"]
        monkeypatch.undo()
        # without the self-heal this lock (fresh, our live PID) would report "locked" forever
        assert gate(env, dreamer, "next", force=True) is None
        assert (await run_dream(env, stub, dreamer, session_id="next")).status == "noop"
    assert not env.lock.exists() and not lock.release_failed


KILL_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path

    import anyio

    from qwenctxd.agents.audit import AuditLog
    from qwenctxd.agents.dream import Dreamer
    from qwenctxd.config.schema import ModelEndpoint
    from qwenctxd.memory.paths import roots_for
    from qwenctxd.model import ModelClient

    repo, base_url, audit_dir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])

    async def main() -> None:
        model = ModelClient(ModelEndpoint(base_url=base_url, model="stub-model", timeout_s=60))
        await Dreamer().run(model, roots=roots_for(repo, git_root=repo), cwd=repo,
                            session_id="doomed", audit=AuditLog(audit_dir))

    anyio.run(main)
""")


def test_kill_9_during_a_dream(env: Env, tmp_path: Path) -> None:
    a, b, _ = seed_duplicates(env)
    merged = env.root / "project" / "building.md"
    merged_text = memory("Building", "build commands", "x" * 50_000)
    meta_before = (env.state / "meta.json").read_bytes()
    calls: list[int] = []

    def handler(body: dict[str, Any]) -> Reply:
        calls.append(1)
        if len(calls) == 1:
            return Reply(tool_calls=[
                call("w1", "write_file", file_path=str(merged), content=merged_text),
                call("p1", "write_file", file_path=str(env.root / ".dream-deletions"),
                     content=f"{a}\n{b}\n")])
        if len(calls) == 2:
            return Reply(content="never arrives", delay_s=30)  # the child dies waiting
        return Reply(content="tidy")

    script = tmp_path / "child.py"
    script.write_text(KILL_CHILD)
    with ScriptedOpenAI(handler=handler) as stub:
        child = subprocess.Popen(
            [sys.executable, str(script), str(env.repo), stub.base_url, str(env.audit.directory)],
            env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            stub.wait_for_requests(2, timeout=20)
            assert env.lock.read_text() == str(child.pid)
            assert ConsolidationLock(env.lock).holder()["live"]  # type: ignore[index]
            assert gate(env, Dreamer(), "mine", force=True) == "locked"
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.communicate(timeout=10)  # reaps it (a zombie would count as alive)
        assert child.returncode == -signal.SIGKILL
        # after the crash: the lock is left with a dead PID, meta untouched, no torn file
        assert env.lock.read_text() == str(child.pid)
        assert not ConsolidationLock(env.lock).holder()["live"]  # type: ignore[index]
        assert (env.state / "meta.json").read_bytes() == meta_before
        assert merged.read_text() == merged_text  # whole or nothing (atomic write)
        assert a.exists() and b.exists()  # the plan was never applied
        leftovers = [p for p in env.root.rglob("*") if p.name.startswith(".")]
        assert leftovers == []  # no temp file, no plan file
        # the next run recovers the lock and dreams
        result = anyio.run(run_dream, env, stub, None, "after-crash")
    assert result.status == "noop"
    assert not env.lock.exists()
    assert store.read_meta(env.state)["lastDreamSessionId"] == "after-crash"


def test_parse_plan() -> None:
    text = "# delete these\n- `/m/a.md`\n* '/m/b.md'\n\n/m/a.md\n  c.md  \n"
    assert parse_plan(text) == ["/m/a.md", "/m/b.md", "c.md"]
    assert parse_plan(None) == []
