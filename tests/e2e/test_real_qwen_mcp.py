"""The real Qwen Code CLI with ``qwenctl mcp`` in ``mcpServers`` recalls a memory over MCP.

Qwen Code 0.24 names MCP tools ``mcp__<server>__<tool>`` and, in a headless run, defers them
behind ``tool_search`` / ``tool_call`` (the deferred-tools reminder lists them by name). The
scripted model answers the main request (the one whose tools include ``skill``) by reviewing
``mcp__qwenctx__recall_memory`` with ``tool_search`` and calling it through ``tool_call``;
the test asserts that the tool result, holding the memory the daemon stored, reaches the
model's next request. ``--approval-mode yolo`` lets a headless run call the MCP tool without
a confirmation prompt. The server gets no ``--cwd``: it finds the project as the README
configures it, from what Qwen Code tells it (its roots, else the directory it starts it in).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from tests.e2e.qwen_cli import QwenCli

pytestmark = pytest.mark.real_qwen

SERVER = "qwenctx"
RECALL = f"mcp__{SERVER}__recall_memory"
FACT = "The release freeze starts on March 14th; only the release captain merges to main."


def tool_names(body: dict[str, Any]) -> list[str]:
    return [(t.get("function") or {}).get("name") for t in body.get("tools") or []]


def tool_results(body: dict[str, Any]) -> dict[str, str]:
    """tool_call_id → the text of each tool message in a request."""
    out = {}
    for m in body.get("messages", []):
        if m.get("role") == "tool":
            c = m.get("content")
            out[m["tool_call_id"]] = c if isinstance(c, str) else json.dumps(c)
    return out


def scripted_model(body: dict[str, Any]) -> Reply:
    if "skill" not in tool_names(body):  # side queries of the CLI (titles, memory, …)
        return Reply(content="{}")
    results = tool_results(body)
    if "call-recall" in results:
        return Reply(content="The freeze starts on March 14th.")
    if "call-search" in results:
        return Reply(tool_calls=[{"id": "call-recall", "function": {
            "name": "tool_call",
            "arguments": {"name": RECALL, "arguments": {"query": "release freeze"}}}}])
    return Reply(tool_calls=[{"id": "call-search", "function": {
        "name": "tool_search", "arguments": {"query": f"select:{RECALL}"}}}])


def test_qwen_code_recalls_a_memory_through_qwenctl_mcp() -> None:
    d = SpawnedDaemon().start()
    try:
        proj = d.home / "proj"
        (proj / ".git").mkdir(parents=True)
        saved = d.call("memory.save", {"cwd": str(proj), "type": "project",
                                       "name": "Release freeze", "description": "freeze dates",
                                       "body": FACT})
        settings = d.home / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"mcpServers": {SERVER: {
            "command": sys.executable, "args": ["-m", "qwenctl", "mcp"],
            "env": {"QWENCTXD_SOCKET": str(d.socket)}}}}))
        with ScriptedOpenAI(handler=scripted_model) as stub:
            cli = QwenCli(home=d.home, cwd=proj, base_url=stub.base_url)
            proc = cli.run("--approval-mode", "yolo", prompt="when is the release freeze?")
            main = [r.body for r in stub.chat_requests if "skill" in tool_names(r.body)]
    finally:
        d.cleanup()
    assert "March 14th" in proc.stdout
    first = json.dumps(main[0]["messages"])
    assert RECALL in first, "the deferred-tools reminder does not list the MCP tool"
    after = [tool_results(b) for b in main if "call-recall" in tool_results(b)]
    assert after, f"the recall result never reached the model ({len(main)} main requests)"
    result = after[0]["call-recall"]
    assert '"result"' not in result  # text content only, not a structured duplicate
    assert FACT in result and "Release freeze" in result
    assert Path(saved["path"]).name in result  # the rendered memory names its file
