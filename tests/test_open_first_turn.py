"""``session.open {first_turn}``: a new conversation opens and takes its first turn in one call.

Through the socket of a spawned daemon: the turn runs only on a session that holds no messages
(its prompt is what ``session.open`` then ``session.turn`` would give), a session that holds
messages is opened and left as it was (no ``prompt`` in the reply), and a malformed first turn is
refused before anything is opened."""

from __future__ import annotations

from typing import Any

import pytest

from qwenctxd.client import RemoteError, SessionHistory
from qwenctxd.testing.spawn import SpawnedDaemon

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read",
                                             "parameters": {"type": "object"}}}]


def open_params(d: SpawnedDaemon, **extra: Any) -> dict[str, Any]:
    return {"cwd": str(d.home / "proj"), "model": "m", "tools": TOOLS, **extra}


def roles(c: Any, session_id: str) -> list[str]:
    """The roles of the session's recorded messages, in order."""
    entries = c.call("session.transcript", {"session_id": session_id})["entries"]
    return [e["role"] for e in entries if e["kind"] == "message" and e["role"] != "system"]


def comparable(prompt: dict[str, Any]) -> dict[str, Any]:
    """What two sessions' first prompts share (the session's own id and epoch aside)."""
    return {k: v for k, v in prompt.items() if k not in ("session_id", "epoch")}


def test_first_turn_runs_in_the_open_of_a_new_session(daemon: SpawnedDaemon) -> None:
    (daemon.home / "proj").mkdir()
    (daemon.home / "proj" / "QWEN.md").write_text("Answer briefly.\n")
    with daemon.client() as c:
        one = c.call("session.open", open_params(
            daemon, session_id="11111111-1111-4111-8111-111111111111",
            first_turn={"kind": "user", "text": "where is the parser?"}))
        assert one["resumed"] is False and one["messages"] == 0
        prompt = one["prompt"]
        assert prompt["session_id"] == one["session_id"] and prompt["messages_from"] == 0
        last = prompt["messages"][-1]
        assert last["role"] == "user" and last["content"][-1] == {
            "type": "text", "text": "where is the parser?"}
        assert "Answer briefly." in prompt["system"]
        # the same as opening and then taking the turn
        two = c.call("session.open", open_params(daemon))
        assert "prompt" not in two
        turn = c.call("session.turn", {"session_id": two["session_id"], "kind": "user",
                                       "text": "where is the parser?"})
        assert comparable(prompt) == comparable(turn)
        # the session goes on as any other: the recorded question, the reply, the next turn
        view = SessionHistory(one["session_id"])
        view.apply(prompt)
        c.call("session.record_model", {"session_id": one["session_id"], "message": {
            "role": "assistant", "content": "in src/parse.py"}})
        nxt = c.call("session.turn", view.params({"kind": "user", "text": "thanks"}))
        assert nxt["messages_from"] == 1
        assert [m["role"] for m in view.apply(nxt)] == ["user", "assistant", "user"]
        assert roles(c, one["session_id"]) == ["user", "assistant", "user"]


def test_a_session_with_messages_is_opened_and_left_as_it_was(daemon: SpawnedDaemon) -> None:
    (daemon.home / "proj").mkdir()
    sid = "22222222-2222-4222-8222-222222222222"
    with daemon.client() as c:
        c.call("session.open", open_params(daemon, session_id=sid))
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "first question"})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "first answer"}})
        # another client opens it with a first turn: joined, the turn not taken
        joined = c.call("session.open", open_params(
            daemon, session_id=sid, first_turn={"kind": "user", "text": "first question"}))
        assert joined["messages"] == 2 and "prompt" not in joined
        assert roles(c, sid) == ["user", "assistant"]
    # the same after a restart: resumed from its file, nothing appended
    daemon.stop()
    daemon.start()
    with daemon.client() as c:
        resumed = c.call("session.open", open_params(
            daemon, session_id=sid, first_turn={"kind": "user", "text": "first question"}))
        assert resumed["resumed"] is True and resumed["messages"] == 2
        assert "prompt" not in resumed
        assert roles(c, sid) == ["user", "assistant"]


@pytest.mark.parametrize(("first_turn", "field"), [
    ({"kind": "user", "text": "x", "session_id": "y"}, "first_turn.session_id"),
    ({"kind": "shout", "text": "x"}, "first_turn.kind"),
    ({"kind": "user", "text": 3}, "first_turn.text"),
    ("hello", "first_turn"),
])
def test_a_malformed_first_turn_is_refused_and_nothing_opened(
        daemon: SpawnedDaemon, first_turn: Any, field: str) -> None:
    (daemon.home / "proj").mkdir()
    sid = "33333333-3333-4333-8333-333333333333"
    with daemon.client() as c:
        with pytest.raises(RemoteError) as exc:
            c.call("session.open", open_params(daemon, session_id=sid, first_turn=first_turn))
        assert exc.value.code == -32602 and exc.value.data["field"] == field, exc.value.data
        assert c.call("session.list", {"cwd": str(daemon.home / "proj")})["sessions"] == []
        with pytest.raises(RemoteError) as gone:
            c.call("session.context", {"session_id": sid})
        assert gone.value.code == -32001
