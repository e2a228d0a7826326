"""Async client (anyio): concurrent requests on one connection, notifications as a stream.

A thin front over a :class:`~qwenctxd.client.aio_transport.StreamTransport` and the shared
JSON-RPC rules (:class:`~qwenctxd.client.transport.RpcProtocol`): a reader task matches replies
to requests by id, so many callers can share one ``AsyncClient``; server notifications (after
``daemon.subscribe``) are delivered to ``notifications()``. ``AsyncClient(path)`` connects on
``async with``; ``AsyncClient(transport=await StreamTransport.connected(sock))`` uses a socket
that is already connected.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc

from qwenctxd.client.aio_transport import AsyncTransport, StreamTransport
from qwenctxd.client.errors import ConnectionLost
from qwenctxd.client.sync import checked_params, method_name
from qwenctxd.client.transport import RpcProtocol, is_notification
from qwenctxd.paths import socket_path
from qwenctxd.protocol.framing import Framing

if TYPE_CHECKING:  # the table is only needed by callers; keeps this import lean
    from qwenctxd.protocol.methods import Method

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")


class AsyncClient:
    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, framing: Framing = Framing.NDJSON,
        transport: AsyncTransport | None = None,
    ) -> None:
        self.path = socket_path(path) if transport is None or path is not None else None
        self.framing = transport.framing if transport is not None else framing
        self.transport = transport
        self.rpc = RpcProtocol()
        self._pending: dict[int, anyio.Event] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed_reason: str | None = None
        self._reading = False  # the reader task runs: someone will answer a pending call

    async def __aenter__(self) -> AsyncClient:
        if self.transport is None:
            assert self.path is not None
            self.transport = await StreamTransport.connect(self.path, framing=self.framing)
        self._notes_send, self._notes_recv = anyio.create_memory_object_stream[dict[str, Any]](
            math.inf
        )
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._reading = True
        self._tg.start_soon(self._reader)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None and self.transport is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        await self.transport.aclose()
        self._notes_send.close()
        self._notes_recv.close()

    async def _reader(self) -> None:
        assert self.transport is not None
        try:
            while True:
                msg = self.rpc.decode(await self.transport.receive())
                for item in msg if isinstance(msg, list) else [msg]:
                    if is_notification(item):
                        self._notes_send.send_nowait(item)
                        continue
                    rid = item.get("id")
                    ev = self._pending.get(rid)
                    if ev is not None:
                        self._replies[rid] = item
                        ev.set()
        except ConnectionLost:
            self._closed_reason = "daemon closed the connection"
        finally:
            self._reading = False
            for ev in self._pending.values():
                ev.set()

    async def send_raw(self, body: bytes) -> None:
        assert self.transport is not None
        await self.transport.send(body)

    async def request(self, method: Method[P, R], params: P | None = None) -> R:
        """Call a method of the table with typed params; its typed result (see ``Client``)."""
        result: R = await self.call(method.name, checked_params(method, params), type=method.result)
        return result

    async def call(self, method: str | Method[Any, Any], params: Any = None, *,
                   type: type[T] | None = None) -> Any:
        """Send a request, await its reply (``method``: a name or a table entry)."""
        rid, body = self.rpc.request(method_name(method), params)
        ev = self._pending[rid] = anyio.Event()
        try:
            await self.send_raw(body)
            if self._reading:  # else the connection is gone: a write to it fails later, if ever
                await ev.wait()
        finally:
            self._pending.pop(rid, None)
        reply = self._replies.pop(rid, None)
        if reply is None:
            raise ConnectionLost(self._closed_reason or "no reply")
        return self.rpc.outcome(reply, type)

    async def notify(self, method: str | Method[Any, Any], params: Any = None) -> None:
        await self.send_raw(self.rpc.notification(method_name(method), params))

    async def notifications(self) -> AsyncIterator[dict[str, Any]]:
        async for note in self._notes_recv:
            yield note
