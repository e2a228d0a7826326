"""Lifecycle through real processes: permissions, peer uid, single instance, kill -9,
socket activation, sd_notify, signals and drain."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from qwenctxd.testing.spawn import SpawnedDaemon, wait_until


def test_socket_and_dir_permissions(daemon: SpawnedDaemon) -> None:
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.socket.parent).st_mode) == 0o700
    pid_file = daemon.socket.parent / "qwenctxd.pid"
    assert int(pid_file.read_text()) == daemon.proc.pid


def test_refuses_socket_dir_owned_by_another_user(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    sock_dir = d.socket.parent
    sock_dir.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(sock_dir, nobody.pw_uid, nobody.pw_gid)
    d.start(wait=False)
    assert d.wait_exit() == 2
    assert "owned by uid" in d.log_text()


def _connect_as_nobody(path: str) -> bytes | str:
    """Fork a child that drops to nobody, connects, sends a ping and reports what came back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            nobody = pwd.getpwnam("nobody")
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(3)
                s.connect(path)
                data = b""
                try:  # the daemon may close before the request is even written
                    s.sendall(b'{"jsonrpc":"2.0","method":"daemon.ping","id":1}\n')
                    while chunk := s.recv(4096):
                        data += chunk
                except (TimeoutError, ConnectionResetError, BrokenPipeError):
                    pass
            os.write(w, b"REPLY:" + data)
        except OSError as exc:
            os.write(w, f"ERROR:{exc.errno}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_peer_of_another_uid_gets_no_reply(daemon: SpawnedDaemon) -> None:
    # With the 0700 directory in place the other user cannot even reach the socket...
    out = _connect_as_nobody(str(daemon.socket))
    assert out.startswith(b"ERROR:")
    # ...and with the directory opened up, SO_PEERCRED still turns it away without a reply.
    os.chmod(daemon.root, 0o755)
    os.chmod(daemon.runtime, 0o755)
    os.chmod(daemon.socket.parent, 0o755)
    os.chmod(daemon.socket, 0o666)
    out = _connect_as_nobody(str(daemon.socket))
    assert out == b"REPLY:"
    assert "refused peer of another uid" in daemon.log_text()
    assert daemon.call("daemon.ping") == "pong"


def test_second_daemon_names_the_first_pid(daemon: SpawnedDaemon, spawn) -> None:  # type: ignore[no-untyped-def]
    second = spawn(root=daemon.root)
    second.log_path = daemon.root / "second.log"
    second.start(wait=False)
    assert second.wait_exit() == 1
    assert f"pid {daemon.proc.pid}" in second.log_text()
    assert daemon.call("daemon.ping") == "pong"


def test_restart_after_kill_9(daemon: SpawnedDaemon, spawn) -> None:  # type: ignore[no-untyped-def]
    old_pid = daemon.proc.pid
    daemon.kill9()
    assert daemon.socket.exists()  # stale socket and pid file left behind
    again = spawn(root=daemon.root)
    again.log_path = daemon.root / "again.log"
    again.start()
    status = again.call("daemon.status")
    assert status["pid"] != old_pid and status["pid"] == again.proc.pid
    assert "removed stale socket" in again.log_text()


def test_socket_activation_and_ready_notification(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    d.socket.parent.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(d.socket))
    listener.listen(16)
    notify_path = d.root / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(15)
    fd = listener.fileno()
    # A tiny exec wrapper plays systemd: it moves the listener to fd 3, sets LISTEN_PID to its
    # own pid (exec keeps the pid) and execs the daemon.
    wrapper = (
        "import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); os.set_inheritable(3, True);"
        "fd != 3 and os.close(fd); os.environ.update(LISTEN_PID=str(os.getpid()),"
        " LISTEN_FDS='1', LISTEN_FDNAMES='control');"
        "os.execv(sys.executable, [sys.executable, '-m', 'qwenctxd', '--log-format', 'json'])"
    )
    env = {**d.env, "NOTIFY_SOCKET": str(notify_path)}
    log = open(d.log_path, "ab")
    proc = subprocess.Popen([sys.executable, "-c", wrapper, str(fd)], env=env, pass_fds=(fd,),
                            stdout=log, stderr=log)
    d.proc = proc
    try:
        listener.close()  # the daemon owns it now
        ready = b""
        while b"READY=1" not in ready:
            ready = notify.recv(4096)
        # READY=1 means the socket accepts: the very first connection must be answered.
        with d.client(timeout=5) as c:
            st = c.call("daemon.status")
        assert st["activated"] is True and st["pid"] == proc.pid
        assert b"MAINPID=%d" % proc.pid in ready
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0
        seen: list[bytes] = []
        notify.settimeout(2)
        try:
            while True:
                seen.append(notify.recv(4096))
        except TimeoutError:
            pass
        assert any(b"STOPPING=1" in m for m in seen), seen
        assert any(m.startswith(b"STATUS=") for m in seen)
        # an adopted socket is never unlinked: systemd owns it
        assert d.socket.exists()
    finally:
        notify.close()
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_drains_background_work_then_exits_0(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    d.call("debug.sleep_task", {"seconds": 1.0, "kind": "extract"})
    status = d.call("daemon.status")
    assert "extract" in [t["kind"] for t in status["background"]["in_flight"]]
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait_exit() == 0
    assert time.monotonic() - t0 >= 0.5  # it waited for the job
    lines = [json.loads(x) for x in d.log_text().splitlines() if x.startswith("{")]
    assert any(x.get("event") == "shutting down" for x in lines)
    assert not d.socket.exists() and not (d.socket.parent / "qwenctxd.pid").exists()


def test_second_signal_exits_immediately(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    d.call("debug.sleep_task", {"seconds": 30})
    d.signal(signal.SIGINT)
    wait_until(lambda: d.logged("shutting down"), what="the first signal to be handled")
    t0 = time.monotonic()
    d.signal(signal.SIGINT)
    assert d.wait_exit(10) != 0
    assert time.monotonic() - t0 < 5


def test_drain_waits_and_reports_pending(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    release = d.root / "release-the-short-job"  # the short job lands when the test says so
    d.call("debug.sleep_task", {"seconds": 30, "until_exists": str(release)})
    d.call("debug.sleep_task", {"seconds": 30})
    assert d.call("daemon.drain", {"timeout_s": 0.2}) == {"drained": False, "pending": 2}
    release.touch()
    wait_until(lambda: len(d.call("daemon.status")["background"]["in_flight"]) == 1,
               what="the short job to finish")
    assert d.call("daemon.drain", {"timeout_s": 0.2}) == {"drained": False, "pending": 1}
    # shutdown with a short drain deadline cancels what is left and still exits 0
    assert d.call("daemon.shutdown", {"drain": True, "timeout_s": 0.3}) == {"ok": True}
    assert d.wait_exit() == 0


def test_keyed_jobs_coalesce_one_running_one_queued(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    assert d.call("daemon.drain", {"timeout_s": 10})["drained"]  # start-up jobs landed
    done_before = d.call("daemon.status")["background"]["completed"]
    for _ in range(5):
        d.call("debug.sleep_task", {"seconds": 0.3, "kind": "extract", "key": "proj-a"})
    st = d.call("daemon.status")["background"]
    assert len(st["in_flight"]) == 1 and st["queued"] == 1
    assert d.call("daemon.drain", {"timeout_s": 5}) == {"drained": True, "pending": 0}
    st = d.call("daemon.status")["background"]
    assert st["completed"] - done_before == 2 and st["last_extract_at"] is not None


def test_busy_while_stopping(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    d.call("debug.sleep_task", {"seconds": 1.0})
    with d.client() as c:
        c.call("daemon.shutdown", {"drain": True, "timeout_s": 5})
        from qwenctxd.client import RemoteError

        with pytest.raises(RemoteError) as exc:
            c.call("debug.sleep_task", {"seconds": 1})
        assert exc.value.code == -32005
        assert c.call("daemon.status")["state"] == "draining"
    assert d.wait_exit() == 0


def test_an_agent_turns_calls_log_at_info_only_when_they_fail(daemon: SpawnedDaemon) -> None:
    """Every agent turn is a ``session.turn`` and a ``session.record_model``: logged at debug
    (a line each at info was a tenth of the daemon's work per proxied request), while a failed
    one, and every other method, is logged at info with its method and duration."""
    with daemon.client() as c:
        sid = c.call("session.open", {"cwd": str(daemon.home), "model": "m"})["session_id"]
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "hi"})
        c.call("session.record_model", {"session_id": sid,
                                        "message": {"role": "assistant", "content": "hello"}})
        with pytest.raises(Exception, match="must follow a turn"):
            c.call("session.record_model", {"session_id": sid,
                                            "message": {"role": "assistant", "content": "x"}})
        c.call("daemon.status")
    wait_until(lambda: "daemon.status" in daemon.requests(), timeout=10)
    answered = daemon.requests()
    assert "session.open" in answered
    assert "session.turn" not in answered
    assert answered.count("session.record_model") == 1  # the refused one only
