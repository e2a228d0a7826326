"""The wire contract through a spawned daemon: framings, batches, notifications, bad input."""

from __future__ import annotations

import json
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.client import Client, RemoteError
from qwenctxd.protocol.framing import Framing
from qwenctxd.testing.spawn import SpawnedDaemon, wait_until


def raw_exchange(path, payload: bytes, *, read_timeout: float = 5.0) -> bytes:
    """Send raw bytes, half-close, read everything until the daemon closes or goes quiet."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(read_timeout)
        s.connect(str(path))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def ndjson_replies(data: bytes) -> list:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def assert_ping_ok(d: SpawnedDaemon) -> None:
    assert d.call("daemon.ping") == "pong"


@pytest.mark.parametrize("framing", [Framing.NDJSON, Framing.LSP])
def test_core_methods_over_both_framings(daemon: SpawnedDaemon, framing: Framing) -> None:
    with Client(daemon.socket, framing=framing) as c:
        assert c.call("daemon.ping") == "pong"
        hello = c.call("daemon.hello", {"client": {"name": "test", "version": "1"}, "protocol": 1})
        assert hello["protocol"] == 1 and hello["pid"] == daemon.proc.pid
        assert "daemon.status" in hello["capabilities"]
        assert c.call("daemon.drain", {"timeout_s": 10}) == {"drained": True, "pending": 0}
        status = c.call("daemon.status")
        assert status["pid"] == daemon.proc.pid
        assert status["socket"] == str(daemon.socket)
        bg = status["background"]
        assert (bg["in_flight"], bg["queued"], bg["failed"]) == ([], 0, 0)
        assert {"last_extract_at", "last_dream_at", "completed", "cancelled"} <= set(bg)
        assert status["rss_bytes"] > 1_000_000
        assert c.call("daemon.drain", {"timeout_s": 1}) == {"drained": True, "pending": 0}
        assert c.call("daemon.shutdown") == {"ok": True}
    assert daemon.wait_exit() == 0
    assert not daemon.socket.exists()


def test_lsp_framing_with_content_type_header(daemon: SpawnedDaemon) -> None:
    body = b'{"jsonrpc":"2.0","method":"daemon.ping","id":7}'
    frame = (b"Content-Length: %d\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8"
             b"\r\n\r\n" % len(body)) + body
    out = raw_exchange(daemon.socket, frame)
    header, _, reply = out.partition(b"\r\n\r\n")
    assert header.lower().startswith(b"content-length:")
    assert json.loads(reply) == {"jsonrpc": "2.0", "result": "pong", "id": 7}


def test_batch_of_three_and_notifications(daemon: SpawnedDaemon) -> None:
    with daemon.client() as c:
        results = c.batch([("daemon.ping", None), ("daemon.status", None), ("nope.x", None)])
        assert results[0] == "pong"
        assert results[1]["pid"] == daemon.proc.pid
        assert isinstance(results[2], RemoteError) and results[2].code == -32601
    # A lone notification and a batch of notifications get nothing back; a request after
    # them on the same connection is still answered.
    payload = (
        b'{"jsonrpc":"2.0","method":"daemon.ping"}\n'
        b'[{"jsonrpc":"2.0","method":"daemon.ping"},{"jsonrpc":"2.0","method":"daemon.ping"}]\n'
        b'{"jsonrpc":"2.0","method":"daemon.ping","id":"last"}\n'
    )
    assert ndjson_replies(raw_exchange(daemon.socket, payload)) == [
        {"jsonrpc": "2.0", "result": "pong", "id": "last"}
    ]


def test_batch_members_fail_individually(daemon: SpawnedDaemon) -> None:
    payload = b'[{"jsonrpc":"2.0","method":"daemon.ping","id":1}, 5, {"jsonrpc":"1.0","id":2}]\n'
    replies = ndjson_replies(raw_exchange(daemon.socket, payload))[0]
    assert replies[0]["result"] == "pong"
    assert replies[1]["error"]["code"] == -32600 and replies[1]["id"] is None
    assert replies[2]["error"]["code"] == -32600
    empty = ndjson_replies(raw_exchange(daemon.socket, b"[]\n"))[0]
    assert empty["error"]["code"] == -32600


def test_invalid_json_then_ping(daemon: SpawnedDaemon) -> None:
    reply = ndjson_replies(raw_exchange(daemon.socket, b'{"jsonrpc": "2.0", "method": \n'))[0]
    assert reply["error"]["code"] == -32700 and reply["id"] is None
    assert_ping_ok(daemon)


def test_unknown_method_then_ping(daemon: SpawnedDaemon) -> None:
    with daemon.client() as c, pytest.raises(RemoteError) as exc:
        c.call("daemon.nonexistent")
    assert exc.value.code == -32601
    assert_ping_ok(daemon)


def test_wrong_param_type_names_the_field(daemon: SpawnedDaemon) -> None:
    with daemon.client() as c:
        with pytest.raises(RemoteError) as exc:
            c.call("daemon.drain", {"timeout_s": "soon"})
        assert exc.value.code == -32602
        assert exc.value.data["field"] == "timeout_s"
        with pytest.raises(RemoteError) as exc:
            c.call("daemon.hello", {"client": {"name": 5}})
        assert exc.value.data["field"] == "client.name"
        with pytest.raises(RemoteError) as exc:
            c.call("daemon.drain", {"timeuot_s": 1})
        assert exc.value.data["field"] == "timeuot_s"
        with pytest.raises(RemoteError) as exc:
            c.call("daemon.drain", [1])
        assert exc.value.data["field"] == "params"
        # the same connection still works after errors
        assert c.call("daemon.ping") == "pong"
    assert_ping_ok(daemon)


def test_unknown_framing_gets_parse_error_and_close(daemon: SpawnedDaemon) -> None:
    reply = ndjson_replies(raw_exchange(daemon.socket, b"GET / HTTP/1.1\r\n\r\n"))
    assert reply[0]["error"]["code"] == -32700
    assert_ping_ok(daemon)


@pytest.mark.parametrize("framing", ["ndjson", "lsp"])
def test_oversized_frame_gets_error_and_close(daemon: SpawnedDaemon, framing: str) -> None:
    size = 17 * 1024 * 1024
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(str(daemon.socket))
        if framing == "lsp":
            s.sendall(b"Content-Length: %d\r\n\r\n" % size)
        else:
            s.sendall(b'{"jsonrpc":"2.0","method":"daemon.ping","params":{"x":"')
            chunk = b"a" * (1024 * 1024)
            try:
                for _ in range(17):
                    s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        data = b""
        try:
            while part := s.recv(65536):
                data += part
        except ConnectionResetError:
            pass
    body = data.partition(b"\r\n\r\n")[2] if framing == "lsp" else data
    reply = json.loads(body.splitlines()[0])
    assert reply["error"]["code"] == -32600
    assert "too large" in reply["error"]["message"].lower()
    assert_ping_ok(daemon)


def test_client_disconnecting_mid_request(daemon: SpawnedDaemon) -> None:
    for _ in range(20):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(daemon.socket))
            s.sendall(b'{"jsonrpc":"2.0","method":"daemon.drain","params":{"timeout_s":5},"id":1}\n'
                      b'{"jsonrpc":"2.0","method":"daemon.sta')
        # closed with one request in flight and one half-written
    wait_until(lambda: daemon.call("daemon.status")["connections"] == 1,
               what="the daemon to drop the closed connections")
    assert_ping_ok(daemon)
    assert daemon.call("daemon.status")["state"] == "serving"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(min_size=1, max_size=512))
def test_random_bytes_never_kill_the_daemon(daemon: SpawnedDaemon, payload: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(daemon.socket))
        try:
            s.sendall(payload + b"\n")
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
    assert daemon.proc.poll() is None


def test_daemon_alive_after_fuzzing(daemon: SpawnedDaemon) -> None:
    import random

    rng = random.Random(1234)
    for _ in range(50):
        raw_exchange(daemon.socket, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))),
                     read_timeout=1)
    assert_ping_ok(daemon)


def test_subscribe_receives_published_events(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    with d.client() as sub, d.client() as pub:
        assert sub.call("daemon.subscribe", {"topics": ["memory/changed"]}) == {"ok": True}
        pub.call("debug.publish", {"topic": "skills/changed", "params": {"n": 1}})
        pub.call("debug.publish", {"topic": "memory/changed", "params": {"n": 2}})
        # the subscriber sees the wanted notification before the reply to its next request
        assert sub.call("daemon.ping") == "pong"
        deadline = time.monotonic() + 2
        while not sub.notifications and time.monotonic() < deadline:
            sub.call("daemon.ping")
        assert sub.notifications == [
            {"jsonrpc": "2.0", "method": "memory/changed", "params": {"n": 2}}
        ]
        with pytest.raises(RemoteError) as exc:
            sub.call("daemon.subscribe", {"topics": ["nope"]})
        assert exc.value.code == -32602
