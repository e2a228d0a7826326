"""The daemon's exit is not held by a thread its shutdown left behind (server.exit_guard): a
real interpreter with a stuck non-daemon thread leaves with the shutdown's code, and says
which thread it left."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

PROGRAM = textwrap.dedent("""
    import threading, time
    from qwenctxd.server import exit_guard, logging as daemon_logging
    daemon_logging.configure("info", "json")
    stuck = threading.Event()
    threading.Thread(target=stuck.wait, name="stuck-db-worker").start()  # never set
    threading.Thread(target=time.sleep, args=(0.2,), name="about-to-end").start()
    exit_guard.leave_when_threads_linger(7, grace_s=1.0)
    raise SystemExit("not reached: the guard returned with a thread still running")
""")


def test_a_lingering_thread_does_not_hold_the_exit() -> None:
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 7, r.stderr
    assert time.monotonic() - started < 30  # liveness bound: it did not wait for the thread
    lines = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    [warned] = [e for e in lines if e["event"].startswith("threads still running")]
    assert warned["threads"] == ["stuck-db-worker"]  # the one that ended in time is not named
    assert "wait" in warned["stacks"]["stuck-db-worker"]


def test_no_lingering_thread_returns_normally() -> None:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from qwenctxd.server import exit_guard
        exit_guard.leave_when_threads_linger(3)
        print("returned")
    """)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "returned", r.stderr
