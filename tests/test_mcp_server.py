"""``qwenctl mcp`` driven by the official MCP SDK's own stdio client, against a spawned daemon.

Every tool, resource and prompt; bad arguments; a secret in a team write; the project taken
from the client's roots; a daemon killed underneath (the next call autostarts a new one).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import msgspec
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mt

from qwenctxd.testing.spawn import SpawnedDaemon

SECRET = "token ghp_" + "a1B2c3D4e5" * 3 + "a1B2c3"
TOOLS = {"recall_memory", "save_memory", "forget_memory", "list_skills", "load_skill",
         "project_instructions", "search_sessions"}


def make_project(home: Path) -> Path:
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "QWEN.md").write_text("Always run `make lint` before committing.\n")
    rules = repo / ".qwen" / "rules"
    rules.mkdir(parents=True)
    (rules / "style.md").write_text("Prefer small pure functions.\n")
    skill = repo / ".qwen" / "skills" / "deploy-notes"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: deploy-notes\ndescription: How we deploy the "
                                    "service\n---\nDeploy with `make ship` from main only.\n")
    return repo


@pytest.fixture
def team_daemon(spawn: type[SpawnedDaemon]) -> SpawnedDaemon:
    d = spawn()
    settings = d.home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{"memory": {"enableTeamMemory": true}}')
    return d.start()


def server_params(d: SpawnedDaemon, *args: str, cwd: Path | None = None) -> StdioServerParameters:
    env = {**d.env, "QWENCTXD_SOCKET": str(d.socket)}
    return StdioServerParameters(command=sys.executable, args=["-m", "qwenctl", "mcp", *args],
                                 env=env, cwd=str(cwd) if cwd else str(d.root))


@asynccontextmanager
async def mcp_session(d: SpawnedDaemon, *args: str, roots: list[Path] | None = None,
                      cwd: Path | None = None) -> AsyncIterator[ClientSession]:
    async def list_roots(context: Any) -> mt.ListRootsResult:
        return mt.ListRootsResult(roots=[mt.Root(uri=r.as_uri(), name=r.name)
                                         for r in roots or []])

    with errlog_for(d) as errlog:
        async with stdio_client(server_params(d, *args, cwd=cwd), errlog=errlog) as (r, w):
            kw = {"list_roots_callback": list_roots} if roots is not None else {}
            async with ClientSession(r, w, **kw) as session:
                await session.initialize()
                yield session


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def exists(path: Path | str) -> bool:
    return os.path.exists(path)


def errlog_for(d: SpawnedDaemon) -> TextIO:
    return open(d.root / "mcp-stderr.log", "a")  # noqa: SIM115 - closed by the caller


def text_of(result: mt.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mt.TextContent))


async def ok(session: ClientSession, tool: str, args: dict[str, Any]) -> str:
    result = await session.call_tool(tool, args)
    assert not result.is_error, text_of(result)
    return text_of(result)


@pytest.mark.asyncio
async def test_every_tool_resource_and_prompt(team_daemon: SpawnedDaemon) -> None:
    d = team_daemon
    repo = make_project(d.home)
    sub = d.client(timeout=10)
    sub.call("daemon.subscribe", {"topics": ["memory/changed"]})
    async with mcp_session(d, "--cwd", str(repo)) as s:
        assert {t.name for t in (await s.list_tools()).tools} == TOOLS

        # save (project scope by default) → a real topic file, the index, the audit log
        path = Path(await ok(s, "save_memory", {
            "type": "feedback", "name": "Tabs over spaces",
            "description": "the user wants tabs in Go files",
            "body": "Indent Go code with tabs, never spaces."}))
        assert exists(path) and path.parent.name == "feedback"
        text = read(path)
        assert text.startswith("---\n") and "type: feedback" in text and "never spaces" in text
        assert "Tabs over spaces" in read(path.parent.parent / "MEMORY.md")
        audit = [json.loads(x) for x in read(
            d.home / ".local/state/qwenctxd/audit.jsonl").splitlines()]
        assert audit[-1]["path"] == str(path) and audit[-1]["action"] == "create"
        note = msgspec.json.decode(sub.read_frame())
        assert note["method"] == "memory/changed" and note["params"]["saved"] == str(path)

        user_path = Path(await ok(s, "save_memory", {
            "type": "user", "name": "Role", "description": "who the user is",
            "body": "The user is a site reliability engineer.", "scope": "user"}))
        assert user_path.is_relative_to(d.home) and "memories" in user_path.parts

        # recall: the rendered relevant-memory text
        recalled = await ok(s, "recall_memory", {"query": "how should I indent Go code"})
        assert "Indent Go code with tabs" in recalled
        assert "No saved memory" in await ok(s, "recall_memory", {"query": "kubernetes"})

        # resources: instructions + one per memory document
        listed = {str(r.uri): r for r in (await s.list_resources()).resources}
        mem_uri = f"qwenctx://memory/project/feedback/{path.name}"
        assert {"qwenctx://instructions", mem_uri,
                f"qwenctx://memory/user/user/{user_path.name}"} <= set(listed)
        assert listed[mem_uri].name == "Tabs over spaces"
        body = (await s.read_resource(mem_uri)).contents[0]
        assert isinstance(body, mt.TextResourceContents) and "never spaces" in body.text
        inst = (await s.read_resource("qwenctx://instructions")).contents[0]
        assert isinstance(inst, mt.TextResourceContents) and "make lint" in inst.text
        with pytest.raises(Exception, match="no such memory"):
            await s.read_resource("qwenctx://memory/project/feedback/nope.md")

        # instructions: QWEN.md, rules, memory index, and the file list
        instructions = await ok(s, "project_instructions", {})
        assert "make lint" in instructions and "Prefer small pure functions" in instructions
        assert "Tabs over spaces" in instructions  # the memory index
        assert str(repo / "QWEN.md") in instructions.split("Files:")[1]
        assert str(repo / ".qwen/rules/style.md") in instructions.split("Files:")[1]

        # skills as tools and as prompts
        skills = await ok(s, "list_skills", {})
        assert "deploy-notes [project]: How we deploy the service" in skills
        loaded = await ok(s, "load_skill", {"name": "deploy-notes"})
        assert loaded.startswith("Base directory for this skill: " + str(repo / ".qwen/skills"))
        assert "make ship" in loaded
        prompts = {p.name: p for p in (await s.list_prompts()).prompts}
        assert prompts["deploy-notes"].description == "How we deploy the service"
        got = await s.get_prompt("deploy-notes")
        assert isinstance(got.messages[0].content, mt.TextContent)
        assert "make ship" in got.messages[0].content.text
        unknown = await s.call_tool("load_skill", {"name": "no-such-skill"})
        assert unknown.is_error and "-32602" in text_of(unknown)

        # forget in two steps
        cands = await ok(s, "forget_memory", {"query": "tabs"})
        assert str(path) in cands and str(user_path) not in cands
        removed = await ok(s, "forget_memory", {"query": "tabs", "paths": [str(path)]})
        assert str(path) in removed and not exists(path)
        assert "Tabs over spaces" not in read(path.parent.parent / "MEMORY.md")
        assert "No saved memory" in await ok(s, "recall_memory", {"query": "indent Go tabs"})
        outside = await s.call_tool("forget_memory", {"query": "x", "paths": ["/etc/passwd"]})
        assert outside.is_error and "-32003" in text_of(outside)
    sub.close()


@pytest.mark.asyncio
async def test_bad_arguments_get_the_sdk_validation_error(daemon: SpawnedDaemon) -> None:
    repo = make_project(daemon.home)
    async with mcp_session(daemon, "--cwd", str(repo)) as s:
        bad_type = await s.call_tool("save_memory", {"type": "diary", "name": "n",
                                                     "description": "d", "body": "b"})
        assert bad_type.is_error and "type" in text_of(bad_type)
        assert "validation error" in text_of(bad_type).lower()
        missing = await s.call_tool("recall_memory", {})
        assert missing.is_error and "query" in text_of(missing)
        wrong = await s.call_tool("forget_memory", {"query": "x", "paths": "not-a-list"})
        assert wrong.is_error and "paths" in text_of(wrong)
        empty = await s.call_tool("save_memory", {"type": "user", "name": "  ",
                                                  "description": "d", "body": "b"})
        assert empty.is_error and "name" in text_of(empty)  # the daemon's -32602
        # nothing was written, and the server still answers
        assert daemon.call("memory.list", {"cwd": str(repo)})["docs"] == []
        assert "No saved memory" in await ok(s, "recall_memory", {"query": "anything"})


@pytest.mark.asyncio
async def test_a_secret_in_a_team_write_is_refused_by_rule_id(team_daemon: SpawnedDaemon
                                                              ) -> None:
    d = team_daemon
    repo = make_project(d.home)
    async with mcp_session(d, "--cwd", str(repo)) as s:
        refused = await s.call_tool("save_memory", {
            "type": "reference", "name": "CI token", "description": "the CI token",
            "body": f"CI uses {SECRET}", "scope": "team"})
        assert refused.is_error
        assert "-32004" in text_of(refused) and "github-pat" in text_of(refused)
        assert "ghp_" not in text_of(refused)
        team = repo / ".qwen" / "team-memory"
        assert not exists(team / "reference" / "ci-token.md")
        saved = Path(await ok(s, "save_memory", {
            "type": "reference", "name": "CI dashboard", "description": "where CI runs",
            "body": "CI runs on the shared Buildkite at ci.example.test.", "scope": "team"}))
        assert saved.parent == team / "reference" and exists(saved)
        assert "CI dashboard" in read(team / "MEMORY.md")


@pytest.mark.asyncio
async def test_project_is_the_clients_first_root(daemon: SpawnedDaemon) -> None:
    repo = make_project(daemon.home)
    other = daemon.home / "elsewhere"
    other.mkdir()
    async with mcp_session(daemon, roots=[repo], cwd=other) as s:
        assert "deploy-notes" in await ok(s, "list_skills", {})
        path = Path(await ok(s, "save_memory", {"type": "project", "name": "Release day",
                                                "description": "when we release",
                                                "body": "We release on Thursdays."}))
    in_repo = daemon.call("memory.list", {"cwd": str(repo)})["docs"]
    assert [doc["path"] for doc in in_repo] == [str(path)]
    async with mcp_session(daemon, cwd=other) as s:  # no roots: the process cwd
        assert "deploy-notes" not in await ok(s, "list_skills", {})


@pytest.mark.asyncio
async def test_survives_the_daemon_restarting_underneath(daemon: SpawnedDaemon) -> None:
    repo = make_project(daemon.home)
    async with mcp_session(daemon, "--cwd", str(repo)) as s:
        await ok(s, "save_memory", {"type": "project", "name": "Staging",
                                    "description": "staging cluster",
                                    "body": "Load tests go to the staging cluster."})
        old_pid = daemon.call("daemon.status")["pid"]
        daemon.kill9()
        # the next call reconnects, auto-starting a daemon on the same socket and store
        assert "staging cluster" in await ok(s, "recall_memory", {"query": "load tests staging"})
        new_pid = daemon.call("daemon.status")["pid"]
        assert new_pid != old_pid and exists(f"/proc/{new_pid}")
        assert "deploy-notes" in await ok(s, "list_skills", {})
