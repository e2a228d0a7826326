"""session.turn ``known``: only what is new comes back, and a client that splices the replies
(qwenctxd.client.SessionHistory) always holds exactly the history a known-less call returns —
across random turns, compactions (a small window), micro-compactions, rewinds, merged user
turns, reasoning replies and resumes; a restart or a stale/oversized ``known`` gets it whole."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.client import RemoteError, SessionHistory
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SUMMARY = ("<analysis>walked through it</analysis>\n<state_snapshot>\n<primary_request_and_intent>"
           "keep going</primary_request_and_intent>\n<next_step>more</next_step>\n"
           "</state_snapshot>")
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read",
                                             "parameters": {"type": "object", "properties": {
                                                 "file_path": {"type": "string"}}}}}]
# one step of a random session: a round is a user turn plus the model's work on it
STEPS = {
    "round": ["user", "reply"],
    "reasoning_round": ["user", "reply_reasoning"],
    "tool_round": ["user", "calls", "results_small", "reply"],
    "big_tool_round": ["user", "calls", "results_big", "calls", "results_big", "reply"],
    "unanswered": ["user"],  # the next user turn merges into it
    "abandoned": ["user", "calls"],  # the next user turn abandons the calls
    "compress": ["compress"],
    "rewind": ["rewind"],
    "resume": ["resume"],
    "stray_reply": ["reply"],
}


def summary_handler(body: dict[str, Any]) -> Reply:
    return Reply(content=SUMMARY, usage={"prompt_tokens": 100, "completion_tokens": 50})


@pytest.fixture
def stub():  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(handler=summary_handler) as s:
        yield s


def start_daemon(spawn, stub: ScriptedOpenAI) -> SpawnedDaemon:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
                                  "OPENAI_API_KEY": "test", "QWENCTXD_FAST_MODEL": "stub-fast"})
    settings_file = d.home / ".qwen" / "settings.json"
    settings_file.parent.mkdir(parents=True)
    # micro-compaction once tool results pass 6 000 characters, keeping one
    settings_file.write_text(json.dumps({"context": {"clearContextOnIdle": {
        "toolResultsTotalCharsThreshold": 6000, "toolResultsNumToKeep": 1}}}))
    (d.home / "proj").mkdir()
    return d.start()


class Twin:
    """One session driven known-less (the reference) and one through SessionHistory."""

    def __init__(self, d: SpawnedDaemon, window: int) -> None:
        self.d = d
        self.c = d.client()
        self.window = window
        self.ids = [self.open(None) for _ in range(2)]
        self.view = SessionHistory(self.ids[1])
        self.calls = 0
        self.pending: list[str] = []
        self.incremental = 0

    def open(self, sid: str | None) -> str:
        params: dict[str, Any] = {"cwd": str(self.d.home / "proj"), "model": "stub-model",
                                  "tools": TOOLS, "window_tokens": self.window}
        if sid is not None:
            params.update(session_id=sid, resume=True)
        return self.c.call("session.open", params)["session_id"]

    def both(self, method: str, params: dict[str, Any]) -> list[Any]:
        """Call ``method`` on both sessions: both succeed or both fail with the same code."""
        out: list[Any] = []
        for sid in self.ids:
            try:
                out.append(self.c.call(method, {"session_id": sid, **params}))
            except RemoteError as exc:
                out.append(exc)
        a, b = out
        assert type(a) is type(b), (method, params, a, b)
        if isinstance(a, RemoteError):
            assert a.code == b.code == -32602, (a, b)
        return out

    def turn(self, params: dict[str, Any]) -> None:
        try:
            full = self.c.call("session.turn", {"session_id": self.ids[0], **params})
        except RemoteError as exc:
            assert exc.code == -32602
            with pytest.raises(RemoteError) as again:
                self.view.turn(self.c, params)
            assert again.value.code == -32602
            return
        sent = self.view.known()
        raw = self.c.call("session.turn", self.view.params(params))
        # an old client's reply: the whole history, plus the new fields
        assert full["messages_from"] == 0 and full["epoch"]
        if raw["messages_from"]:
            assert sent is not None and raw["messages_from"] == sent["count"]
            assert raw["epoch"] == sent["epoch"]
            self.incremental += 1
        self.view.apply(raw)
        assert self.view.messages == full["messages"]
        assert {k: v for k, v in raw.items() if k not in ("messages", "messages_from", "epoch",
                                                          "session_id")} == {
            k: v for k, v in full.items() if k not in ("messages", "messages_from", "epoch",
                                                       "session_id")}

    def step(self, action: str, i: int) -> None:
        if action == "user":
            self.turn({"kind": "user", "text": f"question {i}"})
            self.pending = []
        elif action in ("reply", "reply_reasoning"):
            msg: dict[str, Any] = {"role": "assistant", "content": f"answer {i}"}
            if action == "reply_reasoning":
                msg["reasoning_content"] = f"thinking {i}"
            self.both("session.record_model", {"message": msg})
        elif action == "calls":
            self.calls += 1
            ids = [f"call_{self.calls}_{k}" for k in range(1 + i % 2)]
            msg = {"role": "assistant", "content": "", "reasoning_content": f"plan {i}",
                   "tool_calls": [{"id": c, "type": "function", "function": {
                       "name": "read_file", "arguments": json.dumps({"file_path": f"f{i}.py"})}}
                                  for c in ids]}
            res = self.both("session.record_model", {"message": msg,
                                                     "usage": {"prompt_tokens": 900 + 40 * i}})
            if not isinstance(res[0], RemoteError):
                self.pending = ids
        elif action in ("results_small", "results_big"):
            body = "ok\n" if action == "results_small" else "x = 1  # filler line\n" * 180
            self.turn({"kind": "tool_results", "tool_results": [
                {"tool_call_id": c, "name": "read_file", "content": body} for c in self.pending]
                or [{"tool_call_id": "nope", "content": "x"}]})
            self.pending = []
        elif action == "compress":
            self.both("session.compress", {"mode": "full"})
        elif action == "rewind":
            self.both("session.rewind", {"turns": 1})
            self.pending = []
        elif action == "resume":
            for sid in self.ids:
                self.c.call("session.close", {"session_id": sid})
            self.ids = [self.open(sid) for sid in self.ids]


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=14),
       window=st.sampled_from([4_500, 6_000, 200_000]))
def test_incremental_replies_rebuild_the_full_history(spawn, stub, steps: list[str],  # type: ignore[no-untyped-def]
                                                      window: int) -> None:
    d = getattr(test_incremental_replies_rebuild_the_full_history, "_daemon", None)
    if d is None or d.proc is None or d.proc.poll() is not None:
        d = start_daemon(spawn, stub)
        test_incremental_replies_rebuild_the_full_history._daemon = d  # type: ignore[attr-defined]
    twin = Twin(d, window)
    try:
        actions = [a for step in steps for a in STEPS[step]]
        for i, action in enumerate(actions):
            twin.step(action, i)
        twin.turn({"kind": "user", "text": "last question"})  # every example ends compared
    finally:
        twin.c.close()


def long_session(d: SpawnedDaemon, view: SessionHistory, c: Any, turns: int) -> list[dict]:
    replies = []
    for i in range(turns):
        replies.append(c.call("session.turn", view.params({"kind": "user", "text": f"q {i}"})))
        view.apply(replies[-1])
        c.call("session.record_model", {"session_id": view.session_id,
                                        "message": {"role": "assistant", "content": f"a {i}"}})
    return replies


def test_known_gets_only_new_messages_and_stale_known_the_whole_history(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d = start_daemon(spawn, stub)
    with d.client() as c:
        sid = c.call("session.open", {"cwd": str(d.home / "proj"), "model": "stub-model",
                                      "window_tokens": 1_000_000})["session_id"]
        view = SessionHistory(sid)
        replies = long_session(d, view, c, 30)
        assert replies[0]["messages_from"] == 0
        # from the second turn on: the recorded reply and the new question only
        assert all(r["messages_from"] == 2 * i - 1 and len(r["messages"]) == 2
                   for i, r in enumerate(replies[1:], 1))
        assert len(view.messages) == 59 and view.messages[-1]["content"].endswith("q 29")
        epoch = replies[-1]["epoch"]
        assert len({r["epoch"] for r in replies}) == 1
        # a count larger than the history, or another epoch: the whole history
        for known in ({"epoch": epoch, "count": 500}, {"epoch": "other", "count": 3}):
            r = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "again",
                                        "known": known})
            assert r["messages_from"] == 0 and len(r["messages"]) == len(view.messages) + 2
            view.apply(r)
            c.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": "x"}})
        # bad known: a clear error, nothing lost
        for bad, field in (({"epoch": epoch, "count": -1}, "known.count"),
                           ({"epoch": epoch}, "known"), ({"epoch": 3, "count": 1}, "known.epoch")):
            with pytest.raises(RemoteError) as exc:
                c.call("session.turn", {"session_id": sid, "kind": "user", "text": "x",
                                        "known": bad})
            assert exc.value.code == -32602 and exc.value.data["field"].startswith(field), (
                bad, exc.value.data)
        r = c.call("session.turn", view.params({"kind": "user", "text": "after errors"}))
        assert r["messages_from"] == len(view.messages) and len(r["messages"]) == 2
        view.apply(r)
        before = list(view.messages)
    # a restart: the epoch from before it gets the whole (resumed) history
    d.stop()
    d.start()
    with d.client() as c:
        c.call("session.open", {"cwd": str(d.home / "proj"), "model": "stub-model",
                                "session_id": sid, "resume": True})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "z"}})
        r = c.call("session.turn", view.params({"kind": "user", "text": "after restart"}))
        assert r["messages_from"] == 0 and r["epoch"] != epoch
        assert r["messages"][:len(before)] == before and len(r["messages"]) == len(before) + 2
        view.apply(r)
        r = c.call("session.turn", view.params({"kind": "user", "text": "merged"}))
        # the unanswered question merges into the last message: a rewrite, so the whole history
        assert r["messages_from"] == 0 and r["events"][0]["type"] == "user_turn_merged"
        assert len(r["messages"]) == len(before) + 2


def test_reasoning_dropped_from_a_finished_turn_starts_a_new_epoch(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d = start_daemon(spawn, stub)
    with d.client() as c:
        sid = c.call("session.open", {"cwd": str(d.home / "proj"), "model": "stub-model",
                                      "window_tokens": 1_000_000})["session_id"]
        view = SessionHistory(sid)
        r1 = view.turn(c, {"kind": "user", "text": "one"})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "", "reasoning_content": "hm",
            "tool_calls": [{"id": "c1", "function": {"name": "read_file", "arguments": "{}"}}]}})
        r2 = c.call("session.turn", view.params({"kind": "tool_results", "tool_results": [
            {"tool_call_id": "c1", "content": "data"}]}))
        assert r2["messages_from"] == 1 and r2["messages"][0]["reasoning_content"] == "hm"
        view.apply(r2)
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "done"}})
        r3 = c.call("session.turn", view.params({"kind": "user", "text": "two"}))
        # the earlier turn's reasoning is dropped now (current_turn): the client's copy is stale
        assert r3["messages_from"] == 0 and r3["epoch"] != r1["epoch"]
        assert "reasoning_content" not in r3["messages"][1]
        view.apply(r3)
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "plain"}})
        r4 = c.call("session.turn", view.params({"kind": "user", "text": "three"}))
        assert r4["messages_from"] == len(r3["messages"]) and r4["epoch"] == r3["epoch"]
