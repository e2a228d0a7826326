"""Reaching the daemon from qwenctl: connect, auto-start when nobody answers, exit codes.

Auto-start launches ``python -m qwenctxd`` detached (its own session, stdin closed, output to
``$XDG_STATE_HOME/qwenctxd/qwenctxd.log``) and waits for it to answer a ping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from qwenctxd.client import Client, DaemonUnreachable
from qwenctxd.client.errors import ClientError
from qwenctxd.paths import socket_path, state_dir
from qwenctxd.protocol import methods

EXIT_OK, EXIT_DAEMON_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class Unreachable(Exception):
    """No daemon, and none could (or should) be started; the message says what to do."""


def start_hint(path: Path) -> str:
    return (
        f"qwenctxd is not running at {path}; start it with `qwenctxd` "
        f"(or `make run` in a checkout, or `systemctl --user start qwenctxd`)"
    )


LOG_ROTATE_BYTES = 8 * 1024 * 1024


def log_path() -> Path:
    return state_dir() / "qwenctxd.log"


def rotate_log(logfile: Path, limit: int = LOG_ROTATE_BYTES) -> bool:
    """Before a daemon is started on it: a log of ``limit`` bytes or more becomes
    ``qwenctxd.log.1`` (replacing an older one), so the file of autostarted daemons stays
    bounded. (A daemon under systemd logs to the journal, which rotates itself.)"""
    try:
        if logfile.stat().st_size < limit:
            return False
        os.replace(logfile, logfile.with_name(logfile.name + ".1"))
        return True
    except FileNotFoundError:
        return False


def spawn_daemon(sock: Path) -> subprocess.Popen[bytes]:
    logfile = log_path()
    logfile.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(logfile)
    env = dict(os.environ)
    env["QWENCTXD_SOCKET"] = str(sock)
    with open(logfile, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "qwenctxd", "--log-format", "json"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
            close_fds=True,
        )


def connect(socket_override: str | None, *, autostart: bool, timeout: float | None) -> Client:
    sock = socket_path(socket_override)
    try:
        return Client(sock, timeout=timeout)
    except DaemonUnreachable:
        if not autostart:
            raise Unreachable(start_hint(sock)) from None
    proc = spawn_daemon(sock)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None and code != 1:  # 1: another daemon won the race; keep trying
            raise Unreachable(
                f"qwenctxd failed to start (exit {code}); see {log_path()}"
            )
        try:
            client = Client(sock, timeout=timeout)
            client.request(methods.DAEMON_PING)
            return client
        except (DaemonUnreachable, ClientError, OSError):
            time.sleep(0.05)
    raise Unreachable(f"qwenctxd did not answer within 10 s after start; see {log_path()}")
