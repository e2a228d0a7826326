"""Async client (anyio): concurrent requests on one connection, notifications as a stream.

A reader task matches replies to requests by id, so many callers can share one
``AsyncClient``; server notifications (after ``daemon.subscribe``) are delivered to
``notifications()``.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import msgspec

from qwenctxd.client.errors import ConnectionLost, DaemonUnreachable, RemoteError
from qwenctxd.client.sync import checked_params
from qwenctxd.paths import socket_path
from qwenctxd.protocol.framing import FrameDecoder, Framing, FramingError, encode

if TYPE_CHECKING:  # the table is only needed by callers; keeps this import lean
    from qwenctxd.protocol.methods import Method

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")
_encoder = msgspec.json.Encoder()


class AsyncClient:
    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, framing: Framing = Framing.NDJSON
    ) -> None:
        self.path = socket_path(path)
        self.framing = framing
        self._ids = itertools.count(1)
        self._pending: dict[int, anyio.Event] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._stream: anyio.abc.SocketStream | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._closed_reason: str | None = None

    async def __aenter__(self) -> AsyncClient:
        try:
            self._stream = await anyio.connect_unix(self.path)
        except FileNotFoundError:
            raise DaemonUnreachable(str(self.path), "no socket file") from None
        except ConnectionRefusedError:
            raise DaemonUnreachable(str(self.path), "connection refused (stale socket?)") from None
        except OSError as exc:
            raise DaemonUnreachable(str(self.path), exc.strerror or type(exc).__name__) from None
        self._notes_send, self._notes_recv = anyio.create_memory_object_stream[dict[str, Any]](
            math.inf
        )
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._reader)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None and self._stream is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        await self._stream.aclose()
        self._notes_send.close()
        self._notes_recv.close()

    async def _frames(self) -> AsyncIterator[bytes]:
        """Frames from the daemon, cut by the shared ``FrameDecoder``."""
        assert self._stream is not None
        dec = FrameDecoder(self.framing)
        while True:
            frame = dec.next_frame()
            if frame is not None:
                yield frame
                continue
            dec.feed(await self._stream.receive())

    async def _reader(self) -> None:
        try:
            async for frame in self._frames():
                msg = msgspec.json.decode(frame)
                items = msg if isinstance(msg, list) else [msg]
                for item in items:
                    if "method" in item and "id" not in item:
                        self._notes_send.send_nowait(item)
                        continue
                    rid = item.get("id")
                    ev = self._pending.get(rid)
                    if ev is not None:
                        self._replies[rid] = item
                        ev.set()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                anyio.ClosedResourceError, ConnectionError, FramingError):
            self._closed_reason = "daemon closed the connection"
        finally:
            for ev in self._pending.values():
                ev.set()

    async def send_raw(self, body: bytes) -> None:
        assert self._stream is not None
        async with self._lock:
            await self._stream.send(encode(body, self.framing))

    async def request(self, method: Method[P, R], params: P | None = None) -> R:
        """Call a method of the table with typed params; its typed result (see ``Client``)."""
        result: R = await self.call(method.name, checked_params(method, params), type=method.result)
        return result

    async def call(self, method: str | Method[Any, Any], params: Any = None, *,
                   type: type[T] | None = None) -> Any:
        """Send a request, await its reply (``method``: a name or a table entry)."""
        rid = next(self._ids)
        name = method if isinstance(method, str) else method.name
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": name, "id": rid}
        if params is not None:
            req["params"] = params
        ev = self._pending[rid] = anyio.Event()
        try:
            await self.send_raw(_encoder.encode(req))
            await ev.wait()
        finally:
            self._pending.pop(rid, None)
        reply = self._replies.pop(rid, None)
        if reply is None:
            raise ConnectionLost(self._closed_reason or "no reply")
        if "error" in reply:
            raise RemoteError.from_wire(reply["error"])
        result = reply.get("result")
        return msgspec.convert(result, type) if type is not None else result

    async def notify(self, method: str, params: Any = None) -> None:
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            req["params"] = params
        await self.send_raw(_encoder.encode(req))

    async def notifications(self) -> AsyncIterator[dict[str, Any]]:
        async for note in self._notes_recv:
            yield note
