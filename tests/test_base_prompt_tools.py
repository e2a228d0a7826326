"""C5 through the socket: the base prompt follows the declared tools and the client's name;
sections whose tools are not declared are left out and reported as omitted."""

from __future__ import annotations

import pytest

from qwenctxd.testing.contract import c5_problems
from qwenctxd.testing.inprocess import InProcessDaemon


def _tool(name: str, *params: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in params}}}}


CLAUDE_LIKE = [_tool("Read", "file_path"), _tool("Bash", "command"),
               _tool("str_replace_editor", "command", "path", "old_str", "new_str"),
               _tool("Grep", "pattern")]


@pytest.fixture
def daemon(inprocess_daemon: InProcessDaemon) -> InProcessDaemon:
    """This module's handler tests need no process: they run on the in-process daemon."""
    return inprocess_daemon


def test_prompt_follows_declared_tools_and_agent(daemon: InProcessDaemon) -> None:
    r = daemon.call("prompt.system", {"cwd": str(daemon.home), "model": "qwen3-coder-plus",
                                      "tools": CLAUDE_LIKE, "agent": {"name": "Helix"}})
    text = r["text"]
    assert text.startswith("You are Helix, an interactive command-line coding agent.")
    assert c5_problems(text, ["Read", "Bash", "str_replace_editor", "Grep", "skill"], "Helix") == []
    assert "<function=Bash>" in text and "<parameter=old_str>" in text  # their names, their params
    assert "<function=Read>\n<parameter=file_path>" in text
    omitted = [s for s in r["sections"] if s.get("omitted")]
    assert omitted == [{"name": "task_management", "chars": 0, "est_tokens": 0, "omitted": True}]


def test_no_tools_means_no_tool_sections_in_a_session(daemon: InProcessDaemon) -> None:
    sid = daemon.call("session.open", {"cwd": str(daemon.home), "model": "m"})["session_id"]
    p = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
    assert [t["function"]["name"] for t in p["tools"]] == ["skill"]
    assert p["system"].startswith("You are an interactive command-line coding agent.")
    assert "# Examples" not in p["system"] and "# Task Management" not in p["system"]
    assert c5_problems(p["system"], ["skill"]) == []
    r = daemon.call("prompt.system", {"cwd": str(daemon.home), "model": "m", "tools": []})
    assert {s["name"] for s in r["sections"] if s.get("omitted")} == {
        "task_management", "tool_call_examples"}


def test_todo_tool_brings_task_management_back(daemon: InProcessDaemon) -> None:
    r = daemon.call("prompt.system", {"cwd": str(daemon.home),
                                      "tools": [_tool("TodoWrite", "todos")]})
    assert "Use the `TodoWrite` tool" in r["text"]
    assert not [s for s in r["sections"] if s.get("omitted") and s["name"] == "task_management"]
