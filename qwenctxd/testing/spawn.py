"""Spawn the real daemon as a subprocess in a scratch HOME / XDG_RUNTIME_DIR.

Paths are kept short (AF_UNIX allows 107 bytes) by rooting the scratch tree in /tmp.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qwenctxd.client import Client, DaemonUnreachable
from qwenctxd.client.errors import ClientError
from qwenctxd.testing import forkserver
from qwenctxd.testing.wait import WaitTimeout, until

#: pids of daemons started by a live SpawnedDaemon of this process: each one stops its own,
#: so another instance on the same tree (a restart) must never kill it.
_SPAWNED: set[int] = set()


def _gone_or_zombie(pid: int) -> bool:
    """True once ``pid`` has exited (reaping it when it is our child) or is a zombie."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass  # not our child: its parent reaps it
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"Z", b"X")


#: scratch roots SpawnedDaemon made in this process (tests/conftest.py checks none is left).
CREATED_ROOTS: set[Path] = set()


#: The older name of :func:`qwenctxd.testing.wait.until`, kept for its callers.
wait_until = until


class SpawnedDaemon:
    """A daemon process plus the scratch directories it lives in."""

    def __init__(self, root: Path | None = None, env: dict[str, str] | None = None, *,
                 fresh: bool = False) -> None:
        #: start a fresh interpreter (``python -m qwenctxd``) rather than a fork of the
        #: pre-imported :mod:`~qwenctxd.testing.forkserver`: for tests about start-up itself
        self.fresh = fresh
        self.root = root or Path(tempfile.mkdtemp(prefix="qcd-", dir="/tmp"))
        self._own_root = root is None
        if self._own_root:
            CREATED_ROOTS.add(self.root)
        self.home = self.root / "home"
        self.runtime = self.root / "run"
        self.home.mkdir(parents=True, exist_ok=True)
        self.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.runtime, 0o700)
        self.socket = self.runtime / "qwenctxd" / "qwenctxd.sock"
        self.log_path = self.root / "daemon.log"
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "QWEN", "XDG_", "LISTEN_", "NOTIFY_", "WATCHDOG_"))
        }
        base.update(
            HOME=str(self.home),
            XDG_RUNTIME_DIR=str(self.runtime),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
            PYTHONUNBUFFERED="1",
        )
        base.update(env or {})
        self.env = base
        self.proc: subprocess.Popen[bytes] | forkserver.ForkedProcess | None = None
        self._log_file: Any = None

    # -- process control ---------------------------------------------------------------------
    def start(
        self,
        *extra_args: str,
        wait: bool = True,
        timeout: float = 15.0,
        pass_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
        preexec_fn: Any = None,
        argv_prefix: tuple[str, ...] = (),
    ) -> SpawnedDaemon:
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        if self._forkable(pass_fds, preexec_fn, argv_prefix):
            with open(os.devnull, "rb") as devnull:
                self.proc = forkserver.zygote().start(
                    "qwenctxd", ["--log-format", "json", *extra_args],
                    env={**self.env, **(env or {})}, cwd=str(self.root),
                    stdin=devnull.fileno(), stdout=self._log_file.fileno(),
                    stderr=self._log_file.fileno())
            forkserver.register(self.proc, self.home)
            _SPAWNED.add(self.proc.pid)
            if wait:
                self.wait_ready(timeout)
            return self
        self.proc = subprocess.Popen(
            [*argv_prefix, sys.executable, "-m", "qwenctxd", "--log-format", "json", *extra_args],
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            cwd=self.root,  # a relative path the daemon resolves lands in the scratch tree
            stdout=self._log_file,
            stderr=self._log_file,
            pass_fds=pass_fds,
            preexec_fn=preexec_fn,
        )
        _SPAWNED.add(self.proc.pid)
        if wait:
            self.wait_ready(timeout)
        return self

    def _forkable(self, pass_fds: tuple[int, ...], preexec_fn: Any,
                  argv_prefix: tuple[str, ...]) -> bool:
        """Whether this start can be a fork of the pre-imported server: not when it must be a
        fresh interpreter, inherit descriptors, run a hook before exec or run under a wrapper."""
        return (not self.fresh and forkserver.enabled() and not pass_fds and preexec_fn is None
                and not argv_prefix)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Return once the daemon answers a ping; RuntimeError if it exited first,
        TimeoutError (with its log) if it never answered."""
        def pong() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()}")
            with Client(self.socket, timeout=2) as c:
                return bool(c.call("daemon.ping") == "pong")

        try:
            until(pong, timeout=timeout, interval=0.02, what="the daemon answering a ping",
                  ignoring=(DaemonUnreachable, ClientError, OSError))
        except WaitTimeout:
            raise TimeoutError(f"daemon not ready after {timeout}s:\n{self.log_text()}") from None

    def client(self, **kw: Any) -> Client:
        return Client(self.socket, **kw)

    def call(self, method: str, params: Any = None) -> Any:
        with self.client() as c:
            return c.call(method, params)

    def wait_exit(self, timeout: float = 15.0) -> int:
        """The exit code; a daemon still running after ``timeout`` is a failure that shows
        where it is stuck (SIGUSR1 makes it write every thread's stack to its log)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            raise AssertionError(
                f"daemon pid {self.proc.pid} still running {timeout} s after it was told to "
                f"stop; its log ends:\n{self.log_text()[-12000:]}") from None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.call("daemon.shutdown", {"drain": False})
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.returncode is not None:
            _SPAWNED.discard(self.proc.pid)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cleanup(self) -> None:
        self.stop()
        self._reap_autostarted()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                # something still running on this tree (a daemon a test started by other
                # means, slow to exit under load) wrote into it again: stop it, remove again
                self._reap_strays()
                shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def reap_home(home: Path) -> None:
        """SIGKILL every process (not this one) whose environment has HOME=``home``."""
        SpawnedDaemon._reap_env(f"HOME={home}".encode())

    def _reap_strays(self) -> None:
        """SIGKILL every process (not this one) whose environment has this tree's HOME."""
        self._reap_env(f"HOME={self.home}".encode())

    @staticmethod
    def _reap_env(marker: bytes) -> None:
        # a forked daemon's /proc environ is the fork server's: the server's registry knows it
        pids = forkserver.live_pids_with_home(marker.decode().split("=", 1)[1])
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(WaitTimeout):
                until(lambda p=pid: _gone_or_zombie(p), timeout=5, interval=0.01,
                      what=f"pid {pid} gone")

    def _reap_autostarted(self) -> None:
        """Stop a daemon that ``qwenctl`` auto-started on this scratch tree (a test that failed
        before its own ``qwenctl stop`` would otherwise leave it running)."""
        from qwenctxd.paths import pid_path

        try:
            pid = int(pid_path(self.socket).read_text().split()[0])
            with open(f"/proc/{pid}/environ", "rb") as f:
                ours = f"HOME={self.home}".encode() in f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            return
        if not ours or pid in _SPAWNED or (self.proc is not None and pid == self.proc.pid):
            return  # a daemon a SpawnedDaemon started (a restart on this tree) stops itself
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        with contextlib.suppress(WaitTimeout):  # a process stuck in the kernel: move on
            until(lambda: _gone_or_zombie(pid), timeout=5, interval=0.01, what=f"pid {pid} gone")

    def logged(self, event: str) -> bool:
        """Whether the daemon's JSON log has a line with this ``event``."""
        for line in self.log_text().splitlines():
            if event in line and line.startswith("{"):
                try:
                    if json.loads(line).get("event") == event:
                        return True
                except ValueError:
                    continue
        return False

    def requests(self) -> list[str]:
        """The methods of the requests the daemon's JSON log records as answered, in order
        (a line is written when a request's reply is ready)."""
        found = []
        for line in self.log_text().splitlines():
            if '"request"' in line and line.startswith("{"):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") == "request" and isinstance(entry.get("method"), str):
                    found.append(entry["method"])
        return found

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def remove_leftover_roots() -> None:
    """Remove the scratch trees SpawnedDaemons of this process made that are still on disk
    (after stopping whatever still runs with their HOME); the end of a test session calls it."""
    for root in list(CREATED_ROOTS):
        if root.exists():
            SpawnedDaemon.reap_home(root / "home")
            shutil.rmtree(root, ignore_errors=True)
