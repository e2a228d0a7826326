"""Qwen Code 0.24 parity through the socket: the git snapshot's slot and lifetime, Qwen Code
session files the daemon did not write (resume, recap input), and old OpenAI-shaped files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "QWEN.md").write_text("be brief\n")
    subprocess.run([*GIT, "add", "QWEN.md"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "first commit"], cwd=repo, check=True)
    return repo


def test_the_git_snapshot_sits_before_auto_memory_and_is_frozen_for_the_session(
        daemon: SpawnedDaemon) -> None:
    repo = make_repo(daemon.root)
    (repo / "early.txt").write_text("x\n")
    with daemon.client() as c:
        sid = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
        first = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
        (repo / "late.txt").write_text("y\n")
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "second commit"], cwd=repo, check=True)
        c.call("session.record_model", {"session_id": sid,
                                        "message": {"role": "assistant", "content": "hello"}})
        second = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "more"})
        other = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
        fresh = c.call("session.turn", {"session_id": other, "kind": "user", "text": "hi"})
    system = first["system"]
    assert second["system"] == system  # the prefix did not move mid-session
    snapshot = system.index("```text\ngit: Current branch: main\ngit: Status:\n")
    assert "git: ?? early.txt" in system and "late.txt" not in system
    assert "untrusted repository data" in system[:snapshot]
    assert system.index("--- End of Context from: QWEN.md ---") < snapshot
    if "# auto memory" in system:  # the memory section comes after the snapshot
        assert system.index("\n\n---\n\n# auto memory") > snapshot
    # a session opened later takes its own snapshot
    assert "git: " in fresh["system"] and "second commit" in fresh["system"]
    assert "second commit" not in system


def test_sessions_opened_in_a_burst_share_a_snapshot_until_the_work_tree_moves(
        daemon: SpawnedDaemon) -> None:
    """A new session may reuse a snapshot taken a moment ago (issue 28: three git processes
    per session.open), but never one older than a file added at the root, a staged change or
    a commit."""
    repo = make_repo(daemon.root)
    with daemon.client() as c:
        def system_of_new_session() -> str:
            sid = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
            return c.call("session.turn", {"session_id": sid, "kind": "user",
                                           "text": "hi"})["system"]

        first = system_of_new_session()
        assert system_of_new_session() == first  # nothing moved
        (repo / "added.txt").write_text("new\n")
        untracked = system_of_new_session()
        (repo / "sub").mkdir()
        (repo / "sub" / "deep.txt").write_text("d\n")
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        staged = system_of_new_session()
        subprocess.run([*GIT, "commit", "-q", "-m", "third commit"], cwd=repo, check=True)
        committed = system_of_new_session()
    assert "git: Status: clean" in first
    assert "git: ?? added.txt" in untracked
    assert "git: A  sub/deep.txt" in staged and "git: A  added.txt" in staged
    assert "third commit" in committed and "third commit" not in staged


def test_sessions_opened_at_the_same_moment_make_one_git_query(
        spawn: type[SpawnedDaemon], tmp_path: Path) -> None:
    """A burst of concurrent ``session.open`` in one repository (32 proxied conversations, a
    fan of subagents) waits on one git query instead of starting one each: every session gets
    the snapshot, and git ran once (a ``git`` on PATH that logs each status call)."""
    real_git = shutil.which("git")
    assert real_git is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "git-calls.log"
    wrapper = bin_dir / "git"
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *status*) echo status >> {calls} ;; esac\n"
                       f"sleep 0.3\nexec {real_git} \"$@\"\n")
    wrapper.chmod(0o755)
    d = spawn(env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}).start()
    repo = make_repo(d.root)
    sessions = 12

    def open_one(_: int) -> str:
        with d.client() as c:
            sid = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
            return str(c.call("session.turn", {"session_id": sid, "kind": "user",
                                               "text": "hi"})["system"])

    with ThreadPoolExecutor(sessions) as pool:
        systems = list(pool.map(open_one, range(sessions)))
    assert all("git: Status: clean" in s for s in systems)
    assert calls.read_text().count("status") == 1


def write_qwen_session(path: Path, sid: str, cwd: str) -> None:
    """A session file as the Qwen Code CLI 0.24.4 writes it (shapes recorded from the real CLI)."""
    base = {"sessionId": sid, "cwd": cwd, "version": "0.24.4", "gitBranch": "main"}
    recs = [
        {"type": "user", "provenance": "real_user",
         "message": {"role": "user", "parts": [{"text": "look at notes.txt"}]}},
        {"type": "system", "subtype": "ui_telemetry", "systemPayload": {"uiEvent": {}}},
        {"type": "assistant", "model": "m", "message": {"role": "model", "parts": [
            {"text": "thinking about it", "thought": True},
            {"functionCall": {"id": "call_1", "name": "read_file",
                              "args": {"file_path": "/w/notes.txt"}}}]},
         "usageMetadata": {"promptTokenCount": 1000, "candidatesTokenCount": 35,
                           "thoughtsTokenCount": 5, "totalTokenCount": 1040}},
        {"type": "tool_result", "message": {"role": "user", "parts": [
            {"functionResponse": {"id": "call_1", "name": "read_file",
                                  "response": {"output": "banana\n"}}}]}},
        {"type": "assistant", "model": "m", "message": {"role": "model", "parts": [
            {"text": "It says banana."}]},
         "usageMetadata": {"promptTokenCount": 1100, "candidatesTokenCount": 10,
                           "totalTokenCount": 1110}},
        {"type": "user", "message": {"role": "user", "parts": [
            {"text": "<system-reminder>\nsecret reminder text\n</system-reminder>"},
            {"text": "thanks"},
            {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]}},
        {"type": "assistant", "model": "m", "message": {"role": "model", "parts": [
            {"text": "You are welcome."}]}},
    ]
    parent = None
    lines = []
    for i, r in enumerate(recs):
        u = str(uuid.uuid4())
        lines.append(json.dumps({"uuid": u, "parentUuid": parent,
                                 "timestamp": f"2026-01-01T00:00:0{i}.000Z", **base, **r}))
        parent = u
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_the_daemon_resumes_a_qwen_code_session_as_valid_chat_messages(
        daemon: SpawnedDaemon) -> None:
    proj = daemon.root / "w"
    proj.mkdir()
    sid = str(uuid.uuid4())
    slug = "".join(ch if ch.isalnum() else "-" for ch in str(proj))
    write_qwen_session(daemon.home / ".qwen" / "projects" / slug / "chats" / f"{sid}.jsonl",
                       sid, str(proj))
    with daemon.client() as c:
        listed = c.call("session.list", {"cwd": str(proj)})["sessions"]
        opened = c.call("session.open", {"cwd": str(proj), "model": "m", "session_id": sid,
                                         "resume": True})
        turn = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "next"})
    assert [s["session_id"] for s in listed] == [sid] and listed[0]["messages"] == 6
    assert opened["resumed"] and opened["messages"] == 6
    # the token count is anchored on the last usageMetadata (prompt + candidates)
    assert opened["prompt_tokens"] >= 1110
    msgs = turn["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "user",
                                         "assistant", "user"]
    assert msgs[0]["content"] == "look at notes.txt"
    assert msgs[1]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {
        "name": "read_file", "arguments": '{"file_path":"/w/notes.txt"}'}}]
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "content": "banana\n"}
    assert msgs[4]["content"][2] == {"type": "image_url",
                                     "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = {"model": "m", "messages": [{"role": "system", "content": turn["system"]}, *msgs]}
    assert validate_chat_body(body) == []


def test_an_old_openai_shaped_session_file_still_resumes(daemon: SpawnedDaemon) -> None:
    proj = daemon.root / "old"
    proj.mkdir()
    sid = str(uuid.uuid4())
    slug = "".join(ch if ch.isalnum() else "-" for ch in str(proj))
    path = daemon.home / ".qwen" / "projects" / slug / "chats" / f"{sid}.jsonl"
    path.parent.mkdir(parents=True)
    rows = [
        {"type": "user", "message": {"role": "user", "content": "old question"}},
        {"type": "assistant", "message": {"role": "assistant", "content": "old answer"},
         "usage": {"prompt_tokens": 50, "completion_tokens": 5}},
    ]
    path.write_text("".join(json.dumps({"uuid": str(uuid.uuid4()), "sessionId": sid,
                                        "timestamp": "2025-01-01T00:00:00.000Z",
                                        "cwd": str(proj), **r}) + "\n" for r in rows))
    with daemon.client() as c:
        c.call("session.open", {"cwd": str(proj), "model": "m", "session_id": sid,
                                "resume": True})
        turn = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "new"})
    assert turn["messages"][:2] == [{"role": "user", "content": "old question"},
                                    {"role": "assistant", "content": "old answer"}]
    # what the daemon appended is in Qwen Code's format
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["message"]["role"] == "user" and "parts" in last["message"]


def test_the_daemon_reaches_the_model_named_in_qwen_codes_dotenv(
        spawn: type[SpawnedDaemon]) -> None:
    with ScriptedOpenAI(default=Reply(content="<recap>We set up the model.</recap>")) as stub:
        d = spawn()
        (d.home / ".qwen").mkdir()
        (d.home / ".qwen" / ".env").write_text(
            f"OPENAI_BASE_URL={stub.base_url}\nOPENAI_API_KEY=sk-dotenv\nOPENAI_MODEL=m-dotenv\n")
        d.start()
        proj = d.root / "p"
        proj.mkdir()
        with d.client() as c:
            sid = c.call("session.open", {"cwd": str(proj), "model": "m"})["session_id"]
            c.call("session.turn", {"session_id": sid, "kind": "user", "text": "set it up"})
            c.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": "done"}})
            recap = c.call("session.recap", {"session_id": sid})
        assert recap["status"] == "ok" and recap["text"] == "We set up the model."
        req = stub.chat_requests[-1]
        assert req.headers.get("authorization") == "Bearer sk-dotenv"
        assert req.body["model"] == "m-dotenv"


def test_recap_of_a_qwen_code_session_leaves_its_system_reminders_out(
        spawn: type[SpawnedDaemon]) -> None:
    with ScriptedOpenAI(default=Reply(content="<recap>You read notes.txt.</recap>")) as stub:
        d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k",
                       "OPENAI_MODEL": "m"}).start()
        proj = d.root / "w"
        proj.mkdir()
        sid = str(uuid.uuid4())
        slug = "".join(ch if ch.isalnum() else "-" for ch in str(proj))
        write_qwen_session(d.home / ".qwen" / "projects" / slug / "chats" / f"{sid}.jsonl",
                           sid, str(proj))
        with d.client() as c:
            c.call("session.open", {"cwd": str(proj), "model": "m", "session_id": sid,
                                    "resume": True})
            recap = c.call("session.recap", {"session_id": sid})
        assert recap["status"] == "ok" and recap["text"] == "You read notes.txt."
        sent = json.dumps([r.body for r in stub.chat_requests if "<recap>" in json.dumps(r.body)])
        assert "look at notes.txt" in sent and "It says banana." in sent and "thanks" in sent
        assert "secret reminder text" not in sent


def test_cleared_edit_and_write_file_results_are_reported_as_evicted_reads(
        daemon: SpawnedDaemon) -> None:
    proj = daemon.root / "e"
    (proj / ".qwen").mkdir(parents=True)
    (proj / ".git").mkdir()
    (proj / ".qwen" / "settings.json").write_text(
        json.dumps({"context": {"clearContextOnIdle": {"toolResultsNumToKeep": 1}}}))
    big = "line of output\n" * 400
    with daemon.client() as c:
        sid = c.call("session.open", {"cwd": str(proj), "model": "m"})["session_id"]
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "change things"})
        for i, (tool, path) in enumerate([("write_file", "/e/new.py"), ("edit", "/e/old.py"),
                                          ("read_file", "/e/last.py")]):
            c.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": "", "tool_calls": [{
                    "id": f"c{i}", "type": "function", "function": {
                        "name": tool, "arguments": json.dumps({"file_path": path})}}]}})
            c.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
                {"tool_call_id": f"c{i}", "content": big}]})
        r = c.call("session.compress", {"session_id": sid, "mode": "fast"})
    [ev] = [e for e in r["events"] if e["type"] == "micro_compacted"]
    assert ev["cleared"]["tool"] == 2
    assert ev["evicted_read_paths"] == ["/e/new.py", "/e/old.py"]


SUMMARY = ("<analysis>walked through it</analysis>\n<state_snapshot>\n<primary_request_and_intent>"
           "tidy the module and keep the tests green</primary_request_and_intent>\n<next_step>"
           "run the tests again</next_step>\n</state_snapshot>")


def _compress_after_a_read_and_an_image(d: SpawnedDaemon, proj: Path) -> list[dict]:
    with d.client() as c:
        sid = c.call("session.open", {"cwd": str(proj), "model": "m", "tools": [READ_TOOL]})[
            "session_id"]
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "look",
                                "images": [{"type": "image_url", "image_url": {"url": PNG}}]})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "", "tool_calls": [{
                "id": "r1", "type": "function", "function": {
                    "name": "read_file",
                    "arguments": json.dumps({"file_path": str(proj / "mod.py")})}}]}})
        c.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": "r1", "content": "def f():\n    return 1\n" * 40}]})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "It defines f. " * 50}})
        r = c.call("session.compress", {"session_id": sid})
        assert r["status"] == "compressed", r
        return c.call("session.turn", {"session_id": sid, "kind": "user", "text": "go"})[
            "messages"]


PNG = "data:image/png;base64," + "iVBORw0KGgo" * 30
READ_TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"file_path": {"type": "string"}}}}}


def test_max_recent_files_and_images_to_retain_are_honoured(spawn: type[SpawnedDaemon]) -> None:
    with ScriptedOpenAI(default=Reply(content=SUMMARY)) as stub:
        d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k",
                       "OPENAI_MODEL": "m"}).start()
        default_proj, zero_proj = d.root / "dflt", d.root / "zero"
        for proj in (default_proj, zero_proj):
            (proj / ".git").mkdir(parents=True)
            (proj / "mod.py").write_text("def f():\n    return 1\n")
        (zero_proj / ".qwen").mkdir()
        (zero_proj / ".qwen" / "settings.json").write_text(json.dumps({"model": {
            "chatCompression": {"maxRecentFilesToRetain": 0, "maxRecentImagesToRetain": 0}}}))
        restored = json.dumps(_compress_after_a_read_and_an_image(d, default_proj))
        bare = json.dumps(_compress_after_a_read_and_an_image(d, zero_proj))
    assert "mod.py" in restored and PNG in restored  # defaults: 5 files, 3 images
    assert "tidy the module" in bare
    assert "mod.py" not in bare and PNG not in bare  # 0/0: no attachment at all


def test_the_first_user_message_carries_the_environment_once(daemon: SpawnedDaemon) -> None:
    from datetime import datetime

    from qwenctxd.sessions.environment import date_in_words

    proj = make_repo(daemon.root)
    (proj / "src").mkdir()
    for i in range(30):
        (proj / "src" / f"m{i:02}.py").write_text("")
    with daemon.client() as c:
        sid = c.call("session.open", {"cwd": str(proj), "model": "m"})["session_id"]
        first = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
        c.call("session.record_model", {"session_id": sid,
                                        "message": {"role": "assistant", "content": "hello"}})
        second = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "again"})
    parts = first["messages"][0]["content"]
    env = [p["text"] for p in parts if "Working directory:" in p["text"]]
    assert len(env) == 1 and parts[-1] == {"type": "text", "text": "hi"}
    text = env[0]
    assert text.startswith("<system-reminder>\n") and text.endswith("</system-reminder>")
    assert date_in_words(datetime.now().astimezone()) in text
    assert f"Working directory: {proj}\n" in text and "Operating system: linux" in text
    tree = text.split(f"{proj}/\n", 1)[1]
    assert tree.startswith("├───QWEN.md\n├───.git/...\n└───src/\n    ├───m00.py")
    assert sum(1 for line in tree.splitlines() if "───" in line) == 21  # 20 entries + "..."
    # written once, into history: the next request repeats it byte for byte, adds no other
    assert second["messages"][0] == first["messages"][0]
    assert sum("Working directory:" in json.dumps(m) for m in second["messages"]) == 1
