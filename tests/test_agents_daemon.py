"""Dream and speculation through the socket (and qwenctl memory dream)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from qwenctxd.client import RemoteError
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test"}


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and ".git" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_dream_gates_force_and_metadata(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(default=Reply(content="Nothing needs consolidating.")) as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        r = d.call("memory.dream", {"cwd": str(repo)})
        assert r["scheduled"] is False and r["skipped_reason"] == "min_sessions"
        out = qwenctl(d, "memory", "dream", "--force", "--cwd", str(repo))
        assert out.returncode == 0 and "dream scheduled" in out.stdout
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        st = d.call("memory.status", {"cwd": str(repo)})
        assert st["last_dream_at"] is not None and st["lock"] is None
        meta = json.loads((Path(st["roots"]["project"]).parent / "meta.json").read_text())
        assert meta["lastDreamStatus"] == "noop"
        # within 24 h of the last dream the gate says so
        r = d.call("memory.dream", {"cwd": str(repo)})
        assert r["skipped_reason"] == "min_hours"


def test_dream_without_a_model(daemon: SpawnedDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    r = daemon.call("memory.dream", {"cwd": str(repo), "force": True})
    assert r == {"scheduled": False, "reason": "no_model", "skipped_reason": "no_model"}


def _spec_handler(target: Path) -> Any:
    def handler(body: dict[str, Any]) -> Reply:
        first = body["messages"][0]
        last = body["messages"][-1]
        if "refactor" not in json.dumps(body["messages"][-3:]) and last["role"] == "user":
            return Reply(content="ok")
        if last["role"] == "user":
            return Reply(tool_calls=[
                {"id": "w1", "type": "function", "function": {"name": "write_file", "arguments":
                 json.dumps({"file_path": str(target), "content": "new body\n"})}},
                {"id": "w2", "type": "function", "function": {"name": "write_file", "arguments":
                 json.dumps({"file_path": str(target.parent.parent.parent / "outside.txt"),
                             "content": "escape"})}}])
        assert first["role"] == "system"
        return Reply(content="Done: rewrote the file.")
    return handler


def test_speculation_accept_and_abort(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "proj"
        (repo / ".git").mkdir(parents=True)
        target = repo / "src" / "a.py"
        target.parent.mkdir()
        target.write_text("old body\n")
        stub.handler = _spec_handler(target)
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        before = tree_hash(repo)
        spec = d.call("speculation.start", {"session_id": sid,
                                            "suggestion": "refactor src/a.py"})["speculation_id"]
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert tree_hash(repo) == before  # writes stayed in the overlay
        assert not (d.home / "outside.txt").exists()
        ok = d.call("speculation.abort", {"speculation_id": spec})
        assert ok == {"ok": True} and tree_hash(repo) == before
        # again, and accept this time
        spec = d.call("speculation.start", {"session_id": sid,
                                            "suggestion": "refactor src/a.py"})["speculation_id"]
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        res = d.call("speculation.accept", {"speculation_id": spec})
        assert res["applied"] == [str(target)] and res["complete"] is True
        assert target.read_text() == "new body\n"
        assert not (d.home / "outside.txt").exists()
        p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "thanks"})
        roles = [m["role"] for m in p["messages"]]
        assert roles[:4] == ["user", "assistant", "tool", "tool"] and roles[-2:] == [
            "assistant", "user"]
        refused = next(m for m in p["messages"] if m.get("tool_call_id") == "w2")
        assert refused["content"].startswith("Error:")
        try:
            d.call("speculation.accept", {"speculation_id": "nope"})
        except RemoteError as exc:
            assert exc.code == -32602
        else:
            raise AssertionError("unknown speculation accepted")
        # a session at the filesystem root: its "project" would contain the overlay directory
        at_root = d.call("session.open", {"cwd": "/", "model": "stub-model"})["session_id"]
        try:
            d.call("speculation.start", {"session_id": at_root, "suggestion": "refactor"})
        except RemoteError as exc:
            assert exc.code == -32602 and exc.data["field"] == "session_id"
            assert "overlay directory" in exc.message
        else:
            raise AssertionError("speculation started over the whole filesystem")
        assert d.call("daemon.ping") == "pong"


def test_kill_9_during_a_dream_recovers_the_lock(spawn) -> None:  # type: ignore[no-untyped-def]

    with ScriptedOpenAI(default=Reply(content="consolidating", delay_s=30)) as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        st = d.call("memory.status", {"cwd": str(repo)})
        state = Path(st["roots"]["project"]).parent
        meta_before = (state / "meta.json").read_text()
        assert d.call("memory.dream", {"cwd": str(repo), "force": True})["scheduled"]
        until(lambda: (state / "consolidation.lock").exists() and stub.requests,
              what="the dream to take its lock and call the model")
        dead_pid = d.proc.pid
        d.kill9()
        assert (state / "consolidation.lock").read_text().strip() == str(dead_pid)
        stub.default = Reply(content="Nothing to merge.")
        again = spawn(root=d.root, env=model_env(stub))
        again.log_path = d.root / "again.log"
        again.start()
        st2 = again.call("memory.status", {"cwd": str(repo)})
        assert st2["lock"] is not None and st2["lock"]["live"] is False  # dead holder
        assert (state / "meta.json").read_text() == meta_before  # metadata not advanced
        assert not list(Path(st["roots"]["project"]).rglob("*.tmp"))  # no partial file
        assert again.call("memory.dream", {"cwd": str(repo), "force": True})["scheduled"]
        assert again.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert not (state / "consolidation.lock").exists()
        assert json.loads((state / "meta.json").read_text())["lastDreamStatus"] == "noop"
