"""session.context and ``qwenctl context`` against a spawned daemon and the scripted model: a
session with instructions, a recalled memory, a skill listing, a rule reminder and tool
traffic; the parts add up to the assembled prompt's count, estimated and API-anchored."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

PARTS = ["system_base", "instructions", "memory", "system_other", "tools", "skills",
         "reminders", "history_user", "history_assistant", "history_tool_results"]
LETTERS = set("SIMOTKNUAR.")
WINDOW = 128_000
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                             "parameters": {"type": "object", "properties": {
                                                 "file_path": {"type": "string"}}}}}]
MEMORY_PATH: list[str] = []  # the seeded memory the recall selector picks


def handler(body: dict[str, Any]) -> Reply:
    text = json.dumps(body.get("messages", []))
    if "Available memories" in text:  # the recall selector side query
        return Reply(content=json.dumps({"selected_memories": MEMORY_PATH}))
    last = body["messages"][-1]
    if last["role"] == "user":
        return Reply(tool_calls=[{"id": f"call_{len(body['messages'])}", "function": {
            "name": "read_file", "arguments": json.dumps({"file_path": "src/app.ts"})}}])
    return Reply(content="The release freeze starts Thursday at noon.")


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}


def post(stub: ScriptedOpenAI, prompt: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "stub-model",
            "messages": [{"role": "system", "content": prompt["system"]}, *prompt["messages"]],
            "tools": prompt["tools"]}
    req = urllib.request.Request(f"{stub.base_url}/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback stub
        reply = json.loads(resp.read())
    return {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}


#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL)


def context(d: SpawnedDaemon, sid: str) -> dict[str, Any]:
    return d.call("session.context", {"session_id": sid})


def parts_of(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["tokens"] for p in c["parts"]}


def check_shape(c: dict[str, Any]) -> None:
    assert [p["name"] for p in c["parts"]] == PARTS
    assert all(p["tokens"] >= 0 for p in c["parts"])
    assert sum(parts_of(c).values()) == c["prompt_tokens"]
    for p in c["parts"]:
        assert p["pct"] == pytest.approx(100 * p["tokens"] / c["window_tokens"], abs=0.01)
    assert c["free_tokens"] == max(0, c["window_tokens"] - c["prompt_tokens"])
    assert c["thresholds"] == {"warn": 76_800, "auto": 95_000, "hard": 105_000}
    assert c["level"] == "ok"


def within_1pct(a: int, b: int) -> bool:
    return abs(a - b) <= 0.01 * max(a, b)


def build(spawn) -> tuple[SpawnedDaemon, ScriptedOpenAI, str]:  # type: ignore[no-untyped-def]
    stub = ScriptedOpenAI(handler=handler, strict_chat=True)
    stub.__enter__()
    d: SpawnedDaemon = spawn(env=model_env(stub))
    d.stub = stub  # type: ignore[attr-defined]
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".qwen").mkdir()
    # the memory recall must land by the second turn even on a busy machine
    (repo / ".qwen" / "settings.json").write_text('{"memory": {"prefetchGraceMs": 2000}}')
    d.start()
    (repo / "QWEN.md").write_text("# Project\nAlways run the linters before a commit.\n" * 10)
    rules = repo / ".qwen" / "rules"
    rules.mkdir()
    (rules / "ts.md").write_text('---\npaths: ["src/**/*.ts"]\n---\nPrefer strict TypeScript.\n')
    sk = repo / ".qwen" / "skills" / "deploy"
    sk.mkdir(parents=True)
    (sk / "SKILL.md").write_text("---\nname: deploy\ndescription: Deploy the service to "
                                 "staging and production\n---\nRun make deploy.\n")
    st = d.call("memory.status", {"cwd": str(repo)})
    mem = Path(st["roots"]["project"]) / "project" / "release.md"
    mem.write_text("---\nname: Release freeze\ndescription: release freeze starts every "
                   "Thursday at noon\ntype: project\n---\nNo merges to main after Thursday "
                   "noon.\n")
    MEMORY_PATH[:] = [str(mem)]
    until(lambda: d.call("memory.list", {"cwd": str(repo)})["docs"],
          what="the memory file to be indexed")
    d.call("memory.recall", {"cwd": str(repo), "query": "warm up"})  # the openai import
    sid = d.call("session.open", {"cwd": str(repo), "model": "stub-model", "tools": TOOLS,
                                  "window_tokens": WINDOW})["session_id"]
    return d, stub, sid


@pytest.fixture
def session(spawn):  # type: ignore[no-untyped-def]
    d, stub, sid = build(spawn)
    yield d, stub, sid
    stub.__exit__(None, None, None)


def test_parts_add_up_estimated_and_anchored(session) -> None:  # type: ignore[no-untyped-def]
    d, stub, sid = session
    # a fresh session: only the system prompt and tools
    c0 = context(d, sid)
    check_shape(c0)
    assert c0["anchored"] is False and parts_of(c0)["history_user"] == 0

    p1 = d.call("session.turn", {"session_id": sid, "kind": "user",
                                 "text": "is there a release freeze this week?"})
    c1 = context(d, sid)
    check_shape(c1)
    assert c1["prompt_tokens"] == p1["usage"]["prompt_tokens"] and c1["anchored"] is False
    call = post(stub, p1)
    d.call("session.record_model", {"session_id": sid, "message": call})  # no usage
    p2 = d.call("session.turn", {
        "session_id": sid, "kind": "tool_results", "touched_paths": ["src/app.ts"],
        "tool_results": [{"tool_call_id": c["id"], "name": "read_file",
                          "content": "export const x: number = 1;\n" * 40}
                         for c in call["tool_calls"]]})
    c2 = context(d, sid)
    check_shape(c2)
    assert c2["prompt_tokens"] == p2["usage"]["prompt_tokens"] and c2["anchored"] is False
    kinds = {r["kind"] for r in p1["reminders"] + p2["reminders"]}
    assert {"skills", "memory", "rule"} <= kinds
    parts = parts_of(c2)
    for name in PARTS:
        if name != "system_other":  # append text: none; git status: a repo without commits
            assert parts[name] > 0, name
    # the skill listing mentions the project skill; memory + rule make up the reminders
    listing = next(r["text"] for r in p1["reminders"] if r["kind"] == "skills")
    assert parts["skills"] >= len(listing) // 4
    other = [r["text"] for r in p1["reminders"] + p2["reminders"] if r["kind"] != "skills"]
    assert parts["reminders"] >= sum(len(t) for t in other) // 4

    # the reply with API usage anchors the count, well above our estimate
    answer = post(stub, p2)
    api = int(p2["usage"]["prompt_tokens"] * 1.3)
    d.call("session.record_model", {"session_id": sid, "message": answer,
                                    "usage": {"prompt_tokens": api, "completion_tokens": 17}})
    c3 = context(d, sid)
    check_shape(c3)
    assert c3["anchored"] is True and c3["prompt_tokens"] == api + 17
    system = sum(parts_of(c3)[n] for n in PARTS[:5])
    assert system == sum(parts_of(c2)[n] for n in PARTS[:5])  # system and tools unscaled
    # the history parts grew by the scale factor (roughly, every one of them)
    for name in ("history_tool_results", "reminders", "skills"):
        assert parts_of(c3)[name] > parts_of(c2)[name]
    p3 = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "thanks"})
    assert p3["usage"]["anchored"] is True
    assert within_1pct(sum(parts_of(c3).values()), p3["usage"]["prompt_tokens"])
    c4 = context(d, sid)
    check_shape(c4)
    assert c4["prompt_tokens"] == p3["usage"]["prompt_tokens"] and c4["anchored"] is True

    with pytest.raises(RemoteError) as exc:
        d.call("session.context", {"session_id": "no-such-session"})
    assert exc.value.code == -32001


def _bar_lines(out: str) -> tuple[str, str, str, str]:
    lines = out.splitlines()
    return lines[1], lines[2], lines[3], lines[4]


def test_qwenctl_context_piped_and_json(session) -> None:  # type: ignore[no-untyped-def]
    d, stub, sid = session
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "release freeze?"})
    call = post(stub, p)
    d.call("session.record_model", {"session_id": sid, "message": call})
    d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": c["id"], "name": "read_file", "content": "y = 2\n" * 200}
        for c in call["tool_calls"]]})
    expected = context(d, sid)

    r = qwenctl(d, "context", sid[:6])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"context of session {sid[:8]}: ")
    bar, marks, legend, thresholds = _bar_lines(r.stdout)
    assert len(bar) == 80 and set(bar) <= LETTERS
    assert bar.endswith(".")  # free space last
    for part, letter in zip(PARTS, "SIMOTKNUAR", strict=True):
        tokens = parts_of(expected)[part]
        assert (letter in bar) == (tokens > 0), part
    # the used share of the bar follows prompt_tokens / window
    assert abs(sum(ch != "." for ch in bar) - 80 * expected["prompt_tokens"] / WINDOW) <= 10
    # carets at the threshold positions: 60 %, 74.2 %, 82 % of 80 cells
    assert marks.index("^W") == 48 and marks.index("^A") == 59 and marks.index("^H") == 65
    assert legend.startswith("legend: S=system base  I=instructions  M=memory")
    assert legend.endswith(".=free")
    assert thresholds.startswith("thresholds: ^W warn 76,800 (60%)")
    table = r.stdout.splitlines()[5:]
    assert table[0] == "parts"
    assert any(line.split()[:3] == ["R", "tool", "results"] for line in table)
    total = next(line for line in table if "total in prompt" in line)
    assert f"{expected['prompt_tokens']:,}" in total

    r = qwenctl(d, "context", sid, "--width", "50")
    bar, marks, _, _ = _bar_lines(r.stdout)
    assert len(bar) == 50 and len(marks) <= 50

    r = qwenctl(d, "context", sid[:8], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == expected

    r = qwenctl(d, "context", "zzzz")
    assert r.returncode == 1 and "no session matches" in r.stderr

    # no SESSION: the newest open session of the directory, or of its project above it
    repo = d.home / "repo"
    (repo / "src" / "deep").mkdir(parents=True)
    older = d.call("session.open", {"cwd": str(repo), "model": "stub-model"})["session_id"]
    d.call("session.close", {"session_id": older})
    for where in (repo, repo / "src" / "deep"):
        r = qwenctl(d, "--json", "context", "--cwd", str(where))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["session_id"] == sid  # open wins over the newer closed one
    elsewhere = d.home / "elsewhere"
    elsewhere.mkdir()
    r = qwenctl(d, "context", "--cwd", str(elsewhere))
    assert r.returncode == 1 and "no sessions in" in r.stderr


def test_qwenctl_context_resumes_a_closed_session(session) -> None:  # type: ignore[no-untyped-def]
    d, stub, sid = session
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "hello there"})
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "hi"}, "usage": {"prompt_tokens": 9000,
                                                        "completion_tokens": 3}})
    d.call("session.close", {"session_id": sid})
    r = qwenctl(d, "context", sid, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["session_id"] == sid and res["anchored"] is True
    assert res["prompt_tokens"] == sum(p["tokens"] for p in res["parts"])
    assert sid not in [s["session_id"] for s in d.call("daemon.status")["sessions"]]


def test_bar_cells_and_marks_helpers() -> None:
    from qwenctl import render

    cells, free = render.context_cells([5000, 1, 0, 20, 90_000], 128_000, 80)
    assert cells[1] == 1 and cells[2] == 0 and sum(cells) + free == 80
    assert sum(cells) == round(80 * 95_021 / 128_000)
    cells, free = render.context_cells([10, 10, 10], 10, 80)  # over the window: a full bar
    assert free == 0 and sum(cells) == 80
    cells, free = render.context_cells([1, 1, 1, 1], 1_000_000, 80)  # tiny parts still show
    assert cells == [1, 1, 1, 1] and free == 76
    # thresholds crowded at the end of a 1 M window: nudged apart, inside the bar
    marks = render.context_marks({"warn": 947_000, "auto": 967_000, "hard": 977_000},
                                 1_000_000, 80)
    assert len(marks) <= 80 and marks.strip() == "^W^A^H"
    marks = render.context_marks({"warn": 76_800, "auto": 95_000, "hard": 105_000}, 128_000, 80)
    assert [marks.index(x) for x in ("^W", "^A", "^H")] == [48, 59, 65]
