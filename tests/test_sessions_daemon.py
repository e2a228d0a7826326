"""Sessions through the socket with a scripted model: a long tool-using session round-trips,
survives kill -9, compacts at the thresholds, and never sends an invalid body."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SUMMARY = ("<analysis>walked through it</analysis>\n<state_snapshot>\n<primary_request_and_intent>"
           "refactor auth</primary_request_and_intent>\n<next_step>run the tests</next_step>\n"
           "</state_snapshot>")


def is_compression(body: dict[str, Any]) -> bool:
    sys_msgs = [m for m in body.get("messages", []) if m.get("role") == "system"]
    return bool(sys_msgs) and "state_snapshot" in str(sys_msgs[0].get("content"))


def agent_handler(body: dict[str, Any]) -> Reply:
    """Plays the main model: a user question gets a read_file call, a tool result gets text."""
    if is_compression(body):
        return Reply(content=SUMMARY, usage={"prompt_tokens": 100, "completion_tokens": 50})
    last = body["messages"][-1]
    n = len(body["messages"])
    usage = {"prompt_tokens": len(json.dumps(body["messages"])) // 4, "completion_tokens": 20}
    if last["role"] == "user":
        return Reply(tool_calls=[{"id": f"call_{n}", "function": {
            "name": "read_file", "arguments": json.dumps({"file_path": "/tmp/x.py"})}}],
            usage=usage)
    return Reply(content=f"done {n}", usage=usage)


def post(stub: ScriptedOpenAI, prompt: dict[str, Any], model: str = "stub-model") -> dict[str, Any]:
    """POST the assembled prompt as a client would; the strict stub rejects invalid bodies."""
    body: dict[str, Any] = {"model": model,
                            "messages": [{"role": "system", "content": prompt["system"]},
                                         *prompt["messages"]]}
    if prompt["tools"]:
        body["tools"] = prompt["tools"]
    req = urllib.request.Request(f"{stub.base_url}/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback stub
        return json.loads(resp.read())


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}


TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read",
                                             "parameters": {"type": "object", "properties": {
                                                 "file_path": {"type": "string"}}}}}]


def open_session(d: SpawnedDaemon, cwd: Path, **kw: Any) -> dict[str, Any]:
    return d.call("session.open", {"cwd": str(cwd), "model": "stub-model", "tools": TOOLS, **kw})


def run_turn(d: SpawnedDaemon, stub: ScriptedOpenAI, sid: str, text: str) -> list[dict[str, Any]]:
    """One user turn to completion; returns every AssembledPrompt it produced."""
    prompts = []
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
    while True:
        prompts.append(p)
        reply = post(stub, p)
        msg = reply["choices"][0]["message"]
        msg = {k: v for k, v in msg.items() if v is not None}
        rec = d.call("session.record_model", {"session_id": sid, "message": msg,
                                              "usage": reply["usage"]})
        if rec["turn_complete"]:
            return prompts
        results = [{"tool_call_id": c["id"], "name": c["function"]["name"],
                    "content": "print('hello')\n" * 5} for c in msg["tool_calls"]]
        p = d.call("session.turn", {"session_id": sid, "kind": "tool_results",
                                    "tool_results": results})


@pytest.fixture
def stub():  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(handler=agent_handler, strict_chat=True) as s:
        yield s


def test_forty_turns_round_trip_and_survive_kill_9(spawn, stub: ScriptedOpenAI) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "QWEN.md").write_text("Always write tests.\n")
    opened = open_session(d, repo, window_tokens=1_000_000)
    sid = opened["session_id"]
    last: dict[str, Any] = {}
    for i in range(40):
        prompts = run_turn(d, stub, sid, f"question {i}")
        last = prompts[-1]
        assert "Always write tests." in last["system"]
    assert len(last["messages"]) == 40 * 4 - 1  # user, call, result, (answer recorded after)
    # kill -9 mid-session; a new daemon resumes the same history and token count
    d.kill9()
    again = spawn(root=d.root, env=model_env(stub))
    again.log_path = d.root / "again.log"
    again.start()
    resumed = again.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                          "session_id": sid, "resume": True, "tools": TOOLS})
    assert resumed["resumed"] is True and resumed["messages"] == 160
    # the last main-model answer's usage anchored the count; background extraction may
    # have called the same stub since, so find that request by its body, not its position
    last_request = next(r for r in reversed(stub.requests)
                        if r.body.get("messages", [])[1:] == last["messages"])
    assert resumed["prompt_tokens"] == len(json.dumps(last_request.body["messages"])) // 4 + 20
    p = again.call("session.turn", {"session_id": sid, "kind": "user", "text": "after restart"})
    assert p["messages"][:-1] == last["messages"] + [p["messages"][-2]]
    post(stub, p)  # still a valid body


def test_thresholds_in_usage(spawn, stub: ScriptedOpenAI) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env=model_env(stub)).start()
    for window, (warn, auto, hard) in {32_000: (19_200, 22_400, 25_400),
                                       128_000: (76_800, 95_000, 105_000),
                                       1_000_000: (947_000, 967_000, 977_000)}.items():
        sid = open_session(d, d.home, window_tokens=window)["session_id"]
        p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
        assert p["usage"]["thresholds"] == {"warn": warn, "auto": auto, "hard": hard}
        assert p["usage"]["window_tokens"] == window and p["usage"]["level"] == "ok"


def _fill(d: SpawnedDaemon, stub: ScriptedOpenAI, sid: str, chars: int) -> dict[str, Any]:
    """A user turn whose tool result is ``chars`` long; returns the prompt after the result."""
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "read the big file"})
    reply = post(stub, p)
    msg = reply["choices"][0]["message"]
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": None, "tool_calls": msg["tool_calls"]}})
    return d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": msg["tool_calls"][0]["id"], "name": "read_file",
         "content": "x = 1  # filler\n" * (chars // 16)}]})


def test_auto_compression_keeps_instructions_and_restores_edited_files(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    repo = d.home / "proj"
    (repo / ".git").mkdir(parents=True)
    (repo / "QWEN.md").write_text("Project rule: use tabs.\n")
    src = repo / "x.py"
    src.write_text("old content\n")
    sid = open_session(d, repo, window_tokens=40_000)["session_id"]
    # the model "reads" x.py (path inside the workspace), then the user edits it on disk
    stub.handler = None
    stub.push(Reply(tool_calls=[{"id": "r1", "function": {"name": "read_file", "arguments":
                                                          json.dumps({"file_path": str(src)})}}]))
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "look at x.py"})
    msg = post(stub, p)["choices"][0]["message"]
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": None, "tool_calls": msg["tool_calls"]}})
    p = d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": "r1", "name": "read_file", "content": "old content\n"}]})
    stub.push(Reply(content="noted"))
    d.call("session.record_model", {"session_id": sid, "message": post(stub, p)["choices"][0]["message"]})
    src.write_text("NEW content after the edit\n")
    stub.handler = agent_handler
    p = _fill(d, stub, sid, 60_000)
    assert "compressed" not in [e["type"] for e in p["events"]]
    d.call("session.record_model", {"session_id": sid, "message": post(stub, p)["choices"][0]["message"]})
    p = _fill(d, stub, sid, 60_000)  # past auto (28 000 tokens of a 40 000 window)
    # C2: this turn's result survives the compaction it caused, right after its call
    assert p["messages"][-1]["role"] == "tool" and "x = 1  # filler" in p["messages"][-1]["content"]
    assert p["messages"][-2]["tool_calls"][0]["id"] == p["messages"][-1]["tool_call_id"]
    kinds = [e["type"] for e in p["events"]]
    assert "compressed" in kinds, p["events"]
    ev = next(e for e in p["events"] if e["type"] == "compressed")
    assert ev["tokens_after"] < ev["tokens_before"]
    assert p["usage"]["prompt_tokens"] < 28_000
    assert "Project rule: use tabs." in p["system"]  # instructions live in system
    first = p["messages"][0]
    assert "refactor auth" in json.dumps(first) and "walked through it" not in json.dumps(p)
    assert "NEW content after the edit" in json.dumps(p["messages"])
    assert "old content" not in json.dumps(p["messages"][:3])
    post(stub, p)  # the post-compact history is a valid body
    compression = next(r for r in stub.requests if is_compression(r.body))
    assert compression.body.get("stream") is True and compression.body["max_tokens"] == 20_000


def test_failures_open_the_breaker_and_hard_still_compresses(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    sid = open_session(d, d.home, window_tokens=100_000)["session_id"]  # auto 70 000, hard 77 000

    def failing(body: dict[str, Any]) -> Reply:
        if is_compression(body):
            return Reply(content="<analysis>only a draft</analysis>")
        return agent_handler(body)

    stub.handler = failing
    base = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "start"})
    d.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                     "content": "ok"}})
    room = 72_000 - base["usage"]["prompt_tokens"]
    p = _fill(d, stub, sid, room * 4)  # lands between auto and hard
    assert p["usage"]["level"] == "auto", p["usage"]
    statuses = [e.get("status") for e in p["events"] if e["type"] == "compression_failed"]
    d.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                     "content": "ok"}})
    for i in range(3):
        p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"small {i}"})
        statuses += [e.get("status") for e in p["events"] if e["type"] == "compression_failed"]
        d.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                         "content": "ok"}})
    assert statuses[:3] == ["failed_empty_summary"] * 3, statuses
    assert any(e["type"] == "compression_skipped" and e["reason"] == "breaker_open"
               for e in p["events"]), p["events"]
    # past the hard threshold the daemon compresses even with the breaker open
    stub.handler = agent_handler
    p = _fill(d, stub, sid, 40_000)
    assert any(e["type"] == "compressed" and e["reason"] == "hard" for e in p["events"]), p["events"]
    assert p["usage"]["level"] == "ok"
    post(stub, p)


def test_manual_compress_empty_summary_leaves_history(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    sid = open_session(d, d.home)["session_id"]
    before = run_turn(d, stub, sid, "hello")[-1]
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]  # extraction's model calls
    stub.handler = None
    stub.push(Reply(content="<analysis>unfinished"))
    r = d.call("session.compress", {"session_id": sid, "mode": "full"})
    assert r["status"] == "failed_empty_summary" and r["tokens_after"] == r["tokens_before"]
    stub.handler = agent_handler
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "next"})
    assert p["messages"][:len(before["messages"])] == before["messages"]


def test_no_model_configured(daemon: SpawnedDaemon) -> None:
    sid = daemon.call("session.open", {"cwd": str(daemon.home), "model": "m"})["session_id"]
    daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
    daemon.call("session.record_model", {"session_id": sid,
                                         "message": {"role": "assistant", "content": "hello"}})
    r = daemon.call("session.compress", {"session_id": sid, "mode": "full"})
    assert r["status"].startswith("failed") and r["tokens_after"] == r["tokens_before"]
    recap = daemon.call("session.recap", {"session_id": sid})
    assert recap["status"] == "unavailable" and recap["text"] is None


def test_torn_tail_is_reported_and_the_rest_restored(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    opened = open_session(d, d.home)
    sid = opened["session_id"]
    run_turn(d, stub, sid, "one")
    d.call("session.close", {"session_id": sid})
    path = Path(opened["path"])
    with path.open("ab") as f:
        f.write(b'{"uuid": "torn", "type": "user", "mess')
    r = open_session(d, d.home, session_id=sid, resume=True)
    assert r["resumed"] and r["messages"] == 4 and r["torn_lines"]
    assert "skipped" in r["warnings"][0]
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "two"})
    post(stub, p)


def test_sessions_list_delete_and_errors(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    a = open_session(d, d.home)["session_id"]
    run_turn(d, stub, a, "first")
    listed = d.call("session.list", {"cwd": str(d.home)})["sessions"]
    assert [s["session_id"] for s in listed] == [a] and listed[0]["open"] is True
    with pytest.raises(RemoteError) as exc:
        d.call("session.turn", {"session_id": "nope", "kind": "user", "text": "x"})
    assert exc.value.code == -32001
    with pytest.raises(RemoteError) as exc:  # tool results for no pending call
        d.call("session.turn", {"session_id": a, "kind": "tool_results", "tool_results": [
            {"tool_call_id": "ghost", "content": "x"}]})
    assert exc.value.code == -32602 and "tool_call_id" in exc.value.data["field"]
    assert d.call("session.delete", {"session_id": a}) == {"deleted": True}
    assert d.call("session.list", {"cwd": str(d.home)})["sessions"] == []


def test_any_client_continues_a_session(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    sid = open_session(d, d.home)["session_id"]
    with d.client() as editor:
        editor.call("session.turn", {"session_id": sid, "kind": "user", "text": "from editor"})
    with d.client() as cli:  # a different connection sees the same session
        again = cli.call("session.open", {"cwd": str(d.home), "model": "stub-model",
                                          "session_id": sid})
        assert again["messages"] == 1


def test_notifications_fast_compress_and_summary(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    repo = d.home / "nproj"
    (repo / ".git").mkdir(parents=True)
    sid = open_session(d, repo, window_tokens=100_000)["session_id"]
    with d.client() as sub:
        sub.call("daemon.subscribe", {"topics": ["session/usage", "session/compressed"]})
        base = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "start"})
        d.call("session.record_model", {"session_id": sid,
                                        "message": {"role": "assistant", "content": "ok"}})
        room = 80_000 - base["usage"]["prompt_tokens"]
        p = _fill(d, stub, sid, room * 4)  # past hard (77 000): compress
        assert any(e["type"] == "compressed" for e in p["events"])
        for _ in range(20):
            if any(n["method"] == "session/compressed" for n in sub.notifications):
                break
            sub.call("daemon.ping")
        methods = [n["method"] for n in sub.notifications]
        assert "session/compressed" in methods
        note = next(n for n in sub.notifications if n["method"] == "session/compressed")
        assert note["params"]["session_id"] == sid and note["params"]["tokens_after"] > 0
    # compress-fast clears old tool results with no model call
    for i in range(7):
        run_turn(d, stub, sid, f"more {i}")
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]  # background model calls
    requests_before = len(stub.requests)
    r = d.call("session.compress", {"session_id": sid, "mode": "fast"})
    assert r["status"] == "compressed" and r["tokens_after"] < r["tokens_before"]
    assert any(e["type"] == "micro_compacted" and e["cleared"]["tool"] >= 2 for e in r["events"])
    assert len(stub.requests) == requests_before  # compress-fast makes no model call
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "after fast"})
    assert "[Old tool result content cleared]" in json.dumps(p["messages"])
    post(stub, p)
    # the project summary is saved where a later session can read it
    d.call("session.record_model", {"session_id": sid, "message": {"role": "assistant",
                                                                     "content": "fine"}})
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]  # extraction's model calls
    stub.handler = None
    stub.push(Reply(content="# Project Summary\n\n## Overall Goal\nShip it.\n"))
    summary = d.call("session.project_summary", {"session_id": sid})
    assert summary["path"] == str(repo / ".qwen" / "PROJECT_SUMMARY.md")
    assert (repo / ".qwen" / "PROJECT_SUMMARY.md").read_text().startswith("# Project Summary")


def test_precompact_hook_from_settings(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub))
    marker = d.root / "post.json"
    settings = d.home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"hooks": {
        "PreCompact": [{"hooks": [{"type": "command",
                                    "command": "echo '{\"additionalContext\": \"Keep the <auth> notes\"}'"}]}],
        "PostCompact": [{"hooks": [{"type": "command", "command": f"cat > {marker}"}]}],
    }}))
    d.start()
    sid = open_session(d, d.home)["session_id"]
    for i in range(6):
        run_turn(d, stub, sid, f"hello {i}")
    r = d.call("session.compress", {"session_id": sid, "mode": "full",
                                    "instructions": "focus on auth"})
    assert r["status"] == "compressed", r
    compression = [q for q in stub.requests if is_compression(q.body)][-1]
    system = compression.body["messages"][0]["content"]
    assert "focus on auth" in system and "Keep the ‹auth› notes" in system
    post_payload = json.loads(marker.read_text())
    assert post_payload["hook_event_name"] == "PostCompact"
    assert "refactor auth" in post_payload["summary"] and "<analysis>" not in post_payload["summary"]


def test_list_survives_a_lost_index(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    sid = open_session(d, d.home)["session_id"]
    run_turn(d, stub, sid, "hello")
    d.call("session.close", {"session_id": sid})
    d.stop()
    for f in (d.home / ".local" / "state" / "qwenctxd").glob("sessions.sqlite*"):
        f.unlink()
    again = spawn(root=d.root, env=model_env(stub))
    again.log_path = d.root / "again.log"
    again.start()
    assert again.call("daemon.drain", {"timeout_s": 10})["drained"]
    rows = again.call("session.list", {})["sessions"]
    assert [r["session_id"] for r in rows] == [sid] and rows[0]["messages"] == 4


def test_opened_sessions_are_listed_at_once_and_indexed_in_the_background(
        daemon: SpawnedDaemon) -> None:
    """``session.open`` does not wait for the index: a session is listed right after it opens
    (found by the list's scan), its row is written by the project's next index batch with its
    project, and one deleted before that batch does not come back."""
    import sqlite3

    project = daemon.root / "work" / "proj"
    project.mkdir(parents=True)
    with daemon.client() as c:
        sids = [c.call("session.open", {"cwd": str(project), "model": "m"})["session_id"]
                for _ in range(6)]
        listed = {r["session_id"] for r in c.call("session.list",
                                                  {"cwd": str(project)})["sessions"]}
        assert set(sids) <= listed
        assert c.call("session.delete", {"session_id": sids[0]})["deleted"]
        assert c.call("daemon.drain", {"timeout_s": 30})["drained"]
        listed = {r["session_id"] for r in c.call("session.list",
                                                  {"cwd": str(project)})["sessions"]}
    assert listed == set(sids[1:])
    db = daemon.home / ".local" / "state" / "qwenctxd" / "sessions.sqlite"
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT session_id, project FROM sessions").fetchall())
    conn.close()
    assert set(rows) == set(sids[1:])
    assert set(rows.values()) == {str(project)}
