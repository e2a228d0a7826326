"""The ``events`` of ``session.turn`` and ``session.compress`` exactly as they travel, through
the socket of a spawned daemon with a scripted model: every member of every event, its type,
and which members are present (a null ``cause`` is sent, an optional hook member is left out).

The scenarios: the agent loop's own events (duplicate tool result, abandoned calls, merged user
turn, usage warning), forced micro-compaction, manual compression that succeeds and that fails
with PreCompact / PostCompact hooks around it (ok, failing and timed-out hooks), and automatic
compaction that succeeds, fails and falls back to micro-compaction, is skipped by the open
breaker, and at the hard threshold sheds tool output instead (hard fallback). Each event must
also parse into its own Struct of ``qwenctxd.protocol.turn_events`` (not the unknown-type dict)
and encode back to the very object that was sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from qwenctxd.protocol import turn_events
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SUMMARY = ("<analysis>looked</analysis>\n<state_snapshot>\n<primary_request_and_intent>"
           "wire events</primary_request_and_intent>\n<next_step>test</next_step>\n"
           "</state_snapshot>")
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read",
                                             "parameters": {"type": "object", "properties": {
                                                 "file_path": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "run_shell_command", "description": "run",
                                             "parameters": {"type": "object", "properties": {
                                                 "command": {"type": "string"}}}}}]
Event = dict[str, Any]

# every member each event type is sent with; `optional` members may be left out
REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "duplicate_tool_result": {"tool_call_id": str, "index": int},
    "tool_calls_abandoned": {"tool_call_ids": list},
    "user_turn_merged": {},
    "usage": {"level": str, "prompt_tokens": int},
    "micro_compacted": {"trigger": str, "cleared": dict, "kept": dict, "tokens_saved": int,
                        "evicted_read_paths": list, "unresolved_evicted_reads": int},
    "compressed": {"status": str, "trigger": str, "reason": str, "tokens_before": int,
                   "tokens_after": int},
    "compression_failed": {"status": str, "trigger": str, "reason": str,
                           "cause": (str, type(None))},
    "compression_fallback": {"fallback": str, "status": str, "cause": (str, type(None)),
                             "tokens_saved": int},
    "compression_skipped": {"reason": str, "level": str, "tokens": int},
    "hard_fallback": {"tokens_saved": int},
    "hook": {"hook": str, "status": str},
}
OPTIONAL: dict[str, dict[str, type | tuple[type, ...]]] = {
    "hook": {"command": str, "elapsed_ms": int, "exit_code": int, "timeout_s": (int, float),
             "stderr": str, "error": str},
}


def check_wire(ev: Event) -> None:
    """``ev`` has exactly its type's members, each of its type, no null where none is sent."""
    kind = ev["type"]
    assert kind in REQUIRED, ev
    required, optional = REQUIRED[kind], OPTIONAL.get(kind, {})
    assert set(required) <= set(ev) <= {"type", *required, *optional}, ev
    for name, value in ev.items():
        if name != "type":
            want = required.get(name) or optional[name]
            assert isinstance(value, want) and not isinstance(value, bool), (name, ev)


def check_typed(ev: Event) -> None:
    """``ev`` parses into its own Struct and encodes back to the same wire object."""
    typed = turn_events.parse(ev)
    assert isinstance(typed, turn_events.Event), ev
    assert type(typed) is turn_events.EVENT_TYPES[ev["type"]]
    assert msgspec.json.decode(msgspec.json.encode(typed)) == ev


def is_compression(body: dict[str, Any]) -> bool:
    sys_msgs = [m for m in body.get("messages", []) if m.get("role") == "system"]
    return bool(sys_msgs) and "state_snapshot" in str(sys_msgs[0].get("content"))


class Model:
    """The scripted endpoint: summaries succeed or come back empty as ``summaries`` says."""

    def __init__(self) -> None:
        self.summaries = "ok"

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_compression(body):
            text = SUMMARY if self.summaries == "ok" else "<analysis>only a draft</analysis>"
            return Reply(content=text, usage={"prompt_tokens": 100, "completion_tokens": 50})
        return Reply(content="{}", usage={"prompt_tokens": 10, "completion_tokens": 2})


@pytest.fixture
def model() -> Any:
    handler = Model()
    with ScriptedOpenAI(handler=handler, strict_chat=True) as stub:
        stub.script = handler  # type: ignore[attr-defined]
        yield stub


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"}


class Loop:
    """One session driven as an agent would, collecting every event sent back."""

    def __init__(self, d: SpawnedDaemon, cwd: Path, window: int = 1_000_000) -> None:
        self.d = d
        self.sid = d.call("session.open", {"cwd": str(cwd), "model": "stub-model",
                                           "tools": TOOLS, "window_tokens": window})["session_id"]
        self.events: list[Event] = []
        self.calls = 0
        self.last: dict[str, Any] = {}

    def turn(self, **params: Any) -> dict[str, Any]:
        self.last = self.d.call("session.turn", {"session_id": self.sid, **params})
        self.events += self.last["events"]
        return self.last

    def user(self, text: str) -> dict[str, Any]:
        return self.turn(kind="user", text=text)

    def reply(self, content: str = "ok", calls: list[dict[str, Any]] | None = None) -> Any:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return self.d.call("session.record_model", {"session_id": self.sid, "message": msg})

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"id": f"c{self.calls}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}

    def tool_round(self, name: str, args: dict[str, Any], content: str) -> dict[str, Any]:
        """The model calls ``name``; its result ``content`` comes back; the prompt after it."""
        c = self.call(name, args)
        self.reply("", [c])
        return self.turn(kind="tool_results", tool_results=[
            {"tool_call_id": c["id"], "name": name, "content": content}])

    def fill_to(self, target: int, path: str = "/src/big.py") -> dict[str, Any]:
        """A user turn whose tool result brings the prompt to about ``target`` tokens."""
        now = self.user("read the big file")["usage"]["prompt_tokens"]
        chars = max(400, (target - now) * 4)
        p = self.tool_round("read_file", {"file_path": path}, "x = 1  # filler\n" * (chars // 16))
        self.reply("read it")
        return p

    def compress(self, mode: str) -> dict[str, Any]:
        r = self.d.call("session.compress", {"session_id": self.sid, "mode": mode})
        self.events += r["events"]
        return r


def of(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e["type"] == kind]


def test_agent_loop_events_on_the_wire(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    loop = Loop(d, d.home)
    loop.user("load a skill")
    skill = loop.call("skill", {"skill": "nothing-here"})
    answered = loop.reply("", [skill])["answered"]
    assert [a["tool_call_id"] for a in answered] == [skill["id"]]
    p = loop.turn(kind="tool_results", tool_results=[
        {"tool_call_id": skill["id"], "content": "the client ran it too"}])
    assert p["events"] == [{"type": "duplicate_tool_result", "tool_call_id": skill["id"],
                            "index": 0}]
    loop.reply("no such skill")
    loop.user("read late.py")
    late = loop.call("read_file", {"file_path": "/src/late.py"})
    loop.reply("", [late])
    assert loop.user("never mind")["events"] == [
        {"type": "tool_calls_abandoned", "tool_call_ids": [late["id"]]}]
    assert loop.user("and again")["events"] == [{"type": "user_turn_merged"}]
    loop.reply("fine")
    # forced micro-compaction: read results report their paths, a shell result none
    for i in range(4):
        loop.user(f"step {i}")
        loop.tool_round("read_file", {"file_path": f"/src/f{i}.py"}, "data " * 400)
        loop.tool_round("run_shell_command", {"command": "ls"}, "out " * 400)
        loop.reply("done")
    fast = loop.compress("fast")
    assert fast["status"] == "compressed"
    [micro] = fast["events"]
    assert micro["type"] == "micro_compacted" and micro["trigger"] == "force"
    assert micro["evicted_read_paths"] and micro["unresolved_evicted_reads"] == 0
    assert micro["tokens_saved"] > 0 and micro["cleared"]["tool"] >= 2
    # a session whose cleared results were all shell output: empty lists are still sent
    shell = Loop(d, d.home)
    for i in range(8):
        shell.user(f"run {i}")
        shell.tool_round("run_shell_command", {"command": "ls"}, "out " * 400)
        shell.reply("done")
    [micro] = shell.compress("fast")["events"]
    assert micro["evicted_read_paths"] == [] and micro["unresolved_evicted_reads"] == 0
    # the usage warning: the prompt past the warn threshold
    warn = Loop(d, d.home, window=40_000)
    th = warn.user("hello")["usage"]["thresholds"]
    p = warn.fill_to((th["warn"] + th["auto"]) // 2)
    assert p["usage"]["level"] == "warn", p["usage"]
    assert of(p["events"], "usage") == [{"type": "usage", "level": "warn",
                                         "prompt_tokens": p["usage"]["prompt_tokens"]}]
    events = loop.events + shell.events + warn.events
    assert {e["type"] for e in events} == {"duplicate_tool_result", "tool_calls_abandoned",
                                           "user_turn_merged", "micro_compacted", "usage"}
    for ev in events:
        check_wire(ev)
        check_typed(ev)


def hook_settings(home: Path, marker: Path) -> None:
    settings = home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"hooks": {
        "PreCompact": [{"matcher": "manual", "hooks": [
            {"type": "command", "command": "echo '{\"additionalContext\": \"keep notes\"}'"},
            {"type": "command", "command": "sleep 5", "timeout": 1}]}],
        "PostCompact": [{"matcher": "manual", "hooks": [
            {"type": "command", "command": f"cat > {marker}; echo broke >&2; exit 3"}]}],
    }}))


def test_manual_compression_and_hook_events_on_the_wire(spawn, model) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(model))
    marker = d.root / "post.json"
    hook_settings(d.home, marker)
    d.start()
    loop = Loop(d, d.home)
    for i in range(4):
        loop.user(f"question {i}")
        loop.tool_round("read_file", {"file_path": f"/src/f{i}.py"}, "data " * 300)
        loop.reply(f"answer {i}")
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    ok = loop.compress("full")
    assert ok["status"] == "compressed", ok
    pre_ok, pre_timeout, post_failed, compressed = ok["events"]  # hooks in settings order
    assert pre_ok["hook"] == pre_timeout["hook"] == "PreCompact"
    assert (pre_ok["status"], pre_ok["exit_code"]) == ("ok", 0) and "stderr" not in pre_ok
    assert pre_timeout["status"] == "timeout" and pre_timeout["timeout_s"] == 1
    assert pre_timeout["command"] == "sleep 5" and "exit_code" not in pre_timeout
    assert post_failed["hook"] == "PostCompact" and post_failed["status"] == "failed"
    assert post_failed["exit_code"] == 3 and post_failed["stderr"].strip() == "broke"
    assert compressed == {"type": "compressed", "status": "compressed", "trigger": "manual",
                          "reason": "manual", "tokens_before": ok["tokens_before"],
                          "tokens_after": ok["tokens_after"]}
    assert marker.exists()
    model.script.summaries = "empty"
    loop.user("more")
    loop.reply("sure")
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    failed = loop.compress("full")
    assert failed["status"] == "failed_empty_summary", failed
    assert [e["type"] for e in failed["events"]] == ["hook", "hook", "compression_failed"]
    assert failed["events"][-1] == {"type": "compression_failed",
                                    "status": "failed_empty_summary", "trigger": "manual",
                                    "reason": "manual", "cause": failed["events"][-1]["cause"]}
    for ev in loop.events:
        check_wire(ev)
        check_typed(ev)


def test_automatic_compaction_events_on_the_wire(spawn, model) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env=model_env(model)).start()
    # auto compaction that works
    good = Loop(d, d.home, window=100_000)
    th = good.user("start")["usage"]["thresholds"]
    good.reply("ok")
    p = good.fill_to((th["auto"] + th["hard"]) // 2)
    [compressed] = of(p["events"], "compressed")
    assert compressed["reason"] == "auto" and compressed["trigger"] == "auto"
    assert compressed["tokens_after"] < compressed["tokens_before"]
    # summaries fail: micro-compaction instead (said so), then the breaker opens
    model.script.summaries = "empty"
    bad = Loop(d, d.home, window=100_000)
    bad.user("start")
    bad.reply("ok")
    for i in range(8):
        bad.fill_to((th["auto"] + th["hard"]) // 2, path=f"/src/big{i}.py")
        if of(bad.events, "compression_skipped"):
            break
    failed = of(bad.events, "compression_failed")
    assert [e["status"] for e in failed][:3] == ["failed_empty_summary"] * 3, bad.events
    assert {e["reason"] for e in failed} == {"auto"}
    fallback = of(bad.events, "compression_fallback")
    assert fallback and fallback[0]["fallback"] == "micro_compaction"
    assert fallback[0]["status"] == "failed_empty_summary"
    assert fallback[0]["cause"] == failed[0]["cause"]
    [skipped, *_] = of(bad.events, "compression_skipped")
    assert skipped["reason"] == "breaker_open" and skipped["level"] in ("auto", "hard")
    # past hard the daemon tries anyway; the summary fails, so tool output is shed
    before = len(bad.events)
    p = bad.fill_to(th["hard"] + 3_000, path="/src/huge.py")
    hard = bad.events[before:]
    assert [e["status"] for e in of(hard, "compression_failed")] == ["failed_empty_summary"]
    assert of(hard, "compression_failed")[0]["reason"] == "hard"
    [shed] = of(hard, "hard_fallback")
    [micro] = [e for e in of(hard, "micro_compacted") if e["trigger"] == "force"][-1:]
    assert shed["tokens_saved"] == micro["tokens_saved"]
    events = good.events + bad.events
    assert {"compressed", "compression_failed", "compression_fallback", "compression_skipped",
            "hard_fallback", "micro_compacted"} <= {e["type"] for e in events}
    for ev in events:
        check_wire(ev)
        check_typed(ev)
