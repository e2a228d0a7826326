"""qwenctl says what happened (issue 19's wording fixes), through a spawned daemon and the
scripted model: undoing an extraction's create, a mistyped @import, paths from a
subdirectory, a throttled dream, and a memory log path column on a narrow terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import time
from functools import partial
from pathlib import Path
from typing import Any

from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

LONG_NAME = "a-rather-long-memory-file-name-about-tabs-in-go-files.md"


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test"}


#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL)


def qwenctl_on_tty(d: SpawnedDaemon, *args: str, columns: int) -> tuple[int, str]:
    """Run qwenctl with stdout on a pseudo-terminal ``columns`` wide; (exit code, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**d.env, "COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "qwenctl", *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(30)
    return code, b"".join(chunks).decode(errors="replace")


def is_extractor(body: dict[str, Any]) -> bool:
    first = body.get("messages", [{}])[0]
    return first.get("role") == "system" and "memory extractor" in str(first.get("content"))


def repo_in(home: Path) -> Path:
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    return repo


def extract_one_memory(d: SpawnedDaemon, stub: ScriptedOpenAI, repo: Path) -> Path:
    project = Path(d.call("memory.status", {"cwd": str(repo)})["roots"]["project"])
    target = project / "feedback" / LONG_NAME
    calls = []

    def handler(body: dict[str, Any]) -> Reply:
        if not is_extractor(body):
            return Reply(content="ok")
        calls.append(body)
        if len(calls) == 1:
            return Reply(tool_calls=[{"id": "w1", "type": "function", "function": {
                "name": "write_file", "arguments": json.dumps({
                    "file_path": str(target),
                    "content": "---\nname: Tabs in Go\ndescription: tabs in Go files\n"
                               "type: feedback\n---\nUse tabs.\n"})}}])
        return Reply(content="saved one memory")

    stub.handler = handler
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "always tabs in Go"})
    d.call("session.record_model", {"session_id": sid,
                                    "message": {"role": "assistant", "content": "ok"}})
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    assert target.exists()
    return target


def test_memory_log_keeps_the_path_and_undo_of_a_create_says_so(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = repo_in(d.home)
        target = extract_one_memory(d, stub, repo)
        entry = d.call("memory.log", {"limit": 5})["entries"][-1]
        assert (entry["action"], entry["agent"]) == ("create", "extraction")
        # a narrow terminal: the path column folds onto more lines, every character stays
        code, out = qwenctl_on_tty(d, "memory", "log", columns=72)
        assert code == 0, out
        assert "…" not in out
        cells = [ln.split("│")[-2].strip() for ln in out.splitlines()
                 if ln.count("│") >= 6 and "path" not in ln]
        shown = "".join(cells)
        expected = "~/" + str(target.relative_to(d.home))
        assert shown == expected, (shown, out)
        # undoing the extraction's create removes the file and says so
        r = qwenctl(d, "memory", "undo", entry["id"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (f"restored {target}: removed the file the extraction agent "
                                    "had created")
        assert "undid a delete" not in r.stdout and not target.exists()
        # the socket says the same: what was undone, and what the undo did
        log = d.call("memory.log", {"limit": 5})["entries"]
        assert [e["action"] for e in log] == ["create", "delete", "undo"]
        assert log[-1]["undoes"] == entry["id"]


def test_undo_result_names_the_undone_entry(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = repo_in(d.home)
        target = extract_one_memory(d, stub, repo)
        entry = d.call("memory.log", {"limit": 5})["entries"][-1]
        res = d.call("memory.undo", {"id": entry["id"]})
        assert res == {"restored": str(target), "action": "delete",
                       "undone": {"id": entry["id"], "agent": "extraction", "action": "create"},
                       "message": "removed the file the extraction agent had created"}


def test_throttled_dream_says_when_and_that_force_exists(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(default=Reply(content="ok")) as stub:
        d: SpawnedDaemon = spawn(env=model_env(stub)).start()
        repo = repo_in(d.home)
        first = d.call("memory.dream", {"cwd": str(repo)})
        assert first["skipped_reason"] == "min_sessions" and first["force_skips"] is True
        before = time.time()
        second = d.call("memory.dream", {"cwd": str(repo)})
        assert second["skipped_reason"] == "scan_throttled" and second["force_skips"] is True
        # the scan happened a moment ago; the next is allowed 10 minutes after it
        assert before - 60 + 600 <= second["retry_at"] <= time.time() + 600
        r = qwenctl(d, "memory", "dream", "--cwd", str(repo))
        assert r.returncode == 0, r.stderr
        line = r.stdout.strip()
        assert line.startswith("dream skipped: scan_throttled (")
        when = time.strftime("%H:%M", time.localtime(second["retry_at"]))
        assert f"the next attempt is allowed at {when}" in line
        assert "`qwenctl memory dream --force` runs it now" in line
        j = json.loads(qwenctl(d, "memory", "dream", "--cwd", str(repo), "--json").stdout)
        assert j["skipped_reason"] == "scan_throttled" and isinstance(j["retry_at"], float)


def test_mistyped_import_is_a_problem_and_paths_from_a_subdir(daemon: SpawnedDaemon) -> None:
    repo = repo_in(daemon.home)
    (repo / "docs").mkdir()
    (repo / "docs" / "style.md").write_text("Use tabs.\n")
    (repo / "QWEN.md").write_text("# Project\n@./docs/stlye.md\nAsk @alice about it.\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "AGENTS.md").write_text("Sub notes.\n")
    res = daemon.call("instructions.files", {"cwd": str(repo / "sub")})
    assert [(e["kind"], e["path"]) for e in res["errors"]] == [
        ("import_missing", str(repo / "QWEN.md"))]
    assert "docs/stlye.md" in res["errors"][0]["message"]
    r = qwenctl(daemon, "instructions", cwd=repo / "sub")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "problems: none" not in lines
    problems = lines.index("problems")
    assert lines[problems + 2].split()[:2] == ["import_missing", "QWEN.md"]
    assert "@./docs/stlye.md: no such file" in lines[problems + 2]
    # every project path relative to the project root, from the subdirectory too
    files = [ln.split()[2] for ln in lines if ln.split()[:1] and ln.split()[0].isdigit()]
    assert files == ["QWEN.md", "sub/AGENTS.md"]
    # fixing the typo clears the problem
    (repo / "QWEN.md").write_text("# Project\n@./docs/style.md\nAsk @alice about it.\n")
    until(lambda: not daemon.call("instructions.files", {"cwd": str(repo / "sub")})["errors"],
          what="the fixed import to clear the problem")
    assert qwenctl(daemon, "instructions", cwd=repo / "sub").stdout.splitlines()[-1] == \
        "problems: none"
