"""Follow-up speculation over a copy-on-write overlay, with a scripted model over real HTTP:
writes stay in the overlay until accept, reads see the overlay, abort leaves the project
byte-identical, writes outside the project are refused, the 20-turn / 100-message limits
stop the agent, boundary tools stop it cleanly, and the accepted messages form a valid
continuation of the session."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio

from qwenctxd.agents.overlay import OverlayClosed, OverlayFS, default_overlay_dir
from qwenctxd.agents.speculation import (
    MAX_SPECULATION_TURNS,
    AcceptResult,
    SpeculationManager,
)
from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model import ModelClient
from qwenctxd.protocol.errors import InvalidParams, PathOutsideProject
from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.wait import until_async

HISTORY = [{"role": "user", "content": "write a greeting app"},
           {"role": "assistant", "content": "Done: src/app.py prints hello."}]


# -- helpers ------------------------------------------------------------------------------------
def make_project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "README.md").write_text("# Greeter\nSays hello.\n")
    (root / "docs").mkdir()
    (root / "docs" / "old.txt").write_text("obsolete\n")
    script = root / "run.sh"
    script.write_text("#!/bin/sh\necho run\n")
    script.chmod(0o755)
    (tmp_path / "outside").mkdir()
    return root


def tree_state(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under ``root``: relative path -> (kind/mode, content hash or link target)."""
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = (f"dir {st.st_mode:o}", "")
            else:
                out[rel] = (f"file {st.st_mode:o}", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def call(i: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def tool_results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m.get("role") == "tool"}


def assert_valid_continuation(messages: list[dict[str, Any]]) -> None:
    body = {"model": "stub-model", "messages": [{"role": "system", "content": "s"}, *HISTORY,
                                                *messages]}
    assert validate_chat_body(body) == []
    assert messages[0] == {"role": "user", "content": messages[0]["content"]}
    for m in messages[1:]:
        assert m["role"] in ("assistant", "tool")
        assert "reasoning_content" not in m


@pytest_asyncio.fixture
async def model() -> AsyncIterator[tuple[ScriptedOpenAI, ModelClient]]:
    with ScriptedOpenAI(strict_chat=True) as stub:
        client = ModelClient(ModelEndpoint(base_url=stub.base_url, model="stub-model",
                                           api_key="test", timeout_s=10.0))
        try:
            yield stub, client
        finally:
            await client.aclose()


async def run_to_end(mgr: SpeculationManager, sid: str) -> dict[str, Any]:
    with anyio.fail_after(15):
        return (await mgr.run(sid)).speculation


async def run_in_background(mgr: SpeculationManager, sid: str,
                            ready: Callable[[], bool], body: Callable[[], Any]) -> Any:
    """Run the speculation as a job; once ``ready()`` holds, await ``body()``."""
    result: Any = None
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(mgr.run, sid)
            await until_async(ready, what="the speculation to reach the point under test")
            result = await body()
    return result


# -- OverlayFS ---------------------------------------------------------------------------------
def test_overlay_copy_on_write_apply_and_discard(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    before = tree_state(root)
    ov = OverlayFS(root, tmp_path / "ov" / "a")
    assert (tmp_path / "ov" / "a").stat().st_mode & 0o777 == 0o700
    app, script = root / "src" / "app.py", root / "run.sh"
    assert ov.resolve_read(app) == app
    ov.write(app, "print('hi')\n")
    ov.write(script, "#!/bin/sh\necho changed\n")
    ov.write("new/pkg/mod.py", "x = 1\n")  # relative to the project
    ov.write(root / "src" / ".." / "notes.md", "n\n")
    ov.delete(root / "docs" / "old.txt")
    # the project is untouched; reads see the overlay
    assert tree_state(root) == before
    assert ov.resolve_read(app).read_text() == "print('hi')\n"
    assert ov.resolve_read(app) != app
    assert ov.is_deleted(root / "docs" / "old.txt")
    with pytest.raises(FileNotFoundError):
        ov.resolve_read(root / "docs" / "old.txt").read_text()
    assert ov.listdir(root) == [(".git", True), ("README.md", False), ("docs", True),
                                ("new", True), ("notes.md", False), ("run.sh", False),
                                ("src", True)]
    assert ov.listdir(root / "docs") == []
    assert ov.listdir(root / "new" / "pkg") == [("mod.py", False)]
    assert ov.changed() == [Path("docs/old.txt"), Path("new/pkg/mod.py"), Path("notes.md"),
                            Path("run.sh"), Path("src/app.py")]
    # refusals
    for bad in (root / ".." / "outside" / "x", "../outside/x", "/etc/passwd", root):
        with pytest.raises((PathOutsideProject, IsADirectoryError)):
            ov.write(bad, "no")
    with pytest.raises(IsADirectoryError):
        ov.write(root / "src", "no")
    with pytest.raises(NotADirectoryError):
        ov.write(root / "README.md" / "x", "no")
    with pytest.raises(FileNotFoundError):
        ov.delete(root / "missing.txt")
    assert ov.conflicts() == []
    (root / "README.md").write_text("changed by the user\n")  # not in the overlay: no conflict
    assert ov.conflicts() == []
    applied = ov.apply()
    assert applied == [
        Path("docs/old.txt"), Path("new/pkg/mod.py"), Path("notes.md"), Path("run.sh"),
        Path("src/app.py")]
    assert app.read_text() == "print('hi')\n"
    assert script.read_text() == "#!/bin/sh\necho changed\n"
    assert script.stat().st_mode & 0o777 == 0o755  # the original's mode survives
    assert (root / "new" / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert (root / "notes.md").read_text() == "n\n"
    assert not (root / "docs" / "old.txt").exists()
    assert not (tmp_path / "ov" / "a").exists()
    assert not list((tmp_path / "outside").iterdir())
    with pytest.raises(OverlayClosed):
        ov.write(app, "late")


def test_overlay_symlinks_whiteouts_conflicts_and_default_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path)
    os.symlink(tmp_path / "outside", root / "escape")
    os.symlink(root / "src", root / "srclink")
    ov = OverlayFS(root, tmp_path / "ov")
    with pytest.raises(PathOutsideProject):
        ov.write(root / "escape" / "x.txt", "no")
    # two spellings of one file share one overlay copy
    ov.write(root / "srclink" / "app.py", "via link\n")
    assert ov.resolve_read(root / "src" / "app.py").read_text() == "via link\n"
    assert ov.changed() == [Path("src/app.py")]
    # a deleted file can become a directory
    ov.delete(root / "README.md")
    ov.write(root / "README.md" / "index.md", "dir now\n")
    assert ov.listdir(root / "README.md") == [("index.md", False)]
    # created then deleted: no change at all
    ov.write(root / "tmp.txt", "t")
    ov.delete(root / "tmp.txt")
    assert Path("tmp.txt") not in ov.changed()
    (root / "src" / "app.py").write_text("edited by the user meanwhile\n")
    assert ov.conflicts() == [Path("src/app.py")]
    ov.apply()
    assert (root / "README.md" / "index.md").read_text() == "dir now\n"
    assert (root / "src" / "app.py").read_text() == "via link\n"
    assert (root / "srclink").is_symlink()
    assert not list((tmp_path / "outside").iterdir())
    # discard leaves the project alone; overlay dirs never inside the project
    before = tree_state(root)
    ov2 = OverlayFS(root, tmp_path / "ov2")
    ov2.write(root / "src" / "app.py", "discarded")
    ov2.discard()
    ov2.discard()
    assert tree_state(root) == before and not (tmp_path / "ov2").exists()
    with pytest.raises(ValueError):
        OverlayFS(root, root / "inside")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    d = default_overlay_dir()
    assert d.parent == tmp_path / "qwenctxd" / "speculation" / str(os.getpid())
    assert len(d.name) == 8 and int(d.name, 16) >= 0
    ov3 = OverlayFS(root)
    assert ov3.overlay_dir.is_dir()
    ov3.discard()
    assert not ov3.overlay_dir.exists() and not ov3.overlay_dir.parent.exists()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert f"qwenctxd-{os.getuid()}" in str(default_overlay_dir())


# -- speculation ----------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_writes_stay_in_overlay_reads_see_them_and_accept_applies(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    before = tree_state(root)
    app, new = root / "src" / "app.py", root / "src" / "greet" / "util.py"
    seen: list[dict[str, Any]] = []
    during: list[bool] = []

    def handler(body: dict[str, Any]) -> Reply:
        seen.append(body)
        during.append(tree_state(root) == before)
        n = len(seen)
        if n == 1:
            return Reply(content="<think>plan</think>Editing.", tool_calls=[
                call("w1", "write_file", file_path=str(app), content="print('hi there')\n"),
                call("w2", "write_file", file_path=str(new), content="GREETING = 'MARKER'\n"),
                call("e1", "edit", file_path=str(root / "README.md"), old_string="Says hello.",
                     new_string="Says hi there.")])
        if n == 2:
            return Reply(tool_calls=[
                call("r1", "read_file", file_path=str(app)),
                call("g1", "grep_search", pattern="MARKER|hi there", path=str(root)),
                call("l1", "list_directory", path=str(root / "src")),
                call("b1", "glob", pattern="**/*.py", path=str(root)),
                call("s1", "run_shell_command", command="cat src/app.py")])
        return Reply(content="Done: the greeting says hi there.")

    stub.handler = handler
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="make it say hi there", session_id="s1")
    assert mgr.status(sid)["state"] == "pending"
    st = await run_to_end(mgr, sid)
    assert st["state"] == "ready" and st["outcome"] == "completed", st
    assert st["turns"] == 3 and st["tool_calls"] == 8
    assert sorted(st["changed"]) == ["README.md", "src/app.py", "src/greet/util.py"]
    assert all(during) and len(seen) == 3
    assert tree_state(root) == before  # nothing reached the project yet
    # the forked request: system, the forked history, then the suggestion as the user task
    first = seen[0]["messages"]
    assert first[0]["role"] == "system" and first[1:3] == HISTORY
    assert first[3] == {"role": "user", "content": "make it say hi there"}
    assert {t["function"]["name"] for t in seen[0]["tools"]} == {
        "read_file", "list_directory", "glob", "grep_search", "write_file", "edit",
        "run_shell_command"}
    r2 = tool_results(seen[1])
    assert r2["w1"].startswith("Wrote") and r2["w2"].startswith("Created")
    assert r2["e1"].startswith("Edited")
    r3 = tool_results(seen[2])
    assert r3["r1"] == "print('hi there')"  # the overlay copy
    assert f"{new}:1: GREETING = 'MARKER'" in r3["g1"]
    assert f"{root / 'README.md'}:2: Says hi there." in r3["g1"]
    assert r3["l1"] == "app.py\ngreet/"
    assert str(new) in r3["b1"].splitlines() and str(app) in r3["b1"].splitlines()
    # the shell runs read-only in the real project and says it cannot see the overlay
    assert "print('hello')" in r3["s1"] and "not visible to it" in r3["s1"]
    # accept: the overlay lands in the project, the messages continue the session
    res = await mgr.accept(sid)
    assert isinstance(res, AcceptResult)
    assert sorted(res.applied) == sorted(str(p) for p in (root / "README.md", app, new))
    assert app.read_text() == "print('hi there')\n"
    assert new.read_text() == "GREETING = 'MARKER'\n"
    assert (root / "README.md").read_text() == "# Greeter\nSays hi there.\n"
    assert res.complete and res.outcome == "completed" and res.conflicts == []
    msgs = res.messages
    assert_valid_continuation(msgs)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "tool",
                                        "assistant", *["tool"] * 5, "assistant"]
    assert msgs[1]["content"] == "Editing."  # reasoning dropped
    assert msgs[-1] == {"role": "assistant", "content": "Done: the greeting says hi there."}
    assert not any((tmp_path / "ovbase").rglob("*"))  # overlay removed
    assert mgr.status(sid)["state"] == "accepted"
    with pytest.raises(InvalidParams):
        await mgr.accept(sid)
    assert mgr.abort(sid) is False


@pytest.mark.asyncio
async def test_abort_while_running_leaves_project_byte_identical(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    before = tree_state(root)
    stub.push(Reply(tool_calls=[
        call("w1", "write_file", file_path=str(root / "src" / "app.py"), content="x"),
        call("w2", "write_file", file_path=str(root / "brand" / "new.txt"), content="y"),
        call("e1", "edit", file_path=str(root / "run.sh"), old_string="run",
             new_string="RUN")]))
    stub.push(Reply(content="never seen", delay_s=5))
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root / "src", project_root=root,
                    suggestion="rewrite everything", session_id="s1")
    overlay_dir = mgr.get(sid).overlay.overlay_dir

    async def abort() -> float:
        assert overlay_dir.is_dir() and mgr.status(sid)["changed"]
        t0 = time.monotonic()
        assert mgr.abort(sid) is True
        await mgr.get(sid).wait()
        return time.monotonic() - t0

    took = await run_in_background(mgr, sid, lambda: len(stub.requests) == 2, abort)
    assert took < 2
    st = mgr.status(sid)
    assert st["state"] == "aborted" and st["outcome"] == "cancelled"
    assert tree_state(root) == before
    assert not overlay_dir.exists()
    with pytest.raises(InvalidParams):
        await mgr.accept(sid)
    assert mgr.abort(sid) is False
    with pytest.raises(InvalidParams):
        mgr.status("nope")


@pytest.mark.asyncio
async def test_writes_outside_the_project_are_refused(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    outside = tmp_path / "outside"
    (outside / "victim.txt").write_text("keep me\n")
    os.symlink(outside, root / "escape")
    before_root, before_out = tree_state(root), tree_state(outside)
    stub.push(Reply(tool_calls=[
        call("o1", "write_file", file_path="../outside/x.txt", content="no"),
        call("o2", "write_file", file_path=str(root / ".." / "outside" / "y.txt"), content="no"),
        call("o3", "write_file", file_path=str(root / "escape" / "z.txt"), content="no"),
        call("o4", "edit", file_path=str(outside / "victim.txt"), old_string="keep",
             new_string="lose"),
        call("o5", "run_shell_command", command="echo no > ../outside/w.txt"),
        call("ok", "write_file", file_path="inside.txt", content="fine\n")]))
    stub.push(Reply(content="tried"))
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="write outside")
    await run_to_end(mgr, sid)
    results = tool_results(stub.requests[1].body)
    for key in ("o1", "o2", "o3", "o4"):
        assert results[key].startswith("Error: write refused"), (key, results[key])
        assert "outside the project" in results[key]
    assert results["o5"].startswith("Error:") and "read-only" in results["o5"]
    assert results["ok"].startswith("Created")
    res = await mgr.accept(sid)
    assert res.applied == [str(root / "inside.txt")]
    assert tree_state(outside) == before_out
    after = tree_state(root)
    assert after.pop("inside.txt")[1] == hashlib.sha256(b"fine\n").hexdigest()
    assert after == before_root
    assert_valid_continuation(res.messages)
    with pytest.raises(PathOutsideProject):
        mgr.start(client, session_history=HISTORY, cwd=outside, project_root=root,
                  suggestion="x")
    with pytest.raises(InvalidParams):
        mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                  suggestion="  ")


@pytest.mark.asyncio
async def test_turn_limit_stops_a_model_that_keeps_calling_tools(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    n = iter(range(1000))
    stub.handler = lambda body: Reply(tool_calls=[
        call(f"c{next(n)}", "read_file", file_path=str(root / "README.md"))])
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="look around forever")
    st = await run_to_end(mgr, sid)
    assert st["outcome"] == "turn_limit" and st["turns"] == MAX_SPECULATION_TURNS == 20
    assert len(stub.requests) == 20 and st["messages"] == 40
    res = await mgr.accept(sid)
    assert res.applied == [] and not res.complete
    assert len(res.messages) == 41 and res.messages[-1]["role"] == "tool"
    assert_valid_continuation(res.messages)


@pytest.mark.asyncio
async def test_message_limit_trims_the_last_reply(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    n = iter(range(10_000))
    stub.handler = lambda body: Reply(tool_calls=[
        call(f"c{next(n)}", "glob", pattern="*.md", path=str(root)) for _ in range(7)])
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="glob a lot")
    st = await run_to_end(mgr, sid)
    # 12 turns of 8 messages = 96; the 13th reply keeps 3 of its 7 calls -> exactly 100
    assert st["outcome"] == "message_limit" and st["messages"] == 100
    assert len(stub.requests) == 13
    res = await mgr.accept(sid)
    assert len(res.messages) == 101
    assert len(res.messages[-4]["tool_calls"]) == 3
    assert_valid_continuation(res.messages)


@pytest.mark.asyncio
async def test_boundary_tools_stop_and_strip_unexecuted_calls(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    stub.push(Reply(content="Let me look.", tool_calls=[
        call("r1", "read_file", file_path=str(root / "README.md")),
        call("a1", "agent", task="do it"),
        call("w1", "write_file", file_path=str(root / "late.txt"), content="never")]))
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="delegate", session_id="s1")
    st = await run_to_end(mgr, sid)
    assert st["outcome"] == "boundary" and st["boundary_tool"] == "agent"
    assert st["changed"] == [] and len(stub.requests) == 1
    res = await mgr.accept(sid)
    assert [c["id"] for c in res.messages[1]["tool_calls"]] == ["r1"]
    assert res.messages[2]["content"] == "# Greeter\nSays hello."
    assert len(res.messages) == 3 and not (root / "late.txt").exists()
    assert_valid_continuation(res.messages)
    # without auto-edit approval, a write is a boundary too (no calls left: text kept)
    stub.push(Reply(content="I would edit it.", tool_calls=[
        call("w2", "write_file", file_path=str(root / "late.txt"), content="never")]))
    sid2 = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                     suggestion="edit it", allow_writes=False)
    st2 = await run_to_end(mgr, sid2)
    assert st2["outcome"] == "boundary" and st2["boundary_tool"] == "write_file"
    assert {t["function"]["name"] for t in stub.requests[-1].body["tools"]} == {
        "read_file", "list_directory", "glob", "grep_search", "run_shell_command"}
    res2 = await mgr.accept(sid2)
    assert res2.messages[1:] == [{"role": "assistant", "content": "I would edit it."}]
    assert res2.complete and not (root / "late.txt").exists()


@pytest.mark.asyncio
async def test_accept_while_running_stops_at_a_safe_point_and_newer_supersedes(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    stub, client = model
    root = make_project(tmp_path)
    stub.push(Reply(tool_calls=[
        call("w1", "write_file", file_path=str(root / "src" / "app.py"), content="v2\n")]))
    stub.push(Reply(content="slow", delay_s=5))
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    old = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="first idea", session_id="s1")
    old_dir = mgr.get(old).overlay.overlay_dir
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="second idea", session_id="s1")
    assert mgr.status(old)["state"] == "aborted" and not old_dir.exists()
    assert (await mgr.run(old)).speculation["state"] == "aborted"  # a superseded job does nothing

    async def accept() -> AcceptResult:
        t0 = time.monotonic()
        res = await mgr.accept(sid)
        assert time.monotonic() - t0 < 2
        return res

    res = await run_in_background(mgr, sid, lambda: len(stub.requests) == 2, accept)
    assert res.outcome == "stopped" and not res.complete
    assert res.applied == [str(root / "src" / "app.py")]
    assert (root / "src" / "app.py").read_text() == "v2\n"
    assert [m["role"] for m in res.messages] == ["user", "assistant", "tool"]
    assert_valid_continuation(res.messages)
    # close() aborts whatever is left
    sid3 = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                     suggestion="third", session_id="s2")
    d3 = mgr.get(sid3).overlay.overlay_dir
    mgr.close()
    assert mgr.status(sid3)["state"] == "aborted" and not d3.exists()


@pytest.mark.asyncio
async def test_outside_cancellation_discards_the_overlay(
        model: tuple[ScriptedOpenAI, ModelClient], tmp_path: Path) -> None:
    """A job cancelled by the daemon (shutdown) ends aborted with its overlay removed."""
    stub, client = model
    root = make_project(tmp_path)
    before = tree_state(root)
    stub.push(Reply(tool_calls=[call("w1", "write_file", file_path="a.txt", content="a")]))
    stub.push(Reply(content="slow", delay_s=5))
    mgr = SpeculationManager(overlay_base=tmp_path / "ovbase")
    sid = mgr.start(client, session_history=HISTORY, cwd=root, project_root=root,
                    suggestion="write a")

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(mgr.run, sid)
            await until_async(lambda: len(stub.requests) == 2,
                              what="the speculation's second model call")
            tg.cancel_scope.cancel()
    st = mgr.status(sid)
    assert st["state"] == "aborted" and st["outcome"] == "cancelled"
    assert not mgr.get(sid).overlay.overlay_dir.exists()
    assert tree_state(root) == before
