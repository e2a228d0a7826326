"""sessions.idle_close_minutes through the socket and qwenctl: an open session nobody touches
is closed after the configured time and resumes afterwards; an active one stays open; an
unknown key in [sessions] stops the daemon with the file and key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

IDLE_MINUTES = 0.05  # 3 s


def config(d: SpawnedDaemon, text: str) -> None:
    path = d.home / ".config" / "qwenctxd" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def open_session(d: SpawnedDaemon, cwd: Path) -> str:
    sid = d.call("session.open", {"cwd": str(cwd), "model": "m"})["session_id"]
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "hello"})
    d.call("session.record_model", {"session_id": sid,
                                    "message": {"role": "assistant", "content": "hi"}})
    return sid


def is_open(d: SpawnedDaemon, sid: str) -> bool:
    rows = {r["session_id"]: r for r in d.call("session.list", {})["sessions"]}
    return bool(rows[sid]["open"])


def test_idle_session_closed_then_resumable(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    config(d, f"[sessions]\nidle_close_minutes = {IDLE_MINUTES}\n")
    d.start()
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    idle = open_session(d, repo)
    busy = open_session(d, repo)
    started = time.monotonic()
    turns = 0

    def idle_closed_while_busy_talks() -> bool:
        """One busy turn per call: until() calls this at most ``interval`` apart, far more
        often than the idle limit, so only the idle session goes quiet."""
        nonlocal turns
        turns += 1
        d.call("session.turn", {"session_id": busy, "kind": "user", "text": f"more {turns}"})
        d.call("session.record_model", {"session_id": busy,
                                        "message": {"role": "assistant", "content": "ok"}})
        return not is_open(d, idle)

    until(idle_closed_while_busy_talks, timeout=30, interval=0.3,
          what="the idle session to be closed")
    assert time.monotonic() - started >= IDLE_MINUTES * 60 * 0.9
    assert is_open(d, busy)
    assert idle not in {s["session_id"] for s in d.call("daemon.status")["sessions"]}
    with pytest.raises(RemoteError) as exc:
        d.call("session.turn", {"session_id": idle, "kind": "user", "text": "back"})
    assert exc.value.code == -32001
    # qwenctl shows it closed
    r = qwenctl(d, "sessions", "show", idle[:8])
    assert r.returncode == 0 and "closed" in r.stdout
    # resumable: the history is all there
    res = d.call("session.open", {"cwd": str(repo), "model": "m", "session_id": idle})
    assert res["resumed"] is True and res["messages"] == 2
    p = d.call("session.turn", {"session_id": idle, "kind": "user", "text": "back"})
    assert [m["role"] for m in p["messages"]][:2] == ["user", "assistant"]
    assert d.proc.poll() is None


def test_zero_turns_idle_close_off_and_bad_key_is_an_error(spawn) -> None:  # type: ignore[no-untyped-def]
    # two daemons, sessions opened the same way: the control closes its session after
    # 0.6 s idle; by then the one with the limit off has been idle longer, and stays open
    off: SpawnedDaemon = spawn()
    config(off, "[sessions]\nidle_close_minutes = 0\n")
    control: SpawnedDaemon = spawn()
    config(control, "[sessions]\nidle_close_minutes = 0.01\n")
    off.start()
    control.start()
    kept = open_session(off, off.home)
    closed = open_session(control, control.home)
    until(lambda: not is_open(control, closed), what="the control daemon's idle close")
    assert is_open(off, kept)
    off.stop()
    control.stop()
    bad: SpawnedDaemon = spawn()
    config(bad, "[sessions]\nidle_close_minute = 5\n")
    bad.start(wait=False)
    assert bad.wait_exit(15) != 0
    assert "sessions.idle_close_minute" in bad.log_text()
