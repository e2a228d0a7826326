"""systemd integration without libsystemd: sd_notify datagrams and socket activation.

``notify`` sends READY/STATUS/STOPPING/WATCHDOG lines to ``$NOTIFY_SOCKET`` (a path or an
abstract ``@name``) and is a no-op elsewhere. ``inherited_listener_fd`` adopts fd 3 when
``LISTEN_PID`` names this process (socket activation, ``Accept=no``).
"""

from __future__ import annotations

import os
import socket

import structlog

log = structlog.get_logger("qwenctxd.systemd")
SD_LISTEN_FDS_START = 3


def notify(state: str) -> bool:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify failed", error=type(exc).__name__)
        return False
    return True


def inherited_listener_fd() -> int | None:
    """fd 3 if systemd (or a test acting as it) passed us a listening socket; env cleared."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        n = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        n = 0
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)
    return SD_LISTEN_FDS_START if n >= 1 else None


def watchdog_interval_s() -> float | None:
    """Half of WATCHDOG_USEC (the ping period systemd expects), or None when not requested."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2_000_000, 0.05)
    except ValueError:
        return None
