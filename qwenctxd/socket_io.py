"""Byte I/O over one connected Unix stream socket on asyncio's protocol layer.

anyio's Unix socket streams register and unregister the fd with the loop and yield a
checkpoint on every receive and send (a failed ``recv``, two ``epoll_ctl`` and two trips
through the loop per message); at editor-scale request rates that was most of a ping's cost.
Here a connection is an asyncio Protocol whose reader stays registered: received bytes land in
a buffer and wake at most one waiting reader; writes go straight to the transport, with flow
control. Structure (task groups, cancellation) stays with anyio — the waits are plain futures,
so anyio cancel scopes cancel them as usual. The daemon serves every accepted connection
through it (``server.transport``), and the async client talks to the daemon through it
(``client.aio_transport``). Errors are anyio's stream errors. asyncio only.
"""

from __future__ import annotations

import asyncio
import socket

import anyio

READ_HIGH_WATER = 4 * 1024 * 1024  # pause reading while this much is buffered unread
WRITE_HIGH_WATER = 8 * 1024 * 1024  # unsent bytes past which the writer waits


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.waiter: asyncio.Future[None] | None = None
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.write_paused = False
        self.read_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > READ_HIGH_WATER and not self.read_paused and self.transport:
            self.transport.pause_reading()
            self.read_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return True  # half-close: replies to what was sent still go out; we close at the end

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiters, self.drain_waiters = self.drain_waiters, []
        for d in waiters:
            if not d.done():
                d.set_result(None)


class SocketConnection:
    """Byte I/O over one connected socket, accepted or dialled (same errors as anyio's
    streams); frames are cut by ``qwenctxd.protocol.framing.FrameDecoder``."""

    def __init__(self, transport: asyncio.Transport, proto: _Protocol) -> None:
        self._transport = transport
        self._p = proto

    @classmethod
    async def wrap(cls, sock: socket.socket) -> SocketConnection:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.connect_accepted_socket(_Protocol, sock)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        return cls(transport, proto)

    async def _fill(self) -> None:
        """Wait for more bytes; IncompleteRead at end of stream."""
        p = self._p
        if p.eof:
            raise anyio.IncompleteRead
        if p.read_paused and self._transport is not None:
            p.read_paused = False
            self._transport.resume_reading()
        p.waiter = asyncio.get_running_loop().create_future()
        try:
            await p.waiter
        finally:
            p.waiter = None

    async def receive_some(self) -> bytes:
        """Whatever is buffered (waiting for at least one byte)."""
        p = self._p
        while not p.buffer:
            await self._fill()
        data = bytes(p.buffer)
        p.buffer.clear()
        return data

    async def send(self, data: bytes) -> None:
        t = self._transport
        if t.is_closing():
            raise anyio.BrokenResourceError
        t.write(data)
        p = self._p
        if p.write_paused:  # several request tasks may wait here at once
            waiter = asyncio.get_running_loop().create_future()
            p.drain_waiters.append(waiter)
            await waiter
            if t.is_closing():
                raise anyio.BrokenResourceError

    async def wait_writable(self) -> None:
        """Wait while the unsent bytes are past the write high-water mark."""
        p = self._p
        while p.write_paused and not self._transport.is_closing():
            waiter = asyncio.get_running_loop().create_future()
            p.drain_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        self._transport.close()
