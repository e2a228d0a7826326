"""Resource bounds through the socket (protocol.md "Resource bounds"): batch cap, reply memory,
nesting, connection cap, idle connections, draining, and a log pipe that is full or gone."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import Client, ClientError, RemoteError
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def raw(d: SpawnedDaemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(d.socket))
    return s


def read_line(s: socket.socket, buf: bytearray) -> Any:
    while b"\n" not in buf:
        chunk = s.recv(1 << 20)
        assert chunk, "connection closed"
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def pings(n: int, method: str = "daemon.ping") -> bytes:
    return json.dumps([{"jsonrpc": "2.0", "method": method, "id": i} for i in range(n)]).encode()


def test_batch_cap(daemon: SpawnedDaemon) -> None:
    s, buf = raw(daemon), bytearray()
    s.sendall(pings(257) + b"\n")
    reply = read_line(s, buf)
    assert reply["error"]["code"] == -32600 and "256" in reply["error"]["message"]
    assert reply["error"]["data"] == {"limit": 256, "size": 257}
    s.sendall(pings(256) + b"\n")
    replies = read_line(s, buf)
    assert len(replies) == 256 and all(r["result"] == "pong" for r in replies)
    s.close()


def test_rss_stays_bounded_after_a_large_batch(daemon: SpawnedDaemon) -> None:
    rss0 = daemon.call("daemon.status")["rss_bytes"]
    s, buf = raw(daemon), bytearray()
    big = pings(4700, "rpc.discover")  # the ~231 KB frame that used to need 367 MB
    assert len(big) > 200_000
    s.sendall(big + b"\n")
    reply = read_line(s, buf)
    assert reply["error"]["code"] == -32600
    s.sendall(pings(256, "rpc.discover") + b"\n")  # the largest batch allowed
    replies = read_line(s, buf)
    assert len(replies) == 256 and all("methods" in r["result"] for r in replies)
    s.close()
    rss1 = daemon.call("daemon.status")["rss_bytes"]
    assert rss1 - rss0 < 150 * 1024 * 1024, (rss0, rss1)


def nested(depth: int) -> bytes:
    inner = "[" * depth + "]" * depth
    return (f'{{"jsonrpc":"2.0","method":"daemon.ping","id":1,"params":{{"x":{inner}}}}}'
            .encode())


def test_nesting_too_deep_keeps_the_connection(daemon: SpawnedDaemon) -> None:
    s, buf = raw(daemon), bytearray()
    for depth in (300, 1000, 100_000):
        s.sendall(nested(depth) + b"\n")
        reply = read_line(s, buf)
        assert reply["error"]["code"] == -32700, reply
        assert "nesting too deep" in reply["error"]["message"]
    s.sendall(nested(255) + b"\n")  # 256 levels with the params object: allowed
    reply = read_line(s, buf)
    assert reply["error"]["code"] == -32602  # reaches the method (ping takes no params)
    s.sendall(nested(256) + b"\n")  # 257 levels
    assert read_line(s, buf)["error"]["code"] == -32700
    s.sendall(b'{"jsonrpc":"2.0","method":"daemon.ping","id":9}\n')
    assert read_line(s, buf) == {"jsonrpc": "2.0", "result": "pong", "id": 9}
    s.close()
    levels = [json.loads(line).get("level") for line in daemon.log_text().splitlines()
              if line.startswith("{")]
    assert "error" not in levels


def test_past_max_connections_busy_and_closed(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    cfg = d.home / ".config" / "qwenctxd"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text("[daemon]\nmax_connections = 4\n")
    d.start()
    held = [d.client()]
    until(lambda: held[0].call("daemon.status")["connections"] == 1,
          what="the start-up probes' connections to close")
    held += [d.client() for _ in range(3)]
    for c in held:
        assert c.call("daemon.ping") == "pong"  # active clients: not evictable
    s, buf = raw(d), bytearray()
    reply = read_line(s, buf)
    assert reply["error"]["code"] == -32005 and reply["error"]["data"] == {"limit": 4}
    assert s.recv(100) == b""  # closed
    s.close()
    held.pop().close()
    # a slot frees once the daemon has seen the close
    assert until(lambda: d.call("daemon.ping"), ignoring=(RemoteError, OSError, ClientError),
                 what="a free connection slot") == "pong"
    for c in held:
        c.close()


def test_idle_connections_do_not_lock_out_a_client(daemon: SpawnedDaemon) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 1300
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    idle = []
    try:
        for _ in range(1100):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(daemon.socket))
            idle.append(s)
        t0 = time.monotonic()
        with Client(daemon.socket, timeout=10) as c:
            assert c.call("daemon.ping") == "pong"
            st = c.call("daemon.status")
        assert time.monotonic() - t0 < 5
        assert st["connections"] <= 1024
    finally:
        for s in idle:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_first_frame_deadline_closes_a_silent_connection(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    cfg = d.home / ".config" / "qwenctxd"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text("[daemon]\nfirst_frame_timeout_s = 0.5\n")
    d.start()
    s = raw(d)
    t0 = time.monotonic()
    assert s.recv(100) == b""  # closed by the daemon, without a reply
    assert 0.3 < time.monotonic() - t0 < 10
    s.close()


def test_drain_status_on_a_new_connection(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    release = d.root / "release-the-job"  # it lands when the test has seen the drain
    d.call("debug.sleep_task", {"seconds": 30, "until_exists": str(release)})
    d.call("daemon.shutdown", {"drain": True, "timeout_s": 10})
    with d.client() as c:  # a connection made after draining began
        st = c.call("daemon.status")
        assert st["state"] == "draining"
        with pytest.raises(RemoteError) as exc:
            c.call("session.list")
        assert exc.value.code == -32005
    release.touch()
    assert d.wait_exit(20) == 0
    assert "shutdown: draining" in d.log_text()


def _popen(d: SpawnedDaemon, *args: str, stderr: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "qwenctxd", "--log-format", "json", *args],
                            env=d.env, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)


def _wait_ready(d: SpawnedDaemon, proc: subprocess.Popen[bytes]) -> None:
    d.proc = proc
    d.wait_ready(20)


def test_dead_log_pipe_then_sigterm_exits_promptly(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    r, w = os.pipe()
    proc = _popen(d, "--log-level", "debug", stderr=w)
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        for _ in range(3):  # like `| head -3`
            reader.readline()
    _wait_ready(d, proc)  # the reader is gone now
    for _ in range(50):
        assert d.call("daemon.ping") == "pong"
    st = d.call("daemon.status")
    assert st["log"]["dropped"] > 0 and st["log"]["sink"] == "dead"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert time.monotonic() - t0 < 10


def test_unread_log_pipe_under_debug_keeps_answering(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    r, w = os.pipe()  # nobody ever reads r: the pipe fills at ~64 KiB
    proc = _popen(d, "--log-level", "debug", stderr=w)
    os.close(w)
    try:
        _wait_ready(d, proc)
        with d.client(timeout=10) as c:
            for _ in range(6000):  # ~150 bytes of debug log each: far past the pipe
                assert c.call("daemon.ping") == "pong"
            st = c.call("daemon.status")
        assert st["log"]["sink"] == "pipe" and st["log"]["dropped"] > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        os.close(r)


def test_closed_stderr_at_startup(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, runpy; os.close(2); os.close(1);"
         "sys.argv=['qwenctxd','--log-format','json']; runpy.run_module('qwenctxd',"
         " run_name='__main__')"],
        env=d.env, stdin=subprocess.DEVNULL)
    _wait_ready(d, proc)
    assert d.call("daemon.ping") == "pong"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_socket_activation_without_xdg_runtime_dir(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    bound = Path(f"/tmp/qcd-act-{os.getpid()}.sock")
    lock_dir = d.root / "not-yet"  # the pid lock's directory does not exist yet
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(bound))
    listener.listen(16)
    fd = listener.fileno()
    wrapper = (
        "import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); os.set_inheritable(3, True);"
        "fd != 3 and os.close(fd); os.environ.update(LISTEN_PID=str(os.getpid()),"
        " LISTEN_FDS='1');"
        "os.execv(sys.executable, [sys.executable, '-m', 'qwenctxd', '--log-format', 'json',"
        f" '--socket', {str(lock_dir / 'qwenctxd.sock')!r}])"
    )
    env = {k: v for k, v in d.env.items() if k != "XDG_RUNTIME_DIR"}
    log = open(d.log_path, "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-c", wrapper, str(fd)], env=env, pass_fds=(fd,),
                            stdout=log, stderr=log)
    try:
        listener.close()

        def status() -> Any:
            assert proc.poll() is None, d.log_text()
            with Client(bound, timeout=2) as c:
                return c.call("daemon.status")

        st = until(status, timeout=30, ignoring=(OSError, ClientError),
                   what="the socket-activated daemon to answer")
        assert st["activated"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert "Traceback" not in d.log_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        bound.unlink(missing_ok=True)


def test_qwenctl_stop_shows_drain_progress(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    release = d.root / "release-the-job"  # it lands once qwenctl has shown it pending

    def status_seen_while_draining() -> bool:
        answered = d.requests()
        return "daemon.shutdown" in answered and "daemon.status" in answered[
            answered.index("daemon.shutdown"):]

    d.call("debug.sleep_task", {"seconds": 30, "until_exists": str(release)})
    with ThreadPoolExecutor(1) as pool:
        stop = pool.submit(qwenctl, d, "stop", timeout=60)
        until(lambda: status_seen_while_draining() or stop.done(),
              what="qwenctl stop to be told the daemon is draining")
        release.touch()
        r = stop.result(90)
    assert r.returncode == 0, r.stderr
    assert "stopping: draining, 1 background job(s) pending" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith(f"qwenctxd (pid {d.proc.pid}) stopped")
    assert d.proc.poll() is not None
