"""A session's turn state (``sessions.state.TurnState``) as a client sees it, through the socket
of a spawned daemon with a scripted model: when a user turn is open (background work follows
only a finished user turn), when "the main agent wrote memory" is forgotten, that the tool
results seen accumulate across turns for the skill review, and which calls count as the
daemon's own answers — each with the reset rules of the turn loop (a user turn begins, a reply
finishes it, a rewind takes it back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test"}


@pytest.fixture
def stub():  # type: ignore[no-untyped-def]
    with ScriptedOpenAI() as s:
        s.handler = lambda body: Reply(content="nothing to do")
        yield s


class Agent:
    """One session driven as a coding agent would."""

    def __init__(self, d: SpawnedDaemon, cwd: Path) -> None:
        self.d = d
        self.sid = d.call("session.open", {"cwd": str(cwd), "model": "stub-model"})["session_id"]
        self.n = 0

    def turn(self, kind: str = "user", text: str = "go on", **kw: Any) -> dict[str, Any]:
        return self.d.call("session.turn", {"session_id": self.sid, "kind": kind, "text": text,
                                            **kw})

    def results(self, calls: list[dict[str, Any]]) -> dict[str, Any]:
        return self.d.call("session.turn", {"session_id": self.sid, "kind": "tool_results",
                                            "tool_results": [
                                                {"tool_call_id": c["id"], "content": "ok",
                                                 "name": c["function"]["name"]} for c in calls]})

    def reply(self, *calls: dict[str, Any]) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "" if calls else "done"}
        if calls:
            msg["tool_calls"] = list(calls)
        return self.d.call("session.record_model", {"session_id": self.sid, "message": msg})

    def call(self, name: str, **args: Any) -> dict[str, Any]:
        self.n += 1
        return {"id": f"t{self.n}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}

    def drain(self) -> None:
        assert self.d.call("daemon.drain", {"timeout_s": 20})["drained"]

    def extract_reason(self) -> str | None:
        return self.d.call("memory.extract", {"session_id": self.sid})["reason"]


def repo_in(d: SpawnedDaemon, name: str = "repo") -> Path:
    repo = d.home / name
    (repo / ".git").mkdir(parents=True)
    return repo


def test_background_work_follows_only_an_open_user_turn(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    a = Agent(d, repo_in(d))
    # a reply with tool calls does not finish the user turn; the reply after the results does
    a.turn(text="read the makefile")
    read = a.call("read_file", file_path="/repo/Makefile")
    assert a.reply(read) == {"turn_complete": False, "scheduled": [], "answered": []}
    a.results([read])
    done = a.reply()
    assert done["turn_complete"] is True and "extract" in done["scheduled"]
    a.drain()
    # a cron turn opens no user turn: its complete reply schedules nothing
    a.turn(kind="cron", text="nightly check")
    assert a.reply()["scheduled"] == []
    # a cron turn inside an open user turn leaves it open: that reply finishes the user turn
    a.turn(text="and the tests?")
    a.reply(a.call("read_file", file_path="/repo/tests.py"))
    a.turn(kind="cron", text="nightly check")
    assert "extract" in a.reply()["scheduled"]
    a.drain()
    # a rewind takes the open user turn back: the next cron turn's reply schedules nothing
    a.turn(text="one more thing")
    a.reply(a.call("read_file", file_path="/repo/x.py"))
    assert d.call("session.rewind", {"session_id": a.sid, "turns": 1})["removed_messages"] == 2
    a.turn(kind="cron", text="nightly check")
    assert a.reply()["scheduled"] == []
    # a finished turn stays finished: a second reply is refused
    with pytest.raises(RemoteError) as exc:
        a.reply()
    assert exc.value.code == -32602


def test_memory_written_lasts_until_the_next_user_turn(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub)).start()
    repo = repo_in(d)
    a = Agent(d, repo)
    project = Path(d.call("memory.status", {"cwd": str(repo)})["roots"]["project"])
    a.turn(text="remember that we use tabs")
    save = a.call("write_file", file_path=str(project / "user" / "tabs.md"), content="tabs")
    a.reply(save)
    a.results([save])
    assert a.reply()["scheduled"] == []  # the main agent saved it: no extraction
    assert a.extract_reason() == "memory_tool"
    # tool results and cron turns keep the flag; only a new user turn clears it
    a.turn(kind="cron", text="nightly check")
    assert a.reply()["scheduled"] == []
    assert a.extract_reason() == "memory_tool"
    a.drain()
    a.turn(text="now something else")  # the flag goes with the new user turn
    assert "extract" in a.reply()["scheduled"]


def test_tool_results_seen_add_up_across_turns_for_the_skill_review(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(stub))
    settings = d.home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"memory": {"enableAutoSkill": True,
                                               "autoSkillToolCalls": 3}}))
    d.start()
    a = Agent(d, repo_in(d))
    for i in range(2):  # one tool call per turn: the count is not reset by a new turn
        a.turn(text=f"step {i}")
        c = a.call("run_shell_command", command=f"make step{i}")
        a.reply(c)
        a.results([c])
        assert "skill-review" not in a.reply()["scheduled"]
        a.drain()
    # a rewind does not take the results back out of the count either
    a.turn(text="step 2")
    c = a.call("run_shell_command", command="make step2")
    a.reply(c)
    a.results([c])
    d.call("session.rewind", {"session_id": a.sid, "turns": 1})
    a.turn(text="step 2 again")
    assert "skill-review" in a.reply()["scheduled"]


def test_the_daemons_own_answers_until_a_rewind(daemon: SpawnedDaemon) -> None:
    a = Agent(daemon, daemon.home)
    a.turn(text="use a skill")
    skill = a.call("skill", skill="none-such")
    assert [x["tool_call_id"] for x in a.reply(skill)["answered"]] == [skill["id"]]
    a.reply()
    a.turn(text="next question")
    # a later turn still knows the call was the daemon's: the client's copy is dropped
    late = a.results([skill])
    assert late["events"] == [{"type": "duplicate_tool_result", "tool_call_id": skill["id"],
                               "index": 0}]
    assert not any(m.get("tool_call_id") == skill["id"] and m["content"] == "ok"
                   for m in late["messages"])
    # a rewind forgets them: the same result now answers no pending call
    daemon.call("session.rewind", {"session_id": a.sid, "turns": 2})
    with pytest.raises(RemoteError) as exc:
        a.results([skill])
    assert exc.value.code == -32602 and exc.value.data["field"] == "tool_results[0].tool_call_id"
