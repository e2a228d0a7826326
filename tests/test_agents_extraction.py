"""Extraction through the daemon with a scripted model playing the agent: scoped writes,
denials the model sees, index rebuild, audit log and undo, cursor, queueing, cancellation."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwenctxd.agents.extraction import ExtractRequest, has_user_text, user_texts
from qwenctxd.config import ConfigStore
from qwenctxd.project import ProjectRegistry
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test"}


def is_extractor(body: dict[str, Any]) -> bool:
    first = body.get("messages", [{}])[0]
    return first.get("role") == "system" and "memory extractor" in str(first.get("content"))


def call(i: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def record_extractions(stub: ScriptedOpenAI) -> list[tuple[float, dict[str, Any]]]:
    """The stub answers every extractor request "nothing durable" and records (when, body)."""
    seen: list[tuple[float, dict[str, Any]]] = []

    def handler(body: dict[str, Any]) -> Reply:
        if is_extractor(body):
            seen.append((time.monotonic(), body))
            return Reply(content="nothing durable")
        return Reply(content="ok")

    stub.handler = handler
    return seen


def quiet_daemon(spawn: Any, stub: ScriptedOpenAI, quiet_ms: int) -> tuple[SpawnedDaemon, Path]:
    """A daemon with ``memory.extractionQuietMs`` set before it starts, and a repo."""
    d: SpawnedDaemon = spawn(env=model_env(stub))
    (d.home / ".qwen").mkdir(exist_ok=True)
    (d.home / ".qwen" / "settings.json").write_text(
        json.dumps({"memory": {"extractionQuietMs": quiet_ms}}))
    d.start()
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    return d, repo


def user_turn(d: SpawnedDaemon, sid: str, text: str) -> None:
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
    d.call("session.record_model", {"session_id": sid,
                                    "message": {"role": "assistant", "content": "noted"}})


def test_scoped_writes_denials_index_audit_and_undo(spawn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outside = tmp_path / "outside"
    outside.mkdir()
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        st = d.call("memory.status", {"cwd": str(repo)})
        project = Path(st["roots"]["project"])
        os.symlink(outside / "missing.md", project / "project" / "dangling.md")
        os.symlink(outside, project / "escape")
        good = project / "feedback" / "tabs.md"
        seen: list[dict[str, Any]] = []

        def handler(body: dict[str, Any]) -> Reply:
            if not is_extractor(body):
                return Reply(content="ok")
            seen.append(body)
            if len(seen) == 1:
                return Reply(tool_calls=[
                    call("w1", "write_file", file_path=str(outside / "x.md"), content="nope"),
                    call("w2", "write_file", file_path=str(repo / ".qwen" / "team-memory" / "t.md"),
                         content="nope"),
                    call("w3", "write_file", file_path=str(project / "project" / "dangling.md"),
                         content="nope"),
                    call("w4", "write_file", file_path=str(project / "escape" / "y.md"),
                         content="nope"),
                    call("s1", "run_shell_command", command="rm -rf /"),
                    # `..` after a symlink out: lands where it is spelled, inside memory
                    call("w6", "write_file", file_path=str(project / "escape" / ".." / "feedback"
                                                            / "dotdot.md"), content=(
                        "---\nname: Dotdot\ndescription: d\ntype: feedback\n---\nd\n")),
                    call("w5", "write_file", file_path=str(good), content=(
                        "---\nname: Tabs in Go\ndescription: user wants tabs in Go files\n"
                        "type: feedback\n---\nUse tabs.\n**Why:** team style.\n"))])
            return Reply(content="saved one memory")

        stub.handler = handler
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        d.call("session.turn", {"session_id": sid, "kind": "user",
                                "text": "remember: always tabs in Go"})
        rec = d.call("session.record_model", {"session_id": sid,
                                              "message": {"role": "assistant", "content": "ok"}})
        assert rec == {"turn_complete": True, "scheduled": ["extract"], "answered": []}
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert len(seen) == 2
        results = {m["tool_call_id"]: m["content"] for m in seen[1]["messages"]
                   if m.get("role") == "tool"}
        for denied in ("w1", "w2", "w3", "w4", "s1"):
            assert results[denied].startswith("Error:"), (denied, results[denied])
        assert "read-only" in results["s1"]
        assert "missing target" in results["w3"]
        assert results["w5"].startswith("Created")
        assert not (outside / "x.md").exists() and not (outside / "y.md").exists()
        assert not (repo / ".qwen" / "team-memory" / "t.md").exists()
        assert good.exists()
        assert "Tabs in Go](feedback/tabs.md)" in (project / "MEMORY.md").read_text()
        meta = json.loads((project.parent / "meta.json").read_text())
        assert meta["lastExtractionTouchedTopics"] == ["feedback"]
        assert meta["lastExtractionSessionId"] == sid
        log = d.call("memory.log", {"limit": 10})["entries"]
        dotdot = project / "feedback" / "dotdot.md"
        assert results["w6"] == f"Created {dotdot} ({len(dotdot.read_text())} chars)"
        assert not (tmp_path / "feedback").exists()  # not through the link to outside/..
        assert sorted((e["action"], e["path"], e["agent"]) for e in log) == sorted([
            ("create", str(good), "extraction"), ("create", str(dotdot), "extraction")])
        import subprocess
        import sys

        human = subprocess.run([sys.executable, "-m", "qwenctl", "memory", "log"], env=d.env,
                               capture_output=True, text=True, timeout=30)
        assert human.returncode == 0
        good_id = next(e["id"] for e in log if e["path"] == str(good))
        line = next(x for x in human.stdout.splitlines() if good_id in x)
        assert "extraction" in line and "create" in line and "tabs.md" in line
        undo = subprocess.run([sys.executable, "-m", "qwenctl", "memory", "undo", good_id],
                              env=d.env, capture_output=True, text=True, timeout=30)
        assert undo.returncode == 0 and f"restored {good}" in undo.stdout
        assert not good.exists()
        again = subprocess.run([sys.executable, "-m", "qwenctl", "memory", "undo", "nope"],
                               env=d.env, capture_output=True, text=True, timeout=30)
        assert again.returncode == 1 and "no audit entry" in again.stderr
        assert "Tabs in Go" not in (project / "MEMORY.md").read_text()


def test_cursor_and_gates(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        extract_requests = record_extractions(stub)
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        user_turn(d, sid, "first question")
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        user_turn(d, sid, "second question")
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        st = d.call("memory.status", {"cwd": str(repo)})
        assert st["cursor"]["sessionId"] == sid and st["cursor"]["processedOffset"] == 4
        # nothing new since the cursor → skipped with its reason
        r = d.call("memory.extract", {"session_id": sid})
        assert r == {"scheduled": False, "reason": "no_new_messages",
                     "skipped_reason": "no_new_messages"}
        # a second session starts from 0
        sid2 = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        user_turn(d, sid2, "other session")
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert len(extract_requests) == 3
        # the main agent writing memory itself skips extraction (memory_tool)
        d.call("session.turn", {"session_id": sid2, "kind": "user", "text": "save it"})
        project = Path(st["roots"]["project"])
        d.call("session.record_model", {"session_id": sid2, "message": {
            "role": "assistant", "content": None, "tool_calls": [call(
                "m1", "write_file", file_path=str(project / "user" / "x.md"), content="x")]}})
        d.call("session.turn", {"session_id": sid2, "kind": "tool_results", "tool_results": [
            {"tool_call_id": "m1", "name": "write_file", "content": "ok"}]})
        rec = d.call("session.record_model", {"session_id": sid2, "message": {
            "role": "assistant", "content": "saved"}})
        assert rec["scheduled"] == []


def test_cursor_offset_rules_unit() -> None:
    from qwenctxd.agents.extraction import Extractor

    class Mem:  # only what start_offset touches
        pass

    ex = Extractor.__new__(Extractor)
    import tempfile

    state = Path(tempfile.mkdtemp())
    (state / "extract-cursor.json").write_text(
        json.dumps({"sessionId": "s1", "processedOffset": 10, "updatedAt": "x"}))
    assert ex.start_offset(state, "s1", 12) == 10
    assert ex.start_offset(state, "s2", 12) == 0  # another session
    assert ex.start_offset(state, "s1", 4) == 0  # history shortened by compression
    h = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>x"},
                                       {"type": "text", "text": "real words"}]},
         {"role": "assistant", "content": "a"}, {"role": "user", "content": "  "}]
    assert user_texts(h) == [(0, "real words")]
    project = ProjectRegistry(ConfigStore(home=state, xdg_config=state)).get(state)
    assert ExtractRequest(session_id="s", cwd=state, project=project,
                          history=h).wrote_memory is False


def test_queue_keeps_one_running_and_the_latest_queued(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        bodies: list[dict[str, Any]] = []

        def handler(body: dict[str, Any]) -> Reply:
            if is_extractor(body):
                bodies.append(body)
                return Reply(content="nothing", delay_s=0.5)
            return Reply(content="ok")

        stub.handler = handler
        sids = []
        for i in range(5):
            sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
            d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"question {i}"})
            d.call("session.record_model", {"session_id": sid,
                                            "message": {"role": "assistant", "content": "ok"}})
            sids.append(sid)
        bg = d.call("daemon.status")["background"]
        assert [t["kind"] for t in bg["in_flight"]].count("extract") == 1
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert len(bodies) == 2  # the first ran; of the four that waited only the last ran
        assert "question 4" in json.dumps(bodies[1]["messages"])
        assert "question 1" not in json.dumps(bodies[1]["messages"])


def test_shutdown_cancels_extraction_without_metadata(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)

        def handler(body: dict[str, Any]) -> Reply:
            if is_extractor(body):
                return Reply(content="slow", delay_s=10)
            return Reply(content="ok")

        stub.handler = handler
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        user_turn(d, sid, "remember something")
        stub.wait_for_requests(1, timeout=15)
        st = d.call("memory.status", {"cwd": str(repo)})
        meta_path = Path(st["roots"]["project"]).parent / "meta.json"
        before = meta_path.read_text()
        d.call("daemon.shutdown", {"drain": True, "timeout_s": 0.3})
        assert d.wait_exit() == 0
        assert meta_path.read_text() == before  # no lastExtraction* written
        assert '"event": "extraction cancelled"' in d.log_text()
        cursor = Path(st["roots"]["project"]).parent / "extract-cursor.json"
        assert "processedOffset" not in cursor.read_text()


@pytest.mark.parametrize("path_kind", ["memory", "elsewhere"])
def test_wrote_memory_detection(path_kind: str, tmp_path: Path) -> None:
    from qwenctxd.agents.extraction import wrote_memory

    root = tmp_path / "mem"
    target = root / "user" / "a.md" if path_kind == "memory" else tmp_path / "src" / "a.py"
    msg = {"role": "assistant", "tool_calls": [call("1", "edit", file_path=str(target))]}
    assert wrote_memory(msg, [root]) is (path_kind == "memory")


def test_a_burst_of_turns_is_extracted_once_after_it_pauses(spawn) -> None:  # type: ignore[no-untyped-def]
    """An agent's requests come back to back: the extraction waits for the pause
    (memory.extractionQuietMs) and then reads the session's newest history, once."""
    with ScriptedOpenAI() as stub:
        d, repo = quiet_daemon(spawn, stub, 1500)
        bodies = record_extractions(stub)
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        for i in range(4):
            user_turn(d, sid, f"burst question {i}")
            time.sleep(0.2)  # sleep-ok: turns closer together than the quiet period
        last_turn = time.monotonic()
        until(lambda: bodies, timeout=20, what="the extraction after the burst")
        assert bodies[0][0] - last_turn >= 1.0  # it waited for the pause (1.5 s)
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert len(bodies) == 1, [json.dumps(b["messages"])[-200:] for _, b in bodies]
        assert "burst question 3" in json.dumps(bodies[0][1]["messages"])
        st = d.call("memory.status", {"cwd": str(repo)})
        assert st["cursor"]["sessionId"] == sid and st["cursor"]["processedOffset"] == 8


def test_a_drain_starts_a_waiting_extraction_at_once(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d, repo = quiet_daemon(spawn, stub, 60000)
        bodies = record_extractions(stub)
        sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
        user_turn(d, sid, "remember the deploy window")
        kinds = [t["kind"] for t in d.call("daemon.status")["background"]["in_flight"]]
        assert kinds.count("extract") == 1, kinds
        assert bodies == []  # waiting for a pause of a minute
        t0 = time.monotonic()
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert time.monotonic() - t0 < 15  # liveness: not the minute's wait
        assert len(bodies) == 1 and "deploy window" in json.dumps(bodies[0][1]["messages"])


def test_on_the_agents_own_local_server_extraction_waits_for_a_longer_pause(spawn) -> None:  # type: ignore[no-untyped-def]
    """A session whose agent uses the daemon's own local model server (one slot, as a
    laptop's llama.cpp): an extraction there would evict the agent's cached prompt, so by
    default it waits for a pause of SHARED_SERVER_QUIET_S, not 1 s; a session on another
    server is extracted after the usual pause, and a drain starts the waiting run at once."""
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        bodies = record_extractions(stub)
        elsewhere = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                            "model_base_url": "https://api.example.com/v1"})
        user_turn(d, elsewhere["session_id"], "remember the staging host")
        until(lambda: bodies, timeout=20, what="the extraction after the usual pause")
        assert "staging host" in json.dumps(bodies[0][1]["messages"])
        shared = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                         "model_base_url": stub.base_url})
        user_turn(d, shared["session_id"], "remember the deploy window")
        time.sleep(3.0)  # sleep-ok: three times the usual pause, and nothing ran
        assert len(bodies) == 1
        kinds = [t["kind"] for t in d.call("daemon.status")["background"]["in_flight"]]
        assert kinds.count("extract") == 1, kinds
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        assert len(bodies) == 2 and "deploy window" in json.dumps(bodies[1][1]["messages"])


def test_a_pause_the_user_set_holds_on_a_shared_local_server_too(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d, repo = quiet_daemon(spawn, stub, 200)
        bodies = record_extractions(stub)
        shared = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                         "model_base_url": stub.base_url})
        user_turn(d, shared["session_id"], "remember the deploy window")
        until(lambda: bodies, timeout=20, what="the extraction after the set 0.2 s")
        assert "deploy window" in json.dumps(bodies[0][1]["messages"])


_message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, st.sampled_from(["", " ", "words"])),
    st.builds(lambda t: {"role": "user", "content": [{"type": "text", "text": t}]},
              st.sampled_from(["<system-reminder>x</system-reminder>", "more words", ""])),
    st.just({"role": "assistant", "content": "an answer"}),
    st.just({"role": "tool", "tool_call_id": "c", "content": "output"}),
)


@given(st.lists(_message, max_size=12), st.integers(-2, 14))
def test_the_gates_user_text_check_agrees_with_user_texts(history: list[dict[str, Any]],
                                                         start: int) -> None:
    assert has_user_text(history, start) == bool(user_texts(history, start))
