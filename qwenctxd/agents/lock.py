"""The consolidation lock: one dream per project across every process that shares its memory.

The lock is ``<state dir>/consolidation.lock`` (Qwen Code uses the same file), created with
``O_CREAT | O_EXCL`` and holding the holder's PID in decimal. An existing lock is *live* only
while both hold: its mtime is at most an hour old, and its PID is alive (``kill(pid, 0)``
succeeds or fails with ``EPERM``; a zombie counts as dead). A stale or dead-PID lock is removed
and the acquisition retried once — before removing, the file's inode and mtime are compared
with what was judged stale, so a lock another process just re-created is left alone.

``release()`` unlinks the file only while it still holds our PID. When that unlink fails
(``EPERM``, ``EROFS``, a full disk…) the lock would stay behind with a fresh mtime and a live PID
— ours — and silently suppress every later dream of this process. So a failed release is
remembered (per process, by lock path, so every instance sees it: ``release_failed``) and
the next ``acquire()`` or ``heal()`` of any instance force-removes a lock that still holds our PID before judging it:
the "release-failure self-heal".

A freshly created lock may be empty for an instant (created, PID not yet written); an empty or
unreadable lock younger than :data:`EMPTY_GRACE_S` therefore counts as live, an older one as
stale.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog

from qwenctxd.protocol.errors import LockHeld

log = structlog.get_logger("qwenctxd.agents.lock")

STALE_AFTER_S = 3600.0
EMPTY_GRACE_S = 10.0
MAX_LOCK_BYTES = 64

# Paths whose release failed in this process: the next acquire/heal of any instance cleans up.
_RELEASE_FAILED: set[str] = set()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a running process (``EPERM`` means it exists; zombies are dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # "pid (comm) S ..." — comm may contain spaces and parentheses: split at the last ')'.
        state = stat.rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return False
    except (OSError, IndexError):
        pass
    return True


def _parse_pid(raw: bytes) -> int | None:
    text = raw.strip()
    if not text or not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:
        return None


class ConsolidationLock:
    """A PID lock file; see the module docstring. Use ``acquire``/``release`` or ``with``."""

    def __init__(self, path: Path, *, stale_after_s: float = STALE_AFTER_S) -> None:
        self.path = Path(path)
        self.stale_after_s = stale_after_s
        self.held = False

    # -- inspection ------------------------------------------------------------------------------
    @property
    def release_failed(self) -> bool:
        """True after a release that could not remove the lock (until a heal succeeds)."""
        return str(self.path) in _RELEASE_FAILED

    def _read(self) -> tuple[os.stat_result, bytes] | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO opens
                         | getattr(os, "O_NOFOLLOW", 0))  # without blocking; read() gives b""
        except FileNotFoundError:
            return None
        except OSError:
            # a symlink or unreadable file: judge it by lstat alone (no PID → stale when old)
            try:
                return os.lstat(self.path), b""
            except FileNotFoundError:
                return None
        try:
            st = os.fstat(fd)
            data = os.read(fd, MAX_LOCK_BYTES) if stat.S_ISREG(st.st_mode) else b""
        finally:
            os.close(fd)
        return st, data

    def _judge(self, st: os.stat_result, data: bytes) -> dict[str, Any]:
        age = max(0.0, time.time() - st.st_mtime)
        pid = _parse_pid(data)
        if pid is None:
            live = age <= EMPTY_GRACE_S
        else:
            live = age <= self.stale_after_s and pid_alive(pid)
        return {"pid": pid, "age_s": round(age, 3), "live": live}

    def holder(self) -> dict[str, Any] | None:
        """``{pid, age_s, live}`` of the current lock file, or None when there is none."""
        got = self._read()
        if got is None:
            return None
        return self._judge(*got)

    # -- acquisition -------------------------------------------------------------------------------
    def _unlink(self) -> None:
        os.unlink(self.path)

    def _remove_if_same(self, st: os.stat_result) -> bool:
        """Remove the lock if it is still the file judged (same inode and mtime)."""
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return True
        if (now.st_ino, now.st_dev, now.st_mtime_ns) != (st.st_ino, st.st_dev, st.st_mtime_ns):
            return False
        try:
            self._unlink()
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.warning("lock.remove_failed", path=str(self.path), error=str(exc))
            return False
        return True

    def heal(self) -> bool:
        """After a failed release: remove the lock if it still holds our PID (or nothing
        readable). Returns True when nothing of ours is left behind."""
        if not self.release_failed:
            return True
        got = self._read()
        if got is not None:
            st, data = got
            pid = _parse_pid(data)
            if pid is not None and pid != os.getpid():
                self._clear_failed()  # someone else took it since: not ours to remove
                return True
            if not self._remove_if_same(st):
                return False
            log.info("lock.self_healed", path=str(self.path))
        self._clear_failed()
        return True

    def _clear_failed(self) -> None:
        _RELEASE_FAILED.discard(str(self.path))

    def acquire(self) -> bool:
        """Take the lock; False when a live holder has it. A stale or dead-PID lock is removed
        and the creation retried once."""
        if self.held:
            return True
        self.heal()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o644)
            except FileExistsError:
                got = self._read()
                if got is None:
                    continue  # vanished in between: try again
                info = self._judge(*got)
                if info["live"] or attempt:
                    return False
                log.info("lock.stale_removed", path=str(self.path), pid=info["pid"],
                         age_s=info["age_s"])
                if not self._remove_if_same(got[0]):
                    return False
                continue
            try:
                os.write(fd, str(os.getpid()).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self.held = True
            return True
        return False

    def release(self) -> bool:
        """Give the lock back: unlink it if it still holds our PID. Returns False when the
        unlink failed (the next acquire/heal cleans up). An instance that does not hold the
        lock releases nothing."""
        if not self.held:
            return True
        self.held = False
        got = self._read()
        if got is None:
            return True
        st, data = got
        if _parse_pid(data) != os.getpid():
            return True  # not ours (any more): leave it
        try:
            self._unlink()
        except FileNotFoundError:
            return True
        except OSError as exc:
            _RELEASE_FAILED.add(str(self.path))
            log.warning("lock.release_failed", path=str(self.path), error=str(exc))
            return False
        return True

    # -- context manager ---------------------------------------------------------------------------
    def __enter__(self) -> Self:
        if not self.acquire():
            info = self.holder() or {}
            raise LockHeld(f"{self.path} is held by pid {info.get('pid')}",
                           data={"path": str(self.path), "pid": info.get("pid")})
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
