"""The fork server the harness starts daemons and qwenctl runs from: each child is a process of
its own (pid, environment, cwd, stdio, signals, exit code) with fresh module state, and it exits
as an interpreter does (atexit handlers run, so the daemon's last log lines arrive)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from qwenctxd.testing import forkserver
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon


def test_a_forked_daemon_is_a_process_of_its_own(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    assert isinstance(d.proc, forkserver.ForkedProcess)
    st = d.call("daemon.status")
    assert st["pid"] == d.proc.pid != os.getpid()
    assert os.readlink(f"/proc/{d.proc.pid}/cwd") == str(d.root)
    r = qwenctl(d, "socket", "--json")  # the socket path comes from the child's own env
    assert r.returncode == 0 and json.loads(r.stdout) == {"socket": str(d.socket)}
    d.kill9()
    assert d.proc.returncode == -signal.SIGKILL


def test_a_clean_exit_flushes_the_log_and_a_restart_starts_from_zero(spawn) -> None:  # type: ignore[no-untyped-def]
    first: SpawnedDaemon = spawn().start()
    for _ in range(20):
        first.call("daemon.ping")
    before = first.call("daemon.status")
    assert before["requests"] >= 21
    first.call("daemon.shutdown", {"drain": False})
    assert first.wait_exit() == 0
    assert first.logged("stopped")  # written by the log thread, flushed at exit
    second: SpawnedDaemon = spawn().start()
    after = second.call("daemon.status")
    assert after["pid"] != before["pid"]
    assert after["requests"] < 5 and after["counters"] == {}  # the zygote's state is pristine


def test_qwenctl_runs_capture_exit_codes_stdin_and_text(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    usage = qwenctl(d, "frobnicate")
    assert usage.returncode == 2 and "usage" in usage.stderr.lower()
    piped = qwenctl(d, "call", "daemon.ping", "-", input="{}")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout) == "pong"
    fresh = qwenctl(d, "socket", "--json", fresh=True)
    assert json.loads(fresh.stdout) == json.loads(qwenctl(d, "socket", "--json").stdout)


def test_a_timeout_kills_the_run(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    read_end, write_end = os.pipe()  # stdin that never ends: `call -` waits for its params
    try:
        forkserver.run("qwenctl", ["call", "daemon.ping", "-"], env=d.env, stdin=read_end,
                       timeout=0.5)
    except subprocess.TimeoutExpired as exc:
        assert exc.timeout == 0.5
    else:
        raise AssertionError("a run past its timeout was not stopped")
    finally:
        os.close(read_end)
        os.close(write_end)
