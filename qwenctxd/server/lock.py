"""Single instance: an exclusive flock on the pid file beside the socket.

The lock is taken before the listener exists, so a second daemon fails fast and names the
first one's pid; the kernel releases the lock when a daemon dies, even by kill -9.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class AlreadyRunning(Exception):
    def __init__(self, pid: int | None, path: Path) -> None:
        self.pid, self.path = pid, path
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"qwenctxd is already running ({who} holds {path})")


class PidLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(pid, self.path) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self, *, unlink: bool = True) -> None:
        if self._fd is None:
            return
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def read_pid(fd_or_path: int | Path) -> int | None:
    try:
        if isinstance(fd_or_path, int):
            data = os.pread(fd_or_path, 32, 0)
        else:
            data = Path(fd_or_path).read_bytes()[:32]
        return int(data.strip() or b"0") or None
    except (OSError, ValueError):
        return None
