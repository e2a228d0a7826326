"""session.search from its clients: ``qwenctl sessions search`` (table, filters, --json) and
``sessions show ID --messages --around ENTRY``; the MCP tool ``search_sessions`` through the
official MCP SDK's stdio client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_mcp_server import mcp_session, ok
from test_session_search import settled, write_session

from qwenctxd.testing.spawn import SpawnedDaemon


def qwenctl(d: SpawnedDaemon, *args: str, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qwenctl", *args], env=d.env, cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def two_projects(d: SpawnedDaemon) -> tuple[Path, Path, str, str]:
    here, there = d.home / "here", d.home / "there"
    (here / ".git").mkdir(parents=True)
    there.mkdir()
    a = write_session(d, here, [("user", "let us pick a budget for retries"),
                                ("model", "We settle on a retry budget of seven."),
                                ("user", "ok"), ("model", "noted"), ("user", "and then"),
                                ("model", "done")])
    b = write_session(d, there, [("user", "the retry budget over there is three"),
                                 ("tool", "retry budget log: 3")])
    settled(d, 2)
    return here, there, a, b


def test_qwenctl_sessions_search_and_show_around(daemon: SpawnedDaemon) -> None:
    here, _there, a, b = two_projects(daemon)
    r = qwenctl(daemon, "sessions", "search", "retry", "budget", cwd=here)
    assert r.returncode == 0, r.stderr
    assert a[:8] in r.stdout and b[:8] not in r.stdout  # the current project only
    assert "We settle on a retry budget of seven." in r.stdout
    assert f"qwenctl sessions show {a[:8]} --messages --around 1" in r.stdout
    every = qwenctl(daemon, "sessions", "search", "retry budget", "--all", cwd=here)
    assert a[:8] in every.stdout and b[:8] in every.stdout
    tool = json.loads(qwenctl(daemon, "sessions", "search", "retry", "--all", "--role", "tool",
                              "--json").stdout)
    assert [(h["session_id"], h["entry"], h["role"]) for h in tool["hits"]] == [(b, 1, "tool")]
    assert tool["indexed"] == {"sessions": 2, "entries": 8, "pending": 0}
    recent = json.loads(qwenctl(daemon, "sessions", "search", "retry", "--all", "--since", "1d",
                                "--json").stdout)
    assert recent["hits"] == []  # the planted sessions are from 2026-01
    old = json.loads(qwenctl(daemon, "sessions", "search", "retry", "--all", "--since",
                             "2025-12-01", "--json").stdout)
    assert {h["session_id"] for h in old["hits"]} == {a, b}
    none = qwenctl(daemon, "sessions", "search", "zebra", "--all")
    assert none.returncode == 0 and "0 hit(s) for 'zebra'" in none.stdout
    bad = qwenctl(daemon, "sessions", "search", "x", "--since", "someday")
    assert bad.returncode != 0 and "since" in bad.stderr
    shown = qwenctl(daemon, "sessions", "show", a[:8], "--messages", "--around", "1")
    assert shown.returncode == 0, shown.stderr
    assert "around entry 1" in shown.stdout
    assert "▶ [2] assistant" in shown.stdout and "retry budget of seven" in shown.stdout
    assert "[1] user" in shown.stdout and "[4] assistant" in shown.stdout
    assert "[5] user" not in shown.stdout  # two entries either side of the hit


@pytest.mark.asyncio
async def test_mcp_search_sessions(daemon: SpawnedDaemon) -> None:
    here, _there, a, b = two_projects(daemon)
    async with mcp_session(daemon, "--cwd", str(here)) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools["search_sessions"].input_schema["properties"]) == {
            "query", "limit", "all_projects"}
        text = await ok(s, "search_sessions", {"query": "retry budget"})
        assert f"session {a}" in text and f"session {b}" not in text
        assert "entry 1, assistant" in text and "retry budget of seven" in text
        both = await ok(s, "search_sessions", {"query": "retry budget", "all_projects": True,
                                               "limit": 5})
        assert f"session {a}" in both and f"session {b}" in both
        assert "No past session mentions" in await ok(s, "search_sessions", {"query": "zebra"})
        blank = await s.call_tool("search_sessions", {"query": "  "})
        assert blank.is_error and "query" in "".join(
            c.text for c in blank.content if hasattr(c, "text"))
