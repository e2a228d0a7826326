"""examples/agent.py, the reference agent, runs against the scripted model in a real git repo:
its failed model call is retried, the daemon answers its skill call, a compaction fires and is
shown, its edit lands on disk and its commit lands in git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI

AGENT = Path(__file__).resolve().parents[1] / "examples" / "agent.py"
SUMMARY = ("<state_snapshot>\n<primary_request_and_intent>greet the world in hello.py"
           "</primary_request_and_intent>\n<next_step>edit hello.py</next_step>\n"
           "</state_snapshot>")


def _call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def test_reference_agent_edits_and_commits_through_a_compaction(spawn) -> None:  # type: ignore[no-untyped-def]
    script = [
        Reply(fault="http_500"),  # the first call fails: the agent retries
        Reply(tool_calls=[_call("a1", "read_file", file_path="notes.txt"),
                          _call("a2", "run_shell", command="git status --short")]),
        Reply(tool_calls=[_call("a3", "skill", skill="greeting-style")]),
        Reply(tool_calls=[_call("a4", "edit_file", file_path="hello.py",
                                old_string="Hello", new_string="Hello, world")]),
        Reply(content="Done: hello.py greets the world."),
        Reply(tool_calls=[_call("a5", "run_shell", command="git commit -qam 'greet the world'")]),
        Reply(content="Committed."),
    ]
    main_bodies: list[dict[str, Any]] = []

    def model(body: dict[str, Any]) -> Reply:
        system = next((m for m in body["messages"] if m["role"] == "system"), {})
        if "state_snapshot" in str(system.get("content")):
            return Reply(content=SUMMARY)
        names = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
        if "edit_file" not in names:  # the daemon's own side queries (memory extraction…)
            return Reply(content="nothing to do")
        main_bodies.append(body)
        return script.pop(0)

    with ScriptedOpenAI(handler=model, strict_chat=True) as stub:
        env = {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "main-model",
               "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}
        d = spawn(env=env).start()
        repo = d.home / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        git(repo, "config", "user.email", "t@example.com")
        git(repo, "config", "user.name", "T")
        (repo / "hello.py").write_text('print("Hello")\n')
        (repo / "notes.txt").write_text("a long note line\n" * 2_000)  # ~8 000 tokens
        skill = repo / ".qwen" / "skills" / "greeting-style"
        skill.mkdir(parents=True)
        (skill / "SKILL.md").write_text("---\nname: greeting-style\ndescription: How greetings "
                                        "are written\n---\nGreetings end with a comma and "
                                        "the word world.\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "init")
        run = subprocess.run(
            [sys.executable, str(AGENT), "--cwd", str(repo), "--model", "main-model",
             "--window", "12000", "make hello.py greet the world", "commit it"],
            env={**os.environ, **d.env, **env}, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr

    assert (repo / "hello.py").read_text() == 'print("Hello, world")\n'  # the edit landed
    assert "greet the world" in git(repo, "log", "--oneline")  # and the commit
    assert git(repo, "status", "--short").strip() == ""
    assert "model call failed (1/2)" in run.stderr
    assert "[qwenctxd: compressed" in run.stderr  # the compaction was shown
    assert "[skill loaded by the daemon" in run.stdout
    assert script == []
    # the skill result the model saw came from the daemon, and the prompts stayed valid
    skill_result = [m for b in main_bodies for m in b["messages"]
                    if m.get("role") == "tool" and m.get("tool_call_id") == "a3"]
    assert skill_result and "Greetings end with a comma" in skill_result[0]["content"]
    system = main_bodies[-1]["messages"][0]["content"]
    assert system.startswith("You are qwenctxd reference agent") and "Qwen Code" not in system
