"""Content parts from clients are checked before they enter a history; odd parts already in a
recorded session (hand-edited, another tool) never break a turn."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.protocol import errors
from qwenctxd.sessions.content_parts import check_parts
from qwenctxd.testing.inprocess import InProcessDaemon

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.fixture
def daemon(inprocess_daemon: InProcessDaemon) -> InProcessDaemon:
    """This module's handler tests need no process: they run on the in-process daemon."""
    return inprocess_daemon


@pytest.mark.parametrize(("parts", "field"), [
    ([{}], "images[0].type"),
    ([{"type": {}}], "images[0].type"),
    ([IMAGE, {"type": "image_url"}], "images[1].image_url"),
    ([{"type": "image_url", "image_url": {"url": 5}}], "images[0].image_url"),
    ([{"type": "image_url", "image_url": {"url": "u", "detail": 1}}], "images[0].image_url.detail"),
    ([{"type": "text", "text": None}], "images[0].text"),
    ([{"type": "input_audio", "input_audio": "x"}], "images[0].input_audio"),
    ([{"type": "audio"}], "images[0].type"),
    ([3], "images[0]"),
])
def test_malformed_parts_name_the_field(parts: list[Any], field: str) -> None:
    with pytest.raises(errors.InvalidParams) as exc:
        check_parts(parts, "images")
    assert exc.value.data["field"] == field


def test_well_formed_parts_pass() -> None:
    check_parts([IMAGE, {"type": "image_url", "image_url": "https://x/y.png"},
                 {"type": "text", "text": "see"}, {"type": "file", "file": {"file_id": "f"}},
                 {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}], "images")


def test_through_the_socket_bad_parts_are_refused_and_nothing_is_recorded(
        daemon: InProcessDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    opened = daemon.call("session.open", {"cwd": str(repo), "model": "m"})
    sid = opened["session_id"]
    with pytest.raises(RemoteError) as exc:
        daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "look",
                                     "images": [IMAGE, {"type": {}}]})
    assert exc.value.code == -32602 and exc.value.data["field"] == "images[1].type"
    p = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "look",
                                     "images": [IMAGE]})
    assert len(p["messages"]) == 1  # reminders (the skills listing) ride in front
    assert p["messages"][0]["content"][-2:] == [{"type": "text", "text": "look"}, IMAGE]
    daemon.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                              "function": {"name": "shot",
                                                                           "arguments": "{}"}}]}})
    with pytest.raises(RemoteError) as exc:
        daemon.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": "c1", "name": "shot", "content": [{"type": "text", "text": 1}]}]})
    assert exc.value.data["field"] == "tool_results[0].content[0].text"
    p = daemon.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": "c1", "name": "shot", "content": [IMAGE]}]})
    assert len(p["messages"]) == 3  # the refused attempts left nothing behind
    daemon.call("session.close", {"session_id": sid})
    recorded = [json.loads(ln) for ln in
                Path(opened["path"]).read_text(encoding="utf-8").splitlines()]
    assert sum(1 for r in recorded if r["type"] in ("user", "assistant", "tool_result")) == 3


def test_odd_parts_in_a_recorded_session_do_not_break_it(daemon: InProcessDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    opened = daemon.call("session.open", {"cwd": str(repo), "model": "m"})
    sid = opened["session_id"]
    daemon.call("session.close", {"session_id": sid})
    odd = [{"type": {}}, {"type": "text", "text": 5}, {"type": "text"}, 7, None,
           {"type": "image_url", "image_url": None}]
    with open(opened["path"], "a", encoding="utf-8") as f:
        for role, content in (("user", odd), ("assistant", odd), ("user", {"a": 1}),
                              ("assistant", 5)):
            f.write(json.dumps({"uuid": str(uuid.uuid4()), "parentUuid": None,
                                "sessionId": sid, "timestamp": "2026-11-30T00:00:00Z",
                                "type": role, "cwd": str(repo),
                                "message": {"role": role, "content": content}}) + "\n")
    r = daemon.call("session.open", {"cwd": str(repo), "model": "m", "session_id": sid,
                                     "resume": True})
    assert r["resumed"] and r["messages"] == 4
    p = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": "still here"})
    last = p["messages"][-1]["content"]
    assert last == "still here" or last[-1] == {"type": "text", "text": "still here"}
    assert daemon.call("session.context", {"session_id": sid})["prompt_tokens"] > 0
    fast = daemon.call("session.compress", {"session_id": sid, "mode": "fast"})
    assert fast["status"] in ("compressed", "noop")
    daemon.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "fine"}})
    assert daemon.call("daemon.ping") == "pong"
