"""qwenctl sessions against a spawned daemon and the scripted model: list, show, recap,
delete, summary, and their errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

# two ids sharing the prefix "a1b2" (ambiguous) but not "a1b2c" / "a1b2f" (unique)
SID_A = "a1b2c3d4-1111-4111-8111-111111111111"
SID_B = "a1b2ffff-2222-4222-8222-222222222222"
RECAP = "Refactoring auth; next run the tests."
SUMMARY_MD = ("# Project Summary\n\n## Overall Goal\nRefactor the auth module.\n\n"
              "## Current Plan\n1. [DONE] Split login.py\n2. [TODO] Run the tests\n")
LIST_KEYS = {"session_id", "cwd", "started_at", "updated_at", "messages", "title", "open"}


def is_recap(body: dict[str, Any]) -> bool:
    """The daemon's recap side query: its last (user) message asks for the recap."""
    last = body.get("messages", [{}])[-1]
    return last.get("role") == "user" and "<recap>" in json.dumps(last.get("content"))


def is_project_summary(body: dict[str, Any]) -> bool:
    sys_msgs = [m for m in body.get("messages", []) if m.get("role") == "system"]
    return bool(sys_msgs) and "# Project Summary" in str(sys_msgs[0].get("content"))


def handler(body: dict[str, Any]) -> Reply:
    if is_recap(body):
        return Reply(content=f"<recap>{RECAP}</recap>")
    if is_project_summary(body):
        return Reply(content=SUMMARY_MD)
    return Reply(content="Looked at auth; splitting login.py next.",
                 usage={"prompt_tokens": 1200, "completion_tokens": 30})


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}


#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL)


def turn(d: SpawnedDaemon, stub: ScriptedOpenAI | None, sid: str, text: str) -> None:
    """One user turn: the assembled prompt goes to the stub (when there is one) as a client
    would send it, and its answer is recorded."""
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
    if stub is None:
        msg, usage = {"role": "assistant", "content": "ok"}, None
    else:
        body = {"model": "stub-model",
                "messages": [{"role": "system", "content": p["system"]}, *p["messages"]]}
        req = urllib.request.Request(f"{stub.base_url}/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback stub
            reply = json.loads(resp.read())
        msg = {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}
        usage = reply["usage"]
    d.call("session.record_model", {"session_id": sid, "message": msg, "usage": usage})


def project(home: Path, name: str) -> Path:
    repo = home / name
    (repo / ".git").mkdir(parents=True)
    return repo


@dataclass
class World:
    d: SpawnedDaemon
    stub: ScriptedOpenAI
    a: Path  # SID_A's project
    b: Path  # SID_B's project


@pytest.fixture
def stub():  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(handler=handler, strict_chat=True) as s:
        yield s


@pytest.fixture
def world(spawn, stub: ScriptedOpenAI) -> World:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    a, b = project(d.home, "proj-a"), project(d.home, "proj-b")
    for sid, cwd, text in ((SID_A, a, "refactor auth please"), (SID_B, b, "fix the build")):
        d.call("session.open", {"cwd": str(cwd), "model": "stub-model", "session_id": sid,
                                "window_tokens": 100_000})
        turn(d, stub, sid, text)
    return World(d, stub, a, b)


def listed(d: SpawnedDaemon) -> dict[str, dict[str, Any]]:
    return {s["session_id"]: s for s in d.call("session.list", {})["sessions"]}


def rows(stdout: str) -> list[list[str]]:
    """The indented table rows of plain (piped) output, split on runs of 2+ spaces."""
    return [re.split(r"\s{2,}", ln.strip()) for ln in stdout.splitlines() if ln.startswith("  ")]


# -- list -------------------------------------------------------------------------------------
def test_list_current_dir_cwd_and_all(world: World) -> None:
    d = world.d
    r = qwenctl(d, "sessions", cwd=world.a)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "sessions in ~/proj-a"
    table = rows(r.stdout)
    assert table[0] == ["id", "updated", "msgs", "state", "title", "cwd"]
    assert len(table) == 2
    short, updated, msgs, state, title, cwd = table[1]
    assert short == SID_A[:8] and msgs == "2" and state == "open"
    assert title == "refactor auth please"  # the first user message, until the user names it
    assert cwd == "~/proj-a" and re.fullmatch(r"\d+[smhd] ago", updated)
    # `list` spelled out, --cwd (relative is made absolute), and --all
    r = qwenctl(d, "sessions", "list", "--cwd", "proj-b", cwd=d.home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "sessions in ~/proj-b"
    assert [t[0] for t in rows(r.stdout)[1:]] == [SID_B[:8]]
    for argv in (("sessions", "--all"), ("sessions", "list", "--all")):
        r = qwenctl(d, *argv, cwd=world.a)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "sessions (all projects)"
        got = {t[0]: t[5] for t in rows(r.stdout)[1:]}
        assert got == {SID_A[:8]: "~/proj-a", SID_B[:8]: "~/proj-b"}
    # a directory without sessions
    empty = d.home / "empty"
    empty.mkdir()
    r = qwenctl(d, "sessions", "--cwd", str(empty))
    assert r.returncode == 0 and r.stdout.strip() == "sessions in ~/empty: none"
    # --cwd and --all exclude each other
    assert qwenctl(d, "sessions", "--all", "--cwd", str(empty)).returncode == 2


def test_list_json_shapes(world: World) -> None:
    d = world.d
    r = qwenctl(d, "sessions", "--json", cwd=world.a)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert list(res) == ["sessions"] and len(res["sessions"]) == 1
    s = res["sessions"][0]
    assert set(s) == LIST_KEYS
    assert s["session_id"] == SID_A and s["cwd"] == str(world.a)
    assert s["messages"] == 2 and s["open"] is True and s["title"] == "refactor auth please"
    assert res == d.call("session.list", {"cwd": str(world.a)})
    r = qwenctl(d, "--json", "sessions", "list", "--all")
    assert r.returncode == 0, r.stderr
    all_ = json.loads(r.stdout)["sessions"]
    assert {x["session_id"] for x in all_} == {SID_A, SID_B}
    assert all(set(x) == LIST_KEYS for x in all_)


# -- title ------------------------------------------------------------------------------------
def test_title_auto_then_manual_survives_restart(world: World, spawn) -> None:  # type: ignore[no-untyped-def]
    d, stub = world.d, world.stub
    turn(d, stub, SID_A, "a second question does not rename the session")
    assert listed(d)[SID_A]["title"] == "refactor auth please"
    # a closed session is renamed through its record file
    d.call("session.close", {"session_id": SID_B})
    r = qwenctl(d, "sessions", "title", "a1b2f", "Fix", "the   CI build")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{SID_B[:8]}  Fix the CI build"
    # an open one through the daemon; --json gives the result
    r = qwenctl(d, "--json", "sessions", "title", SID_A, "Auth refactor")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"session_id": SID_A, "title": "Auth refactor"}
    titles = {k: v["title"] for k, v in listed(d).items()}
    assert titles == {SID_A: "Auth refactor", SID_B: "Fix the CI build"}
    rec = [json.loads(ln) for ln in (d.home / ".qwen" / "projects").glob(
        f"*/chats/{SID_B}.jsonl").__next__().read_text().splitlines()]
    assert rec[-1]["subtype"] == "custom_title"
    assert rec[-1]["systemPayload"] == {"customTitle": "Fix the CI build",
                                        "titleSource": "manual"}
    # bad input: a clear error, nothing changed
    for bad, field in (("   ", "title"), ("x" * 201, "title")):
        r = qwenctl(d, "--json", "sessions", "title", SID_A, bad)
        assert r.returncode == 1 and "title" in r.stderr, r.stderr
        assert json.loads(r.stdout)["error"]["data"]["field"] == field
    unknown = qwenctl(d, "sessions", "title", "ffffffff", "x")
    assert unknown.returncode == 1 and "no session matches" in unknown.stderr
    # kill -9, a new daemon, a lost index: the titles come back from the JSONL
    d.kill9()
    for f in (d.home / ".local" / "state" / "qwenctxd").glob("sessions.sqlite*"):
        f.unlink()
    again: SpawnedDaemon = spawn(root=d.root, env=model_env(stub))
    again.log_path = d.root / "again.log"
    again.start()
    assert again.call("daemon.drain", {"timeout_s": 10})["drained"]  # the index rebuild
    assert {k: v["title"] for k, v in listed(again).items()} == titles
    again.call("session.open", {"cwd": str(world.a), "model": "stub-model",
                                "session_id": SID_A, "resume": True})
    turn(again, stub, SID_A, "yet another question")
    assert listed(again)[SID_A]["title"] == "Auth refactor"


# -- show -------------------------------------------------------------------------------------
def test_show_by_prefix_open_and_closed(world: World) -> None:
    d = world.d
    status = {s["session_id"]: s for s in d.call("daemon.status")["sessions"]}[SID_A]
    r = qwenctl(d, "sessions", "show", "A1B2C")  # prefixes are case-insensitive
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"session {SID_A[:8]}"
    fields = dict(row for row in rows(r.stdout) if len(row) == 2)
    assert fields["id"] == SID_A and fields["cwd"] == "~/proj-a"
    assert fields["messages"] == "2" and fields["title"] == "refactor auth please"
    assert fields["state"] == "open in the daemon" and fields["model"] == "stub-model"
    used, window = status["prompt_tokens"], status["window_tokens"]
    assert window == 100_000 and used > 0
    assert fields["tokens"] == f"{used:,} / {window:,} ({100 * used / window:.1f}%)"
    assert fields["level"] == status["level"] == "ok"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+[smhd] ago\)", fields["updated"])
    # --json: the list row plus the daemon.status entry
    r = qwenctl(d, "sessions", "show", SID_A, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res) == LIST_KEYS | {"live"} and res["session_id"] == SID_A
    assert res["live"] == status
    # a closed session has no live fields
    d.call("session.close", {"session_id": SID_B})
    r = qwenctl(d, "sessions", "show", "a1b2f")
    assert r.returncode == 0, r.stderr
    fields = dict(row for row in rows(r.stdout) if len(row) == 2)
    assert fields["id"] == SID_B and fields["state"] == "closed"
    assert not {"model", "tokens", "level"} & set(fields)
    assert json.loads(qwenctl(d, "sessions", "show", "a1b2f", "--json").stdout)["live"] is None


def test_show_ambiguous_and_unknown_prefix(world: World) -> None:
    d = world.d
    r = qwenctl(d, "sessions", "show", "a1b2")
    assert r.returncode == 1 and r.stdout == ""
    assert "ambiguous" in r.stderr and SID_A in r.stderr and SID_B in r.stderr
    r = qwenctl(d, "sessions", "show", "a1b2", "--json")
    assert r.returncode == 1
    assert sorted(json.loads(r.stdout)["error"]["data"]["matches"]) == [SID_A, SID_B]
    r = qwenctl(d, "sessions", "show", "ffff")
    assert r.returncode == 1 and "no session matches 'ffff'" in r.stderr
    assert qwenctl(d, "sessions", "show").returncode == 2  # ID is required


# -- recap ------------------------------------------------------------------------------------
def test_recap_open_and_closed_sessions(world: World) -> None:
    d, stub = world.d, world.stub
    r = qwenctl(d, "sessions", "recap", "a1b2c")
    assert r.returncode == 0, r.stderr
    assert r.stdout == RECAP + "\n"
    asked = [q for q in stub.chat_requests if is_recap(q.body)]
    assert len(asked) == 1 and "refactor auth please" in json.dumps(asked[0].body)
    assert asked[0].body["model"] == "stub-fast"
    # a closed session is resumed for the recap and closed again
    d.call("session.close", {"session_id": SID_B})
    r = qwenctl(d, "sessions", "recap", SID_B, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"text": RECAP, "status": "ok", "reason": None}
    asked = [q for q in stub.chat_requests if is_recap(q.body)]
    assert len(asked) == 2 and "fix the build" in json.dumps(asked[1].body)
    assert listed(d)[SID_B]["open"] is False
    assert SID_B not in {s["session_id"] for s in d.call("daemon.status")["sessions"]}
    assert listed(d)[SID_A]["open"] is True  # untouched


def test_recap_without_a_model_exits_1(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    repo = project(d.home, "proj")
    sid = d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    turn(d, None, sid, "hello there")
    r = qwenctl(d, "sessions", "recap", sid[:8])
    assert r.returncode == 1 and r.stdout == ""
    assert "recap unavailable: not_configured" in r.stderr


# -- delete -----------------------------------------------------------------------------------
def test_delete_needs_yes_without_a_tty(world: World) -> None:
    d = world.d
    path = Path(d.call("session.open", {"cwd": str(world.a), "model": "stub-model",
                                        "session_id": SID_A})["path"])
    assert path.exists()
    r = qwenctl(d, "sessions", "delete", "a1b2c")
    assert r.returncode == 1 and "without --yes" in r.stderr and r.stdout == ""
    assert SID_A in listed(d) and path.exists()
    r = qwenctl(d, "sessions", "delete", "a1b2c", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"deleted {SID_A}\n"
    assert set(listed(d)) == {SID_B} and not path.exists()
    r = qwenctl(d, "sessions", "--cwd", str(world.a))
    assert r.stdout.strip() == "sessions in ~/proj-a: none"
    # a closed session goes too; --json reports the daemon's answer
    d.call("session.close", {"session_id": SID_B})
    r = qwenctl(d, "sessions", "delete", SID_B, "-y", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"session_id": SID_B, "deleted": True}
    assert listed(d) == {}
    assert qwenctl(d, "sessions", "delete", SID_B, "--yes").returncode == 1  # gone


def test_delete_asks_on_a_tty(world: World) -> None:
    d = world.d

    def answer(text: bytes) -> subprocess.CompletedProcess[str]:
        master, slave = os.openpty()
        try:
            os.write(master, text)
            return qwenctl_runs.qwenctl(d, "sessions", "delete", "a1b2f", stdin=slave)
        finally:
            os.close(slave)
            os.close(master)

    r = answer(b"n\n")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"delete session {SID_B} (2 messages)? [y/N] ")
    assert SID_B in listed(d)
    r = answer(b"y\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"deleted {SID_B}\n" and SID_B not in listed(d)


# -- summary ----------------------------------------------------------------------------------
def test_summary_writes_project_summary(world: World) -> None:
    d, stub = world.d, world.stub
    d.call("session.close", {"session_id": SID_A})  # resumed for the call, closed after
    r = qwenctl(d, "sessions", "summary", "a1b2c")
    assert r.returncode == 0, r.stderr
    target = world.a / ".qwen" / "PROJECT_SUMMARY.md"
    assert target.read_text() == SUMMARY_MD
    lines = r.stdout.splitlines()
    assert lines[0] == f"saved {target}" and lines[1] == ""
    assert "\n".join(lines[2:]) + "\n" == SUMMARY_MD
    asked = [q for q in stub.chat_requests if is_project_summary(q.body)]
    assert len(asked) == 1 and "refactor auth please" in json.dumps(asked[0].body)
    assert listed(d)[SID_A]["open"] is False
    r = qwenctl(d, "sessions", "summary", SID_B, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["path"] == str(world.b / ".qwen" / "PROJECT_SUMMARY.md")
    assert res["text"] == SUMMARY_MD.rstrip()
