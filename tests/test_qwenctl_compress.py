"""qwenctl compress against a spawned daemon and the scripted model: the default session of a
directory, --fast without a model call, a full summary, a model failure, a closed session."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SUMMARY = ("<analysis>short</analysis>\n<state_snapshot>\n<overall_goal>Fix the parser."
           "</overall_goal>\n</state_snapshot>")


#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL, timeout=60)


def busy_session(d: SpawnedDaemon, repo: Path) -> str:
    """A session with several big tool results (something for both kinds to compress)."""
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                  "window_tokens": 200_000})["session_id"]
    for i in range(8):
        d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"step {i}"})
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{i}.py"})}}
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "", "tool_calls": [call]}})
        d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": f"c{i}", "name": "read_file", "content": f"line {i}\n" * 2000}]})
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"read f{i}.py"}})
    return sid


def test_compress_fast_full_and_failure(spawn) -> None:  # type: ignore[no-untyped-def]
    def handler(body: dict[str, Any]) -> Reply:
        return Reply(content=SUMMARY)

    with ScriptedOpenAI(handler=handler) as stub:
        d: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": stub.base_url,
                                      "OPENAI_MODEL": "stub-model",
                                      "OPENAI_API_KEY": "k"}).start()
        repo = d.home / "repo"
        (repo / ".git").mkdir(parents=True)
        sid = busy_session(d, repo)
        before = d.call("session.context", {"session_id": sid})["prompt_tokens"]
        # --fast, SESSION omitted: this directory's open session; no model call
        assert d.call("daemon.drain", {"timeout_s": 30})["drained"]  # background extraction
        n = len(stub.requests)
        r = qwenctl(d, "compress", "--fast", cwd=repo)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"{sid[:8]}: compressed ") and "(fast:" in r.stdout
        assert len(stub.requests) == n
        mid = d.call("session.context", {"session_id": sid})["prompt_tokens"]
        assert mid < before
        # full, by id prefix, --json
        r = qwenctl(d, "compress", sid[:8], "--json", "--instructions", "keep the parser")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["session_id"] == sid and res["status"] == "compressed"
        assert res["tokens_after"] < res["tokens_before"]
        assert len(stub.requests) > n
        assert any("keep the parser" in json.dumps(q.body) for q in stub.requests[n:])
        after = d.call("session.context", {"session_id": sid})["prompt_tokens"]
        assert after < mid
        # the model fails: exit 1, the status and a pointer to doctor; history unchanged
        stub.handler = lambda body: Reply(fault="http_500")
        more = busy_session(d, repo)
        msgs = d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                       "session_id": more})["messages"]
        r = qwenctl(d, "compress", more[:8])
        assert r.returncode == 1
        assert "not compressed: failed_model_error" in r.stderr and "qwenctl doctor" in r.stderr
        assert d.call("session.open", {"cwd": str(repo), "model": "stub-model",
                                       "session_id": more})["messages"] == msgs


def test_compress_closed_session_and_errors(daemon: SpawnedDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    sid = busy_session(daemon, repo)
    daemon.call("session.close", {"session_id": sid})
    r = qwenctl(daemon, "compress", "--fast", sid)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{sid[:8]}: compressed ")
    # resumed for the call and closed again
    assert not {s["session_id"] for s in daemon.call("daemon.status")["sessions"]}
    # no model: a full compression says so and exits 1
    daemon.call("session.open", {"cwd": str(repo), "model": "m", "session_id": sid})
    r = qwenctl(daemon, "compress", sid)
    assert r.returncode == 1 and "not compressed" in r.stderr
    # no session in an empty directory; an unknown prefix
    empty = daemon.home / "empty"
    (empty / ".git").mkdir(parents=True)
    r = qwenctl(daemon, "compress", cwd=empty)
    assert r.returncode == 1 and "no sessions in" in r.stderr
    r = qwenctl(daemon, "compress", "ffffffff")
    assert r.returncode == 1 and "no session matches" in r.stderr
