"""Blocking client: a thin front over a frame transport, request/notify/batch, typed results.

``request(methods.X, params)`` is the typed call (params struct in, result struct out, driven
by the method table); ``call(name, params)`` stays for raw names and dict params (qwenctl's
``call`` command, protocol tests). The JSON-RPC rules (ids, reply matching, error mapping) are
:class:`qwenctxd.client.transport.RpcProtocol`'s; the bytes move through a
:class:`~qwenctxd.client.transport.Transport` — by default a
:class:`~qwenctxd.client.transport.SocketTransport` connected to ``path``; pass
``transport=SocketTransport.connected(sock)`` to use a socket that is already connected.

Cheap to import (no anyio): qwenctl uses it so that a one-shot command starts fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from qwenctxd.client.errors import ConnectionLost, RemoteError
from qwenctxd.client.transport import RpcProtocol, SocketTransport, Transport, is_notification
from qwenctxd.paths import socket_path
from qwenctxd.protocol.framing import Framing

if TYPE_CHECKING:  # the table is only needed by callers; keeps this import lean
    from qwenctxd.protocol.methods import Method

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")


def checked_params(method: Method[Any, Any], params: Any) -> Any:
    """``params`` checked against the table entry (None: the struct's defaults)."""
    if params is None:
        return method.params()
    if not isinstance(params, method.params):
        raise TypeError(f"{method.name} takes {method.params.__name__}, "
                        f"not {type(params).__name__}")
    return params


def method_name(method: str | Method[Any, Any]) -> str:
    return method if isinstance(method, str) else method.name


class Client:
    """A connection to the daemon. Use as a context manager or call ``close()``.

    ``Client(path)`` connects to the socket at ``path`` (default: :func:`socket_path`);
    ``Client(transport=...)`` drives a transport built elsewhere (its framing is used)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        framing: Framing = Framing.NDJSON,
        timeout: float | None = 30.0,
        transport: Transport | None = None,
    ) -> None:
        self.path: Path | None
        if transport is None:
            self.path = socket_path(path)
            transport = SocketTransport.connect(self.path, framing=framing, timeout=timeout)
        else:  # the socket path, when the transport was connected by one
            where = path if path is not None else getattr(transport, "path", "")
            self.path = Path(where) if where else None
        self.transport = transport
        self.framing = transport.framing
        self.rpc = RpcProtocol()
        self.notifications: list[dict[str, Any]] = []

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()

    # -- raw frames --------------------------------------------------------------------------
    def send_raw(self, body: bytes) -> None:
        self.transport.send(body)

    def read_frame(self) -> bytes:
        """The next frame from the daemon (cut by the shared ``FrameDecoder``)."""
        return self.transport.receive()

    # -- JSON-RPC ----------------------------------------------------------------------------
    def request(self, method: Method[P, R], params: P | None = None) -> R:
        """Call a method of the table (:mod:`qwenctxd.protocol.methods`) with typed params;
        its typed result, or the :class:`RemoteError` subclass of the daemon's error code."""
        return self.call(method.name, checked_params(method, params), type=method.result)

    def call(self, method: str | Method[Any, Any], params: Any = None, *,
             type: type[T] | None = None) -> Any:
        """Send a request and wait for its reply; server notifications are kept aside.

        ``method`` is a name or a table entry (its name is used; the result stays untyped
        unless ``type`` is given — ``request`` is the typed call)."""
        rid, body = self.rpc.request(method_name(method), params)
        try:
            self.send_raw(body)
        except OSError:
            # a daemon at its connection cap answers -32005 and closes before reading: the
            # send may fail, the reply is still there to read
            try:
                frame = self.read_frame()
            except Exception:
                raise ConnectionLost("daemon closed the connection") from None
            msg = self.rpc.decode(frame)
            if isinstance(msg, dict) and isinstance(msg.get("error"), dict):
                raise RemoteError.from_wire(msg["error"]) from None
            raise
        while True:
            msg = self.rpc.decode(self.read_frame())
            if is_notification(msg):
                self.notifications.append(msg)
                continue
            refused = self.rpc.refusal(msg)
            if refused is not None:
                raise refused  # refused at the connection cap
            if not isinstance(msg, dict) or msg.get("id") != rid:
                raise ConnectionLost(f"unexpected reply {str(msg)[:200]}")
            return self.rpc.outcome(msg, type)

    def notify(self, method: str | Method[Any, Any], params: Any = None) -> None:
        self.send_raw(self.rpc.notification(method_name(method), params))

    def batch(self, calls: list[tuple[str | Method[Any, Any], Any]]) -> list[Any]:
        """Send ``[(method, params), ...]`` as one batch; replies in request order.

        Each element of the returned list is the result, or a RemoteError instance.
        """
        ids, body = self.rpc.batch([(method_name(m), p) for m, p in calls])
        self.send_raw(body)
        return self.rpc.batch_outcomes(ids, self.rpc.decode(self.read_frame()))


def call(method: str | Method[Any, Any], params: Any = None, *, path: str | Path | None = None,
         timeout: float | None = 30.0) -> Any:
    """One-shot helper: connect, call, close."""
    with Client(path, timeout=timeout) as c:
        return c.call(method, params)
