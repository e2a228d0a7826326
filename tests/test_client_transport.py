"""The client's transport seam and its error mirror, without a spawned daemon: a ``Client``
over one end of a ``socketpair`` (the other end played by the test), the shared JSON-RPC rules,
and the client error classes generated one per server code, grouped by kind."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import anyio
import msgspec
import pytest

from qwenctxd import client as qc
from qwenctxd.client import errors as cerrors
from qwenctxd.client.aio import AsyncClient
from qwenctxd.client.aio_transport import StreamTransport
from qwenctxd.client.transport import RpcProtocol, SocketTransport
from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import errors as perrors
from qwenctxd.protocol import methods
from qwenctxd.protocol.framing import FrameDecoder, Framing, encode


def serve(sock: socket.socket, answer, framing: Framing = Framing.NDJSON) -> threading.Thread:  # type: ignore[no-untyped-def]
    """Play a daemon on ``sock``: each request frame gets ``answer(request)`` frames back."""

    def run() -> None:
        dec = FrameDecoder(framing)
        with sock:
            while chunk := sock.recv(65536):
                dec.feed(chunk)
                while (frame := dec.next_frame()) is not None:
                    for reply in answer(msgspec.json.decode(frame)):
                        sock.sendall(encode(msgspec.json.encode(reply), framing))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_every_server_code_has_exactly_one_client_class() -> None:
    assert set(cerrors.REMOTE_ERRORS) == set(perrors.ERROR_CLASSES)
    classes = list(cerrors.REMOTE_ERRORS.values())
    assert len(set(classes)) == len(classes)
    for code, server_cls in perrors.ERROR_CLASSES.items():
        cls = cerrors.REMOTE_ERRORS[code]
        assert cls.__name__ == server_cls.__name__ and cls.code == code
        assert issubclass(cls, cerrors.RemoteError) and issubclass(cls, server_cls)
        assert getattr(cerrors, cls.__name__) is cls  # the module's name is the generated class
        assert getattr(qc, cls.__name__) is cls and cls.__name__ in qc.__all__


def test_error_family_grouped_by_kind() -> None:
    retry = {c.__name__ for c in cerrors.REMOTE_ERRORS.values() if issubclass(c, qc.RetryLater)}
    caller = {c.__name__ for c in cerrors.REMOTE_ERRORS.values() if issubclass(c, qc.CallerError)}
    assert retry == {"Busy", "LockHeld", "ModelUnavailable"}
    assert caller == {"InvalidParams", "MethodNotFound", "InvalidRequest", "ParseError",
                      "SessionNotFound", "PathOutsideProject", "SecretDetected",
                      "SystemPromptFileError"}
    assert not issubclass(qc.InternalError, qc.RetryLater | qc.CallerError)
    err = qc.RemoteError.from_wire({"code": perrors.SYSTEM_PROMPT_FILE_ERROR, "message": "m",
                                    "data": {"path": "/x/system.md", "reason": "empty"}})
    assert isinstance(err, qc.SystemPromptFileError) and isinstance(err, qc.CallerError)
    assert (err.path, err.reason, err.data["path"]) == ("/x/system.md", "empty", "/x/system.md")
    with pytest.raises(perrors.LockHeld):  # the server's class catches the client's
        raise qc.RemoteError.from_wire({"code": perrors.LOCK_HELD, "message": "held"})


def test_client_over_a_connected_socket_pair() -> None:
    client_end, daemon_end = socket.socketpair()

    def answer(req):  # type: ignore[no-untyped-def]
        if req["method"] == "daemon.ping":
            yield {"jsonrpc": "2.0", "method": "daemon.note", "params": {"n": 1}}
            yield {"jsonrpc": "2.0", "id": req["id"], "result": "pong"}
        else:
            yield {"jsonrpc": "2.0", "id": req["id"],
                   "error": {"code": perrors.BUSY, "message": "draining"}}

    serve(daemon_end, answer)
    with qc.Client(transport=SocketTransport.connected(client_end, timeout=5)) as c:
        assert c.request(methods.DAEMON_PING) == "pong"
        assert c.notifications == [{"jsonrpc": "2.0", "method": "daemon.note", "params": {"n": 1}}]
        with pytest.raises(qc.Busy) as exc:
            c.request(methods.DAEMON_STATUS, dwire.Empty())
        assert isinstance(exc.value, qc.RetryLater) and exc.value.message == "draining"


def test_connection_lost_when_the_peer_closes() -> None:
    client_end, daemon_end = socket.socketpair()
    daemon_end.close()
    with qc.Client(transport=SocketTransport.connected(client_end, timeout=5)) as c:
        with pytest.raises(qc.ConnectionLost):
            c.call(methods.DAEMON_PING)


def test_unreachable_by_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(qc.DaemonUnreachable, match="no socket file"):
        SocketTransport.connect(tmp_path / "none.sock")


def test_protocol_rules_without_io() -> None:
    rpc = RpcProtocol()
    ids, body = rpc.batch([("daemon.ping", None), ("session.list", {})])
    assert [m["id"] for m in msgspec.json.decode(body)] == ids == [1, 2]
    out = rpc.batch_outcomes(ids, [{"id": 2, "result": {"sessions": []}},
                                   {"id": 1, "error": {"code": -32601, "message": "nope"}}])
    assert isinstance(out[0], qc.MethodNotFound) and out[1] == {"sessions": []}
    assert rpc.refusal({"id": None, "error": {"code": perrors.BUSY, "message": "cap"}}) is not None
    assert rpc.refusal({"id": None, "error": {"code": -32600, "message": "x"}}) is None
    assert RpcProtocol.outcome({"result": {"pid": 3, "version": "1", "protocol": 1,
                                           "capabilities": []}}, dwire.HelloResult) \
        == msgspec.convert({"pid": 3, "version": "1", "protocol": 1, "capabilities": []},
                           dwire.HelloResult)


@pytest.mark.parametrize("framing", [Framing.NDJSON, Framing.LSP])
def test_async_client_over_a_connected_socket_pair(framing: Framing) -> None:
    client_end, daemon_end = socket.socketpair()

    def answer(req):  # type: ignore[no-untyped-def]
        yield {"jsonrpc": "2.0", "id": req["id"], "result": "pong"}

    serve(daemon_end, answer, framing)

    async def main() -> None:
        transport = await StreamTransport.connected(client_end, framing=framing)
        async with AsyncClient(transport=transport) as c:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(c.request, methods.DAEMON_PING)
                assert await c.request(methods.DAEMON_PING) == "pong"

    anyio.run(main)


def test_the_blocking_client_imports_no_anyio() -> None:
    """qwenctl starts fast: the sync client, its transport and the error mirror need no anyio."""
    code = ("import sys; from qwenctxd.client import Client, SocketTransport, RetryLater; "
            "print('anyio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_async_client_calls_fail_at_once_after_the_daemon_went_away() -> None:
    """A call on a connection the daemon closed raises ConnectionLost, both the one waiting when
    it went and one made after (a write to a closed socket fails only later, if ever: the call
    must not wait for a reply nobody will read)."""
    client_end, daemon_end = socket.socketpair()

    async def main() -> None:
        transport = await StreamTransport.connected(client_end)
        async with AsyncClient(transport=transport) as c:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    async def waiting() -> None:
                        with pytest.raises(qc.ConnectionLost):
                            await c.request(methods.DAEMON_PING)

                    tg.start_soon(waiting)
                    # the daemon's end reads the request (so the call is waiting), then goes
                    sent = await anyio.to_thread.run_sync(daemon_end.recv, 4096)
                    assert sent.startswith(b'{"jsonrpc"')
                    daemon_end.close()
                for _ in range(2):
                    with pytest.raises(qc.ConnectionLost):
                        await c.request(methods.DAEMON_PING)

    anyio.run(main)
