"""The daemon leaves once its shutdown is done, whatever thread was left behind.

After :meth:`Daemon.run` returns every service is closed. A non-daemon thread still alive
then (a database worker thread whose connection was never closed, a library's helper) would
keep the interpreter from exiting: ``qwenctl stop`` would wait, and systemd would SIGKILL the
service at ``TimeoutStopSec``. Such a thread is a bug; it is logged with its name and stack,
given a short grace to end, and the process then leaves with the shutdown's exit code.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import structlog

from qwenctxd.server import logging as daemon_logging

log = structlog.get_logger("qwenctxd.exit")

GRACE_S = 2.0  # for a lingering thread that is about to end by itself


def lingering_threads() -> list[threading.Thread]:
    """Alive non-daemon threads other than the calling one."""
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and t.is_alive() and not t.daemon]


def leave_when_threads_linger(code: int, grace_s: float = GRACE_S) -> None:
    """Return when no thread would hold the exit; else log them and ``os._exit(code)``."""
    deadline = time.monotonic() + grace_s
    for thread in lingering_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = lingering_threads()
    if not left:
        return
    frames = sys._current_frames()
    log.warning(
        "threads still running after shutdown; leaving without them",
        threads=[t.name for t in left],
        stacks={t.name: "".join(traceback.format_stack(frames[t.ident]))[-2000:]
                for t in left if t.ident in frames},
    )
    daemon_logging.flush_at_exit()
    sys.stdout.flush()
    os._exit(code)
