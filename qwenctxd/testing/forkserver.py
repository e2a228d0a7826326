"""A pre-imported fork server for the test suite: daemons and ``qwenctl`` runs without paying
the interpreter start-up and imports (~0.9 s of CPU per daemon, ~0.2 s per ``qwenctl``) each time.

One *zygote* process per test process (started on first use, by exec, so it holds none of the
test process's threads) imports the daemon, the model client and ``qwenctl`` once and then waits
for requests on a ``SOCK_SEQPACKET`` socket pair. Each request is forked from it into a fresh
child that gets the request's environment (all of it: ``os.environ`` is replaced), working
directory, argv and stdin/stdout/stderr (passed as file descriptors), and then runs
``qwenctxd.__main__.main`` or ``qwenctl.cli.main`` as ``python -m ...`` would. The child is a real
process: its own pid, signals, ``kill -9``, exit code, environment, structlog configuration and
module state (forked from a zygote that never ran any of it), so nothing leaks between daemons.

The zygote reaps its children and writes each one's exit code (as :class:`subprocess.Popen`
reports it: negative for a signal) to a per-child status pipe; :class:`ForkedProcess` is the
test-side handle with the part of the ``Popen`` interface the harness uses. What needs a fresh
interpreter (``pass_fds``, a ``preexec_fn``, a wrapper command, start-up time) keeps
``subprocess``; :class:`~qwenctxd.testing.spawn.SpawnedDaemon` decides. Forking is opt-in
(:func:`enable`, called by the test suite's conftest): benchmarks keep real start-ups.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from typing import Any, NoReturn

#: what a request may run in the child, and the entry point each name stands for
KINDS = ("qwenctxd", "qwenctl")
_MAX_MSG = 1 << 20
#: the environment the test process started with (a test may point HOME elsewhere later; the
#: zygote must not look like one of that test's processes to the harness's reaping by HOME)
_STARTING_ENV = dict(os.environ)


# -- the zygote (its own process) --------------------------------------------------------------
def _preload() -> None:
    """Import what the children run so that each fork starts warm: every module of the daemon
    and of ``qwenctl`` (many are imported lazily, on the first request that needs them), the
    asyncio backend of anyio, uvloop and the model client's ``openai``."""
    import importlib
    import pkgutil

    import qwenctl

    import qwenctxd

    names = ["anyio._backends._asyncio", "anyio.streams.memory", "anyio.streams.stapled",
             "anyio.streams.tls", "uvloop", "openai"]
    for package in (qwenctxd, qwenctl):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not info.name.startswith(("qwenctxd.testing", "qwenctl.__main__")):
                names.append(info.name)
    for name in names:
        with contextlib.suppress(Exception):  # an optional extra that is not installed
            importlib.import_module(name)
    # what the imports made is permanent: the children's collections need not scan it again
    gc.collect()
    gc.freeze()


def _child(request: dict[str, Any], fds: list[int], control: socket.socket,
           close: list[int]) -> NoReturn:
    """In the forked child: become the requested program, then exit as an interpreter does
    (:func:`_exit_like_python`)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control.close()
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    if sys.path and sys.path[0] == "":  # as ``python -m`` run in that directory has it
        sys.path[0] = request["cwd"]
    os.environ.clear()
    os.environ.update(request["env"])
    args = list(request["argv"])
    sys.argv = [request["kind"], *args]
    try:
        if request["kind"] == "qwenctxd":
            from qwenctxd.__main__ import main
        else:
            from qwenctl.cli import main
        code: Any = main(args)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - what an uncaught exception does to ``python -m``
        traceback.print_exc()
        code = 1
    _exit_like_python(code)


def _exit_like_python(code: Any) -> NoReturn:
    """The observable part of an interpreter's exit with ``sys.exit(code)``: non-daemon threads
    joined, ``atexit`` handlers run (the daemon's log writer flushes its queue there), stdio
    flushed, the code mapped as ``SystemExit`` maps it. The teardown of every module a full
    interpreter does after that (~0.2 s for the zygote's imports) is skipped."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"{code}\n")
        status = 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status & 0xFF)


def serve(control_fd: int) -> None:
    """The zygote's loop: fork one child per request, report each child's exit code."""
    _preload()
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status_pipes: dict[int, int] = {}  # child pid -> write end of its status pipe
    while True:
        ready, _, _ = select.select([control, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                os.read(wake_r, 4096)
            _reap(status_pipes)
        if control in ready:
            try:
                data, fds, _flags, _addr = socket.recv_fds(control, _MAX_MSG, 8)
            except InterruptedError:
                continue
            if not data:
                return  # the test process went away: so do we (children live on)
            request = json.loads(data)
            status_w = fds[3]
            pid = os.fork()
            if pid == 0:
                _child(request, fds, control, [wake_r, wake_w, *status_pipes.values()])
            for fd in fds:
                if fd != status_w:
                    os.close(fd)
            status_pipes[pid] = status_w
            control.send(json.dumps({"pid": pid}).encode())
            _reap(status_pipes)


def _reap(status_pipes: dict[int, int]) -> None:
    while status_pipes:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_pipes.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())
            os.close(fd)


# -- the test side -----------------------------------------------------------------------------
class ForkedProcess:
    """A child of the zygote: the ``Popen`` subset the harness uses (``pid``, ``returncode``,
    ``poll``, ``wait``, ``send_signal``, ``kill``, ``terminate``)."""

    def __init__(self, args: list[str], pid: int, status_fd: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd = status_fd

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._status_fd], [], [], timeout)
        if not ready:
            return None
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(self._status_fd, 64)
            if not chunk:
                break
            data += chunk
        os.close(self._status_fd)
        self.returncode = int(data) if data.strip() else -int(signal.SIGKILL)
        return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __del__(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                os.close(self._status_fd)


class Zygote:
    """The test process's end of one zygote (started on first use; see :func:`zygote`)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = ours
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             f"from qwenctxd.testing.forkserver import serve; serve({theirs.fileno()})"],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env={**_STARTING_ENV, "PYTHONUNBUFFERED": "1"},
        )
        theirs.close()

    def start(self, kind: str, argv: list[str], *, env: dict[str, str], cwd: str,
              stdin: int, stdout: int, stderr: int) -> ForkedProcess:
        """Fork ``kind`` (one of :data:`KINDS`) with these argv, environment, directory and
        standard streams (file descriptors; the caller keeps and closes its own)."""
        assert kind in KINDS, kind
        status_r, status_w = os.pipe()
        request = json.dumps({"kind": kind, "argv": argv, "env": env, "cwd": cwd}).encode()
        try:
            with self._lock:
                socket.send_fds(self._control, [request], [stdin, stdout, stderr, status_w])
                reply = self._control.recv(4096)
        finally:
            os.close(status_w)
        if not reply:
            os.close(status_r)
            raise RuntimeError(f"the fork server exited ({self.proc.poll()})")
        return ForkedProcess([kind, *argv], json.loads(reply)["pid"], status_r)

    def close(self) -> None:
        self._control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


#: forked daemons by the HOME they were given (their /proc environ is the zygote's, so the
#: harness's reaping by HOME asks here): weak, a collected handle's daemon was stopped
_BY_HOME: list[tuple[weakref.ref[ForkedProcess], str]] = []


def register(proc: ForkedProcess, home: os.PathLike[str] | str) -> None:
    """Remember that ``proc`` runs with ``HOME=home`` (see :func:`live_pids_with_home`)."""
    _BY_HOME[:] = [(ref, h) for ref, h in _BY_HOME if (p := ref()) and p.poll() is None]
    _BY_HOME.append((weakref.ref(proc), os.fspath(home)))


def live_pids_with_home(home: str) -> list[int]:
    """Pids of registered forked processes still running with ``HOME=home``."""
    return [p.pid for ref, h in _BY_HOME if h == home and (p := ref()) and p.poll() is None]


_ZYGOTE: Zygote | None = None
_ZYGOTE_PID = 0  # the process that started _ZYGOTE (a forked test helper must start its own)


_ENABLED = False


def enable() -> None:
    """Let the harness fork from the zygote (tests/conftest.py does; benchmarks, which measure
    real start-ups and a real daemon's memory, do not)."""
    global _ENABLED
    _ENABLED = True


def enabled() -> bool:
    """Whether :func:`enable` was called and ``QWENCTXD_TEST_FORKSERVER=0`` is not set (that
    makes every run a fresh interpreter again)."""
    return _ENABLED and os.environ.get("QWENCTXD_TEST_FORKSERVER", "1") != "0"


def zygote() -> Zygote:
    """This process's zygote, started on first use."""
    global _ZYGOTE, _ZYGOTE_PID
    if _ZYGOTE is None or _ZYGOTE_PID != os.getpid() or _ZYGOTE.proc.poll() is not None:
        _ZYGOTE, _ZYGOTE_PID = Zygote(), os.getpid()
    return _ZYGOTE


def shutdown() -> None:
    """Stop this process's zygote (the end of a test session); children it forked live on."""
    global _ZYGOTE
    if _ZYGOTE is not None and _ZYGOTE_PID == os.getpid():
        _ZYGOTE.close()
    _ZYGOTE = None


def run(kind: str, argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike[str] | None
        = None, input: bytes | None = None, stdin: int | None = subprocess.DEVNULL,
        timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
    """Like ``subprocess.run([python, -m, kind, *argv], capture_output=True)`` through the
    zygote: stdout and stderr captured as bytes, ``input`` fed on stdin (else ``stdin``: a file
    descriptor, ``subprocess.DEVNULL``, or None for this process's own stdin)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r = in_w = None
    if input is not None:
        in_r, in_w = os.pipe()
        child_stdin = in_r
    elif stdin == subprocess.DEVNULL:
        child_stdin = in_r = os.open(os.devnull, os.O_RDONLY)
    elif stdin is None:
        child_stdin = 0
    else:
        child_stdin = stdin
    try:
        proc = zygote().start(kind, argv, env=env, cwd=os.fspath(cwd or os.getcwd()),
                              stdin=child_stdin, stdout=out_w, stderr=err_w)
    finally:
        for fd in (out_w, err_w, in_r):
            if fd is not None:
                os.close(fd)
    stdout, stderr = _communicate(proc, out_r, err_r, in_w, input, timeout)
    return subprocess.CompletedProcess([kind, *argv], proc.returncode or 0, stdout, stderr)


def _communicate(proc: ForkedProcess, out_r: int, err_r: int, in_w: int | None,
                 data: bytes | None, timeout: float | None) -> tuple[bytes, bytes]:
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    readers = [out_r, err_r]
    writers = [in_w] if in_w is not None else []
    pending = memoryview(data or b"")
    try:
        while readers or writers:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                proc.kill()
                proc.wait(10)
                raise subprocess.TimeoutExpired(proc.args, timeout)  # type: ignore[arg-type]
            r, w, _ = select.select(readers, writers, [], left)
            for fd in r:
                chunk = os.read(fd, 65536)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    readers.remove(fd)
            for fd in w:
                try:
                    pending = pending[os.write(fd, pending[:65536]):]
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    writers.remove(fd)
                    os.close(fd)
                    in_w = None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            proc.wait(left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
    finally:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])
