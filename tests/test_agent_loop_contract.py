"""The agent-loop contract (protocol C1–C5) under random agent loops, through the socket.

A seeded hypothesis property drives random loops against a real daemon and the strict scripted
model: several tool-naming schemes, random result sizes, small windows (compaction fires
often), manual compressions, failed model calls (the user types again, or the turn is rewound),
the daemon's own ``skill`` tool, and restarts with resume. Every returned prompt is POSTed to
the strict stub (a valid chat body) and checked with :mod:`qwenctxd.testing.contract`; every
record_model and tool_results call must be accepted.
"""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from qwenctxd.client import RemoteError
from qwenctxd.testing.contract import contract_problems
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SUMMARY = ("<state_snapshot>\n<primary_request_and_intent>keep going with the task"
           "</primary_request_and_intent>\n<next_step>continue</next_step>\n</state_snapshot>")


def _tool(name: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in props.items()}}}}


# scheme → (tools, {role: (tool name, path or command key)})
SCHEMES: dict[str, tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]] = {
    "qwen": ([_tool("read_file", file_path="string"), _tool("run_shell_command", command="string"),
              _tool("edit", file_path="string", old_string="string", new_string="string")],
             {"read": ("read_file", "file_path"), "shell": ("run_shell_command", "command")}),
    "claude": ([_tool("Read", file_path="string"), _tool("Bash", command="string"),
                _tool("str_replace_editor", command="string", path="string", old_str="string",
                      new_str="string")],
               {"read": ("Read", "file_path"), "shell": ("Bash", "command")}),
    "odd": ([_tool("fs.open", filename="string"), _tool("doIt", cmd="string"),
             _tool("Z", target="string", data="string")],
            {"read": ("fs.open", "filename"), "shell": ("doIt", "cmd")}),
}
AGENTS = [None, {"name": "RefAgent", "version": "1.0"}, {"name": "Helix"}]


class Model:
    """The scripted main model: the test decides each reply; compression gets a summary."""

    def __init__(self) -> None:
        self.next: Reply | None = None

    def __call__(self, body: dict[str, Any]) -> Reply:
        system = next((m for m in body["messages"] if m["role"] == "system"), {})
        if "state_snapshot" in str(system.get("content")):
            return Reply(content=SUMMARY)
        if body.get("model") != "main-model":  # the daemon's own side queries (extraction…)
            return Reply(content="nothing to do")
        reply = self.next or Reply(content="ok")
        self.next = None
        return reply


def post(stub: ScriptedOpenAI, prompt: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "main-model", "messages": [
        {"role": "system", "content": prompt["system"]}, *prompt["messages"]]}
    if prompt["tools"]:
        body["tools"] = prompt["tools"]
    req = urllib.request.Request(f"{stub.base_url}/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback stub
        return json.loads(resp.read())["choices"][0]["message"]


class Loop:
    """One random agent session and what it has checked."""

    def __init__(self, d: SpawnedDaemon, stub: ScriptedOpenAI, model: Model, repo: Path,
                 rnd: random.Random) -> None:
        self.d, self.stub, self.model, self.repo, self.rnd = d, stub, model, repo, rnd
        self.scheme = rnd.choice(list(SCHEMES))
        self.tools, self.roles = SCHEMES[self.scheme]
        self.agent = rnd.choice(AGENTS)
        self.keep = rnd.choice(["none", "current_turn", "all"])
        self.window = rnd.choice([9_000, 12_000, 16_000])
        params: dict[str, Any] = {"cwd": str(repo), "model": "stub-model", "tools": self.tools,
                                  "window_tokens": self.window, "keep_reasoning": self.keep}
        if self.agent:
            params["agent"] = self.agent
        self.sid = d.call("session.open", params)["session_id"]
        self.pending: list[str] = []  # the client's calls awaiting results
        self.prompts = 0
        self.compactions = 0
        self.call_no = 0

    def check(self, prompt: dict[str, Any], *, kind: str, text: str | None = None,
              ids: list[str] | None = None) -> None:
        name = self.agent["name"] if self.agent else None
        problems = contract_problems(prompt, kind=kind, text=text, tool_call_ids=ids or [],
                                     keep_reasoning=self.keep, agent_name=name)
        assert problems == [], (problems, [m["role"] for m in prompt["messages"]],
                                prompt["events"])
        self.prompts += 1
        self.compactions += sum(1 for e in prompt["events"] if e["type"] == "compressed")

    def reply(self, prompt: dict[str, Any], *, fail: bool = False) -> None:
        """The model answers ``prompt`` (or the call fails: nothing is recorded)."""
        r = self.rnd.random()
        reasoning = {"reasoning_content": "thinking…"} if self.rnd.random() < 0.5 else {}
        calls: list[dict[str, Any]] = []
        if r < 0.55:
            for _ in range(self.rnd.randint(1, 3)):
                self.call_no += 1
                role = self.rnd.choice(["read", "shell", "skill"])
                if role == "skill":
                    name, args = "skill", {"skill": "deploy"}
                else:
                    name, key = self.roles[role]
                    args = {key: "README.md" if role == "read" else "ls"}
                calls.append({"id": f"c{self.call_no}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args)}})
            self.model.next = Reply(tool_calls=calls)
        else:
            self.model.next = Reply(content=f"answer {self.prompts}")
        msg = post(self.stub, prompt)  # the strict stub refuses an invalid body
        if fail:
            return
        msg = {k: v for k, v in msg.items() if v is not None} | reasoning  # a reasoning model
        res = self.d.call("session.record_model", {"session_id": self.sid, "message": msg})
        answered = {a["tool_call_id"] for a in res["answered"]}
        assert answered == {c["id"] for c in calls if c["function"]["name"] == "skill"}
        assert all("deploy skill body" in a["content"] for a in res["answered"])
        self.pending = [c["id"] for c in calls if c["id"] not in answered]
        self.daemon_only = bool(calls) and not self.pending

    def user_turn(self, text: str) -> dict[str, Any]:
        p = self.d.call("session.turn", {"session_id": self.sid, "kind": "user", "text": text})
        self.check(p, kind="user", text=text)
        self.pending = []
        self.daemon_only = False
        return p

    def results(self) -> dict[str, Any]:
        size = self.rnd.choice([10, 400, 4_000, 20_000])
        results = [{"tool_call_id": c, "content": f"result {c} " + "y" * size}
                   for c in self.pending]
        p = self.d.call("session.turn", {"session_id": self.sid, "kind": "tool_results",
                                         "tool_results": results,
                                         "touched_paths": ["README.md"]})
        self.check(p, kind="tool_results", ids=list(self.pending))
        self.pending = []
        return p


def step(loop: Loop, prompt: dict[str, Any] | None, action: str) -> dict[str, Any] | None:
    """One action; returns the prompt now awaiting a model reply (None: the turn is over)."""
    d, sid = loop.d, loop.sid
    if prompt is None or action == "user":
        return loop.user_turn(f"task {loop.rnd.randint(0, 10**6)} " + "z" * loop.rnd.choice(
            [5, 200, 3_000]))
    if action == "compress":
        r = d.call("session.compress", {"session_id": sid, "mode": "full"})
        assert r["status"] in ("compressed", "noop", "failed_inflated"), r
        return prompt  # the prompt's input is still current: the next reply must record
    if action == "rewind":
        try:
            r = d.call("session.rewind", {"session_id": sid, "turns": 1})
        except RemoteError as e:
            assert e.code == -32602  # no user turn left to take back
            return None
        assert r["removed_messages"] >= 1
        loop.pending = []
        return None
    if action == "fail":  # the model call fails; the user simply types again (merged)
        loop.reply(prompt, fail=True)
        unanswered_user = prompt["messages"][-1]["role"] == "user"
        p = loop.user_turn("again please")
        assert any(e["type"] == "user_turn_merged" for e in p["events"]) == unanswered_user
        return p
    loop.reply(prompt)
    if loop.pending:
        return loop.results()
    if loop.daemon_only:  # every call was the daemon's: an empty tool_results continues
        p = d.call("session.turn", {"session_id": sid, "kind": "tool_results",
                                    "tool_results": []})
        loop.check(p, kind="tool_results")
        return p
    return None


def restart(d: SpawnedDaemon, spawn: Any, env: dict[str, str], loop: Loop) -> SpawnedDaemon:
    d.kill9()
    again = spawn(root=d.root, env=env)
    again.log_path = d.root / f"again-{loop.sid[:8]}.log"
    again.start()
    r = again.call("session.open", {"cwd": str(loop.repo), "model": "stub-model",
                                    "session_id": loop.sid, "resume": True})
    assert r["resumed"] is True and r["window_tokens"] == loop.window  # restored, not default
    loop.d = again
    return again


def test_random_agent_loops_keep_the_contract(spawn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = Model()
    with ScriptedOpenAI(handler=model, strict_chat=True) as stub:
        env = {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
               "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}
        box = {"d": spawn(env=env).start()}
        repo = box["d"].home / "repo"
        (repo / ".git").mkdir(parents=True)
        (repo / "README.md").write_text("# demo\n")
        skill = repo / ".qwen" / "skills" / "deploy"
        skill.mkdir(parents=True)
        (skill / "SKILL.md").write_text(
            "---\nname: deploy\ndescription: Deploy the app\n---\nThe deploy skill body.\n")
        totals = {"prompts": 0, "compactions": 0, "restarts": 0, "loops": 0}

        @seed(1111)
        @settings(max_examples=20, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(actions=st.lists(st.sampled_from(
            ["reply"] * 6 + ["user", "compress", "rewind", "fail", "restart"]),
            min_size=10, max_size=40), rnd_seed=st.integers(0, 2**32 - 1))
        def run(actions: list[str], rnd_seed: int) -> None:
            loop = Loop(box["d"], stub, model, repo, random.Random(rnd_seed))
            prompt: dict[str, Any] | None = None
            restarts = 0
            for action in actions:
                if action == "restart":
                    if restarts or totals["restarts"] >= 4:
                        continue
                    restarts += 1
                    totals["restarts"] += 1
                    box["d"] = restart(box["d"], spawn, env, loop)
                    if loop.pending:  # the client still owes the results: send them now
                        prompt = loop.results()
                    continue
                if action in ("compress", "rewind") and loop.pending:
                    if action == "compress":  # a manual compression keeps the pending call
                        step(loop, prompt, "compress")
                    prompt = loop.results()
                    continue
                prompt = step(loop, prompt, action)
            totals["prompts"] += loop.prompts
            totals["compactions"] += loop.compactions
            totals["loops"] += 1

        run()
        print("contract property totals:", totals)
        assert totals["prompts"] >= 250, totals
        assert totals["compactions"] >= 5, totals
        assert totals["restarts"] >= 1, totals


def test_rewind_past_the_history_is_refused_and_resume_honours_it(spawn) -> None:  # type: ignore[no-untyped-def]
    model = Model()
    with ScriptedOpenAI(handler=model, strict_chat=True) as stub:
        env = {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
               "OPENAI_API_KEY": "test"}
        d = spawn(env=env).start()
        sid = d.call("session.open", {"cwd": str(d.home), "model": "m",
                                      "window_tokens": 50_000})["session_id"]
        for text in ("first", "second", "third"):
            p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
            d.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": f"re {text}"}})
        with pytest.raises(RemoteError) as err:
            d.call("session.rewind", {"session_id": sid, "turns": 4})
        assert err.value.code == -32602 and err.value.data["field"] == "turns"
        r = d.call("session.rewind", {"session_id": sid, "turns": 2})
        assert r == {"removed_messages": 4, "messages": 2}
        p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "fourth"})
        words = [m["content"] if isinstance(m["content"], str) else m["content"][-1]["text"]
                 for m in p["messages"]]  # (the first turn also carries the skill listing)
        assert words == ["first", "re first", "fourth"]
        d.kill9()
        again = spawn(root=d.root, env=env).start()
        r = again.call("session.open", {"cwd": str(d.home), "model": "m", "session_id": sid,
                                        "resume": True})
        assert r["messages"] == 3 and r["window_tokens"] == 50_000
