"""A FIFO (or any non-regular file) where the daemon expects a file never blocks it: reading a
named pipe without a writer would hang a worker thread forever. Each is reported or skipped
and every other answer still comes, through the socket and in the agents' tools."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.permissions import MemoryWriteScope
from qwenctxd.agents.tools import ToolContext, call_tool
from qwenctxd.fsutil import read_regular
from qwenctxd.paths import project_slug
from qwenctxd.testing.spawn import SpawnedDaemon


def test_read_regular_refuses_fifos_devices_and_dirs(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_bytes(b"data")
    assert read_regular(tmp_path / "file") == b"data"
    assert read_regular(tmp_path / "file", 2) == b"da"
    for path, kind in ((tmp_path / "pipe", OSError), ("/dev/zero", OSError),
                       (tmp_path, IsADirectoryError)):
        with pytest.raises(kind) as exc:
            read_regular(path)
        assert kind is IsADirectoryError or exc.value.strerror == "not a regular file"


def test_fifos_in_a_project_do_not_block_the_daemon(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    os.mkfifo(repo / "QWEN.md")
    (repo / "sub" / "QWEN.md").write_text("Sub rules apply.\n")
    (repo / ".qwen" / "rules").mkdir(parents=True)
    os.mkfifo(repo / ".qwen" / "rules" / "pipe.md")
    (repo / ".qwen" / "skills" / "piped").mkdir(parents=True)
    os.mkfifo(repo / ".qwen" / "skills" / "piped" / "SKILL.md")
    os.mkfifo(repo / ".qwen" / "settings.json")
    d.start()
    with d.client(timeout=10) as c:  # a blocked read would time these out
        prompt = c.call("prompt.system", {"cwd": str(repo / "sub")})
        assert "Sub rules apply." in prompt["text"]
        files = c.call("instructions.files", {"cwd": str(repo / "sub")})
        assert any(e["message"] == "unreadable: not a regular file" for e in files["errors"])
        skills = c.call("skills.list", {"cwd": str(repo)})
        assert "piped" not in [s["name"] for s in skills["skills"]]
        assert any("not a regular file" in e["message"] for e in skills["errors"])
        st = c.call("memory.status", {"cwd": str(repo)})
        memory = Path(st["roots"]["project"]) / "project"
        memory.mkdir(parents=True, exist_ok=True)
        os.mkfifo(memory / "pipe.md")
        (memory / "real.md").write_text("---\nname: Real\ndescription: a real memory\n"
                                        "type: project\n---\nbody\n")
        sid = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "a real memory"})
        c.call("session.close", {"session_id": sid})
        listed = c.call("session.list", {"cwd": str(repo)})["sessions"]
        assert [x["session_id"] for x in listed] == [sid]
        assert c.call("memory.recall", {"cwd": str(repo), "query": "real memory"})["strategy"]
    # a FIFO in the chats dir: the index re-sync at start skips it
    chats = d.home / ".qwen" / "projects" / project_slug(repo) / "chats"
    os.mkfifo(chats / "00000000-0000-4000-8000-000000000000.jsonl")
    d.stop()
    for f in (d.home / ".local" / "state" / "qwenctxd").glob("sessions.sqlite*"):
        f.unlink()
    d.start()
    assert d.call("daemon.drain", {"timeout_s": 10})["drained"]
    assert [s["session_id"] for s in d.call("session.list", {})["sessions"]] == [sid]


@pytest.mark.asyncio
async def test_agent_tools_refuse_fifos(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "pipe.py")
    (tmp_path / "src" / "real.py").write_text("needle = 1\n")
    ctx = ToolContext.real_tree(tmp_path, MemoryWriteScope(writable_roots=[]),
                                AuditLog(tmp_path / "audit"), agent="test")
    with anyio.fail_after(10):
        read = await call_tool(ctx, "read_file", {"file_path": str(tmp_path / "src" / "pipe.py")})
        found = await call_tool(ctx, "grep_search", {"pattern": "needle", "path": "src"})
    assert read.startswith("Error:") and "not a regular file" in read
    assert "real.py" in found and "pipe.py" not in found
