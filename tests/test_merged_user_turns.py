"""A user turn that joins an unanswered one is recorded as a delta (Qwen Code's
``mid_turn_user_message``), never as the whole merged message again: resume rebuilds exactly the
merged message the live session held, reminders where they were, and session.transcript shows
one user entry carrying all of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenctxd.compaction.summary import join_content
from qwenctxd.testing.spawn import SpawnedDaemon


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


def test_merged_turns_are_deltas_and_resume_to_the_live_message(spawn: type[SpawnedDaemon]) -> None:
    d = spawn().start()
    repo = d.root / "repo"
    (repo / ".qwen" / "rules").mkdir(parents=True)
    (repo / "QWEN.md").write_text("be brief\n")
    (repo / ".qwen" / "rules" / "py.md").write_text(
        '---\npaths: ["src/**/*.py"]\n---\nPython rule: type everything.\n')
    big = "x" * 200_000
    with d.client() as c:
        sid = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "first " + big})
        second = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "second",
                                         "touched_paths": ["src/a/b.py"]})
        third = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "third"})
        tr = c.call("session.transcript", {"session_id": sid})
    assert [e["type"] for e in second["events"]].count("user_turn_merged") == 1
    live = third["messages"]
    assert [m["role"] for m in live] == ["user"]  # one user message, never two in a row
    merged = live[-1]["content"]
    # the rule reminder of the second turn sits right before its words, after the first's
    assert isinstance(merged, list)
    texts = [p["text"] for p in merged if p.get("type") == "text"]
    assert texts[-3].startswith("<system-reminder>") and "Python rule" in texts[-3]
    assert texts[-2:] == ["second", "third"] or texts[-1] == "second\n\nthird"
    assert sum("first " in t for t in texts) == 1 and sum("Python rule" in t for t in texts) == 1

    path = Path(tr["path"])
    recs = lines(path)
    users = [r for r in recs if r["type"] == "user"]
    assert [r.get("subtype") for r in users] == [None, "mid_turn_user_message",
                                                 "mid_turn_user_message"]
    assert not [r for r in recs if r.get("subtype") == "rewind"]
    # each merge appended only what was new: the big first text is only in the first record
    # (its parts and its displayText), never again
    assert [json.dumps(r).count(big) for r in recs if r["type"] == "user"] == [2, 0, 0]
    size = path.stat().st_size
    delta_texts = [[p.get("text") for p in r["message"]["parts"]] for r in users[1:]]
    assert delta_texts[1] == ["third"] and delta_texts[0][-1] == "second"
    assert "Python rule" in delta_texts[0][0]
    assert users[1]["systemPayload"]["displayText"] == "second"

    # the transcript: one user entry, the merged message as the session held it
    user_entries = [e for e in tr["entries"] if e["role"] == "user"]
    assert len(user_entries) == 1 and user_entries[0]["text"] == text_of(merged)

    # session.list counts the merged message once, as resume does
    with d.client() as c:
        [row] = [r for r in c.call("session.list", {"cwd": str(repo)})["sessions"]
                 if r["session_id"] == sid]
    assert row["messages"] == 1

    # a new daemon resumes exactly the merged message; the next merge joins it the same way
    d.kill9()
    again = spawn(root=d.root)
    again.log_path = d.root / "again.log"
    again.start()
    with again.client() as c:
        opened = c.call("session.open", {"cwd": str(repo), "model": "m", "session_id": sid,
                                         "resume": True})
        assert opened["resumed"] is True and opened["messages"] == 1
        fourth = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "fourth"})
    resumed = fourth["messages"]
    assert len(resumed) == 1
    # resume rebuilt the merged message exactly; this turn's delta (its own reminders, then its
    # words) joins it as the live session joins it
    delta = lines(path)[-1]
    assert delta["subtype"] == "mid_turn_user_message"
    assert delta["message"]["parts"][-1] == {"text": "fourth"}
    content = resumed[-1]["content"]
    assert content[:len(merged)] == merged and content[-1] == {"type": "text", "text": "fourth"}
    assert content == join_content(merged, content[len(merged):])
    assert path.stat().st_size < size + 4096  # the fourth turn added a small delta
