"""qwenctl sessions show --messages and session.transcript: the recorded conversation, open or
closed, readable, with tool calls, tool results, a compaction marker and --json."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.spawn import SpawnedDaemon

#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL)


def conversation(d: SpawnedDaemon, repo: Path) -> str:
    sid = d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "read the parser"})
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": "parser.py"})}}
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "Reading it.", "tool_calls": [call]}})
    d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": "c1", "name": "read_file",
         "content": "".join(f"line {i}\n" for i in range(40))}]})
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "The parser has 40 lines."}})
    return sid


def test_show_messages_open_and_closed(daemon: SpawnedDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    sid = conversation(daemon, repo)
    tr = daemon.call("session.transcript", {"session_id": sid})
    assert tr["session_id"] == sid and tr["torn_lines"] == 0
    msgs = [e for e in tr["entries"] if e["kind"] == "message"]
    assert [e["role"] for e in msgs] == ["user", "assistant", "tool", "assistant"]
    assert "read the parser" in msgs[0]["text"]
    assert msgs[1]["tool_calls"] == [{"id": "c1", "name": "read_file",
                                      "arguments": '{"path": "parser.py"}'}]
    assert msgs[2]["tool_call_id"] == "c1" and "line 39" in msgs[2]["text"]
    r = qwenctl(daemon, "sessions", "show", sid[:8], "--messages")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "transcript (4 entries)" in out
    assert "[1] user" in out and "read the parser" in out
    assert "[2] assistant (m)" in out and '→ read_file({"path": "parser.py"})' in out
    assert "[3] tool result: read_file" in out
    assert "line 11" in out and "line 12" not in out and "… 28 more lines (--full shows them)" in out
    assert "[4] assistant (m)" in out and "The parser has 40 lines." in out
    full = qwenctl(daemon, "sessions", "show", sid[:8], "--messages", "--full").stdout
    assert "line 39" in full and "more lines" not in full
    # closed: the same transcript, without resuming it
    daemon.call("session.close", {"session_id": sid})
    closed = qwenctl(daemon, "sessions", "show", sid, "--messages", "--json")
    assert closed.returncode == 0, closed.stderr
    j = json.loads(closed.stdout)
    assert j["transcript"]["entries"] == tr["entries"] and j["open"] is False
    assert not daemon.call("daemon.status")["sessions"]
    # without --messages no transcript
    assert "transcript" not in qwenctl(daemon, "sessions", "show", sid).stdout


def test_transcript_errors(daemon: SpawnedDaemon) -> None:
    with pytest.raises(RemoteError) as exc:
        daemon.call("session.transcript", {"session_id": "not-a-uuid"})
    assert exc.value.code == -32602 and exc.value.data["field"] == "session_id"
    with pytest.raises(RemoteError) as exc:
        daemon.call("session.transcript",
                    {"session_id": "a1b2c3d4-1111-4111-8111-111111111111"})
    assert exc.value.code == -32001
