"""The client's transport seam: how frames reach the daemon, and the JSON-RPC rules written once.

Two layers, as httpx separates its transports from its clients:

* :class:`RpcProtocol` — the transport-free part every client shares: request ids, encoding a
  request or a batch, telling a notification from a reply, matching a reply to its id and
  mapping an ``error`` member to its :class:`~qwenctxd.client.errors.RemoteError` subclass.
  No I/O, so the blocking :class:`~qwenctxd.client.sync.Client` and the anyio
  :class:`~qwenctxd.client.aio.AsyncClient` are thin fronts over the same rules.
* a transport — moves whole frames: ``send(body)`` frames one JSON body with the connection's
  framing (:mod:`qwenctxd.protocol.framing`), ``receive()`` returns the next frame cut by the
  shared ``FrameDecoder``. :class:`SocketTransport` (here) is the blocking one over a Unix
  stream socket; :class:`qwenctxd.client.aio_transport.StreamTransport` the async one. Both
  turn OS errors into ``DaemonUnreachable`` (connecting) or ``ConnectionLost`` (later).

A transport is built from a socket path or from a socket that is already connected — a test
daemon running in-process can hand a client one end of ``socket.socketpair()``::

    from qwenctxd.client import Client
    from qwenctxd.client.transport import SocketTransport

    client_end, daemon_end = socket.socketpair()
    ...  # the in-process daemon serves daemon_end
    with Client(transport=SocketTransport.connected(client_end)) as c:
        c.request(methods.DAEMON_PING)

    # or by path: Client(transport=SocketTransport.connect(path, timeout=5.0)) == Client(path)

Any object with ``framing``, ``send(body)``, ``receive() -> frame`` and ``close()`` is a
transport (:class:`Transport`; the async one is ``aio_transport.AsyncTransport`` with
``aclose()``): an in-process transport that hands frames to a dispatcher directly plugs in the
same way, and the clients above it do not change.

Cheap to import (no anyio): qwenctl's start-up time depends on it.
"""

from __future__ import annotations

import itertools
import os
import socket
from typing import Any, Protocol, TypeVar

import msgspec

from qwenctxd.client.errors import ConnectionLost, DaemonUnreachable, RemoteError
from qwenctxd.protocol import errors as perrors
from qwenctxd.protocol.framing import FrameDecoder, Framing, FramingError, encode

T = TypeVar("T")
_encoder = msgspec.json.Encoder()
RECV_BYTES = 65536


def next_frame(decoder: FrameDecoder) -> bytes | None:
    """The decoder's next whole frame (None: it needs more bytes); ``ConnectionLost`` when
    what the daemon sent cannot be framed — the one rule both transports read by."""
    try:
        return decoder.next_frame()
    except FramingError as exc:
        raise ConnectionLost(f"bad frame from the daemon: {exc}") from None


def unreachable(path: str, exc: OSError) -> DaemonUnreachable:
    """The client error for an OS error met while connecting to ``path``."""
    if isinstance(exc, FileNotFoundError):
        return DaemonUnreachable(path, "no socket file")
    if isinstance(exc, ConnectionRefusedError):
        return DaemonUnreachable(path, "connection refused (stale socket?)")
    return DaemonUnreachable(path, exc.strerror or type(exc).__name__)


class Transport(Protocol):
    """A blocking frame transport (what :class:`~qwenctxd.client.sync.Client` drives)."""

    framing: Framing

    def send(self, body: bytes) -> None:
        """Frame ``body`` (one JSON text) and write it."""

    def receive(self) -> bytes:
        """The next whole frame from the daemon; ``ConnectionLost`` at its end."""

    def close(self) -> None:
        """Close the connection (idempotent)."""


class SocketTransport:
    """Frames over a connected blocking stream socket (a Unix socket, or a socketpair end)."""

    def __init__(self, sock: socket.socket, *, framing: Framing = Framing.NDJSON,
                 path: str = "") -> None:
        self.sock = sock
        self.framing = framing
        self.path = path
        self._decoder = FrameDecoder(framing)

    @classmethod
    def connect(cls, path: str | os.PathLike[str], *, framing: Framing = Framing.NDJSON,
                timeout: float | None = 30.0) -> SocketTransport:
        """Connect to the daemon's socket at ``path``; ``DaemonUnreachable`` when nobody
        answers there. ``timeout`` bounds every later read and write."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except OSError as exc:
            sock.close()
            raise unreachable(os.fspath(path), exc) from None
        return cls(sock, framing=framing, path=os.fspath(path))

    @classmethod
    def connected(cls, sock: socket.socket, *, framing: Framing = Framing.NDJSON,
                  timeout: float | None = 30.0) -> SocketTransport:
        """Wrap a socket that is already connected (``socket.socketpair()``, an accepted
        connection); the transport owns it from now on and closes it."""
        sock.settimeout(timeout)
        return cls(sock, framing=framing)

    def send(self, body: bytes) -> None:
        self.sock.sendall(encode(body, self.framing))

    def receive(self) -> bytes:
        dec = self._decoder
        while True:
            frame = next_frame(dec)
            if frame is not None:
                return frame
            chunk = self.sock.recv(RECV_BYTES)
            if not chunk:
                raise ConnectionLost("daemon closed the connection")
            dec.feed(chunk)

    def close(self) -> None:
        self.sock.close()


def is_notification(msg: Any) -> bool:
    """A server-to-client notification (a method and no id)."""
    return isinstance(msg, dict) and "method" in msg and "id" not in msg


class RpcProtocol:
    """JSON-RPC 2.0 for a client, without I/O: ids, request bodies, reply interpretation."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    @staticmethod
    def message(method: str, params: Any = None, rid: int | None = None) -> dict[str, Any]:
        """A request (with ``rid``) or a notification (without) as a JSON-RPC object."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if rid is not None:
            msg["id"] = rid
        if params is not None:
            msg["params"] = params
        return msg

    def request(self, method: str, params: Any = None) -> tuple[int, bytes]:
        """A fresh id and the encoded request for ``method``."""
        rid = self.next_id()
        return rid, _encoder.encode(self.message(method, params, rid))

    @staticmethod
    def notification(method: str, params: Any = None) -> bytes:
        return _encoder.encode(RpcProtocol.message(method, params))

    def batch(self, calls: list[tuple[str, Any]]) -> tuple[list[int], bytes]:
        """Ids and the encoded batch for ``[(method, params), ...]``."""
        ids = [self.next_id() for _ in calls]
        return ids, _encoder.encode([self.message(m, p, rid)
                                     for rid, (m, p) in zip(ids, calls, strict=True)])

    @staticmethod
    def decode(frame: bytes) -> Any:
        return msgspec.json.decode(frame)

    @staticmethod
    def refusal(msg: Any) -> RemoteError | None:
        """The -32005 of a reply without id — a daemon at its connection cap refuses so
        before it reads the request — or None when ``msg`` is something else."""
        if (isinstance(msg, dict) and msg.get("id") is None and "method" not in msg
                and isinstance(msg.get("error"), dict)
                and msg["error"].get("code") == perrors.BUSY):
            return RemoteError.from_wire(msg["error"])
        return None

    @staticmethod
    def outcome(reply: dict[str, Any], type: type[T] | None = None) -> Any:
        """The result of ``reply`` (converted to ``type`` when given), or its error raised."""
        if "error" in reply:
            raise RemoteError.from_wire(reply["error"])
        result = reply.get("result")
        return msgspec.convert(result, type) if type is not None else result

    @staticmethod
    def batch_outcomes(ids: list[int], replies: Any) -> list[Any]:
        """Per request id (in order): its result, or its RemoteError instance."""
        if isinstance(replies, dict):  # a whole-batch error
            raise RemoteError.from_wire(replies.get("error", {}))
        by_id = {r.get("id"): r for r in replies}
        missing = {"error": {"code": perrors.INTERNAL_ERROR, "message": "no reply"}}
        out: list[Any] = []
        for rid in ids:
            r = by_id.get(rid, missing)
            out.append(RemoteError.from_wire(r["error"]) if "error" in r else r.get("result"))
        return out
