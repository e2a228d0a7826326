"""A rewind takes back what the rewound turn delivered, through the socket: the skill listing,
the environment reminder, conditional rules and recalled memories rode in the messages that are
gone, so asking again delivers them again (a retry after a cut answer — Qwen Code's — must not
leave the model without them), while a turn that merely follows does not repeat them."""

from __future__ import annotations

from pathlib import Path

from qwenctxd.testing.spawn import SpawnedDaemon

ASK = "what is the deploy gate called before a release?"
DELIVERED_ONCE = {"environment", "skills", "rule", "memory"}


def kinds(prompt: dict) -> set[str]:  # type: ignore[type-arg]
    return {r["kind"] for r in prompt["reminders"]}


def project(root: Path) -> Path:
    proj = root / "proj"
    (proj / ".git").mkdir(parents=True)
    rules = proj / ".qwen" / "rules"
    rules.mkdir(parents=True)
    (rules / "py.md").write_text("---\npaths: ['**/*.py']\n---\nPython files use tabs.\n")
    return proj


def test_a_rewound_turn_delivers_its_reminders_again(daemon: SpawnedDaemon) -> None:
    proj = project(daemon.root)
    daemon.call("memory.save", {"cwd": str(proj), "type": "project", "name": "deploy gate",
                                "description": "the deploy gate is called BLUEHERON",
                                "body": "Before a release the deploy gate is called BLUEHERON."})
    sid = daemon.call("session.open", {"cwd": str(proj), "model": "m"})["session_id"]
    first = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": ASK,
                                         "touched_paths": [str(proj / "app.py")]})
    sent = kinds(first) & DELIVERED_ONCE
    assert {"environment", "skills", "rule"} <= sent, first["reminders"]
    daemon.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "The deploy gate is a platform designed to"}})

    daemon.call("session.rewind", {"session_id": sid, "turns": 1})
    again = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": ASK,
                                         "touched_paths": [str(proj / "app.py")]})
    assert kinds(again) & DELIVERED_ONCE >= sent, (sent, again["reminders"])

    # the control: a turn that follows (nothing taken back) does not send them a second time
    daemon.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "BLUEHERON."}})
    follow = daemon.call("session.turn", {"session_id": sid, "kind": "user",
                                          "text": "and after the release?",
                                          "touched_paths": [str(proj / "app.py")]})
    assert not kinds(follow) & {"environment", "skills", "rule"}, follow["reminders"]
