"""Blocking client: one socket, either framing, request/notify/batch with typed results.

``request(methods.X, params)`` is the typed call (params struct in, result struct out, driven
by the method table); ``call(name, params)`` stays for raw names and dict params.

Cheap to import (no anyio): qwenctl uses it so that a one-shot command starts fast.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from qwenctxd.client.errors import ConnectionLost, DaemonUnreachable, RemoteError
from qwenctxd.paths import socket_path
from qwenctxd.protocol import errors as perrors
from qwenctxd.protocol.framing import FrameDecoder, Framing, FramingError, encode

if TYPE_CHECKING:  # the table is only needed by callers; keeps this import lean
    from qwenctxd.protocol.methods import Method

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")
_encoder = msgspec.json.Encoder()


def checked_params(method: Method[Any, Any], params: Any) -> Any:
    """``params`` checked against the table entry (None: the struct's defaults)."""
    if params is None:
        return method.params()
    if not isinstance(params, method.params):
        raise TypeError(f"{method.name} takes {method.params.__name__}, "
                        f"not {type(params).__name__}")
    return params


class Client:
    """A connection to the daemon. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        framing: Framing = Framing.NDJSON,
        timeout: float | None = 30.0,
    ) -> None:
        self.path = socket_path(path)
        self.framing = framing
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(framing)
        self.notifications: list[dict[str, Any]] = []
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(self.path))
        except FileNotFoundError:
            sock.close()
            raise DaemonUnreachable(str(self.path), "no socket file") from None
        except ConnectionRefusedError:
            sock.close()
            raise DaemonUnreachable(str(self.path), "connection refused (stale socket?)") from None
        except OSError as exc:
            sock.close()
            raise DaemonUnreachable(str(self.path), exc.strerror or type(exc).__name__) from None
        self._sock = sock

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    # -- raw frames --------------------------------------------------------------------------
    def send_raw(self, body: bytes) -> None:
        self._sock.sendall(encode(body, self.framing))

    def read_frame(self) -> bytes:
        """The next frame from the daemon (cut by the shared ``FrameDecoder``)."""
        dec = self._decoder
        while True:
            try:
                frame = dec.next_frame()
            except FramingError as exc:
                raise ConnectionLost(f"bad frame from the daemon: {exc}") from None
            if frame is not None:
                return frame
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionLost("daemon closed the connection")
            dec.feed(chunk)

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
        rid = next(self._ids)
        name = method if isinstance(method, str) else method.name
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": name, "id": rid}
        if params is not None:
            req["params"] = params
        try:
            self.send_raw(_encoder.encode(req))
        except OSError:
            # a daemon at its connection cap answers -32005 and closes before reading: the
            # send may fail, the reply is still there to read
            try:
                frame = self.read_frame()
            except Exception:
                raise ConnectionLost("daemon closed the connection") from None
            msg = msgspec.json.decode(frame)
            if isinstance(msg, dict) and isinstance(msg.get("error"), dict):
                raise RemoteError.from_wire(msg["error"]) from None
            raise
        while True:
            msg = msgspec.json.decode(self.read_frame())
            if isinstance(msg, dict) and "method" in msg and "id" not in msg:
                self.notifications.append(msg)
                continue
            if (isinstance(msg, dict) and msg.get("id") is None and isinstance(msg.get("error"), dict)
                    and msg["error"].get("code") == perrors.BUSY):
                raise RemoteError.from_wire(msg["error"])  # refused at the connection cap
            if not isinstance(msg, dict) or msg.get("id") != rid:
                raise ConnectionLost(f"unexpected reply {str(msg)[:200]}")
            if "error" in msg:
                raise RemoteError.from_wire(msg["error"])
            result = msg.get("result")
            return msgspec.convert(result, type) if type is not None else result

    def notify(self, method: str, params: Any = None) -> None:
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            req["params"] = params
        self.send_raw(_encoder.encode(req))

    def batch(self, calls: list[tuple[str, Any]]) -> list[Any]:
        """Send ``[(method, params), ...]`` as one batch; replies in request order.

        Each element of the returned list is the result, or a RemoteError instance.
        """
        first = next(self._ids)
        reqs = []
        for i, (method, params) in enumerate(calls):
            req: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": first + i}
            if params is not None:
                req["params"] = params
            reqs.append(req)
        for _ in range(len(calls) - 1):
            next(self._ids)
        self.send_raw(_encoder.encode(reqs))
        replies = msgspec.json.decode(self.read_frame())
        if isinstance(replies, dict):  # a whole-batch error
            raise RemoteError.from_wire(replies.get("error", {}))
        by_id = {r.get("id"): r for r in replies}
        out: list[Any] = []
        for req in reqs:
            r = by_id.get(req["id"], {"error": {"code": -32603, "message": "no reply"}})
            out.append(RemoteError.from_wire(r["error"]) if "error" in r else r.get("result"))
        return out


def call(method: str | Method[Any, Any], params: Any = None, *, path: str | Path | None = None,
         timeout: float | None = 30.0) -> Any:
    """One-shot helper: connect, call, close."""
    with Client(path, timeout=timeout) as c:
        return c.call(method, params)
