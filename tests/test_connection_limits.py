"""Bounds on one connection: limits.max_message_bytes, the idle deadline, eviction at the cap,
and qwenctl's wording of a daemon at its connection cap."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
from pathlib import Path

from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def _spawn(tmp_path: Path, toml: str) -> SpawnedDaemon:
    d = SpawnedDaemon(tmp_path / "d")
    cfg = d.home / ".config" / "qwenctxd"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(toml)
    return d.start()


def _line(s: socket.socket, buf: bytearray) -> dict:
    while b"\n" not in buf:
        part = s.recv(65536)
        assert part, "connection closed"
        buf += part
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def test_message_over_the_limit_is_invalid_params_and_the_connection_goes_on(tmp_path: Path) -> None:
    d = _spawn(tmp_path, "[limits]\nmax_message_bytes = 65536\n")
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(d.socket))
            buf = bytearray()
            big = b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping","params":{"x":"' + b"a" * 1_000_000 + b'"}}\n'
            s.sendall(big)
            reply = _line(s, buf)
            assert reply["error"]["code"] == -32602
            assert reply["error"]["data"]["field"] == "message"
            assert reply["error"]["data"]["limit"] == 65536
            s.sendall(b'{"jsonrpc":"2.0","id":2,"method":"daemon.ping"}\n')
            assert _line(s, buf) == {"jsonrpc": "2.0", "result": "pong", "id": 2}
            # LSP framing: the declared body is skipped
            with socket.socket(socket.AF_UNIX) as t:
                t.connect(str(d.socket))
                body = b'{"jsonrpc":"2.0","id":3,"method":"daemon.ping","params":{"x":"' + b"b" * 200_000 + b'"}}'
                t.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                ping = b'{"jsonrpc":"2.0","id":4,"method":"daemon.ping"}'
                t.sendall(b"Content-Length: %d\r\n\r\n" % len(ping) + ping)
                data = b""
                while data.count(b"Content-Length") < 2 or not data.rstrip().endswith(b"}"):
                    data += t.recv(65536)
                assert b"-32602" in data and b'"pong"' in data
        assert d.call("daemon.ping") == "pong"
    finally:
        d.cleanup()


def test_1100_held_connections_do_not_lock_out_a_new_client(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    d = _spawn(tmp_path, "[limits]\nidle_connection_s = 3\n")
    held: list[socket.socket] = []
    try:
        for i in range(1100):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(d.socket))
            if i % 2:
                s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n')
            held.append(s)
        # a new client is served: held ones past the grace are evicted, the rest time out
        assert until(lambda: d.call("daemon.ping"), timeout=30, ignoring=(Exception,),
                     what="a new client served") == "pong"
        # the idle deadline closes the pinged connections
        assert until(lambda: d.call("daemon.status")["connections"] <= 2, timeout=30,
                     what="idle connections closed")
    finally:
        for s in held:
            s.close()
        d.cleanup()


def test_qwenctl_says_the_daemon_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "busy.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(4)
    reply = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32005, "message": "Too many connections", "data": {"limit": 1}}}).encode() + b"\n"

    def serve() -> None:
        conn, _ = srv.accept()
        conn.sendall(reply)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN")}
    proc = subprocess.run([sys.executable, "-m", "qwenctl", "--socket", str(path), "--no-autostart", "status"],
                          capture_output=True, text=True, timeout=30, env=env)
    t.join(5)
    srv.close()
    assert "the daemon is busy (too many connections)" in proc.stderr, proc.stderr
    assert "unexpected reply" not in proc.stderr
