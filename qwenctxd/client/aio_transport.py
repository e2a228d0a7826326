"""The frame transport under :class:`~qwenctxd.client.aio.AsyncClient`.

:class:`StreamTransport` moves whole frames over a connected Unix socket, cut by the shared
``FrameDecoder`` (:mod:`qwenctxd.protocol.framing`), as the blocking
:class:`~qwenctxd.client.transport.SocketTransport` does over a socket. The bytes go through
:class:`~qwenctxd.socket_io.SocketConnection` (asyncio's protocol layer, as the daemon's side
of the connection): a frame is written at once and a reply wakes its reader straight from the
socket's callback, with none of anyio's per-message checkpoints and reader registrations — on
the proxy's path that is every ``session.turn``. Build it by path
(``await StreamTransport.connect(path)``) or over a socket that is already connected
(``await StreamTransport.connected(sock)``, e.g. one end of ``socket.socketpair()`` served by an
in-process daemon); ``AsyncClient(transport=...)`` takes either. Runs on asyncio (anyio's
asyncio backend); the blocking client never imports this module.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Protocol

import anyio

from qwenctxd.client.errors import ConnectionLost
from qwenctxd.client.transport import next_frame, unreachable
from qwenctxd.protocol.framing import FrameDecoder, Framing, encode
from qwenctxd.socket_io import SocketConnection

#: what a stream raises when the daemon's end is gone
STREAM_CLOSED = (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                 anyio.ClosedResourceError, ConnectionError)


class AsyncTransport(Protocol):
    """An anyio frame transport (what :class:`~qwenctxd.client.aio.AsyncClient` drives); an
    in-process one (a dispatcher behind memory streams) fits as well as a socket."""

    framing: Framing

    async def send(self, body: bytes) -> None:
        """Frame ``body`` (one JSON text) and write it; safe for concurrent callers."""

    async def receive(self) -> bytes:
        """The next whole frame; ``ConnectionLost`` at the end of the stream."""

    async def aclose(self) -> None:
        """Close the connection."""


class StreamTransport:
    """Frames over one connected Unix socket; a frame is one transport write, so concurrent
    callers never interleave their frames."""

    def __init__(self, conn: SocketConnection, *, framing: Framing = Framing.NDJSON,
                 path: str = "") -> None:
        self.conn = conn
        self.framing = framing
        self.path = path
        self._decoder = FrameDecoder(framing)

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], *,
                      framing: Framing = Framing.NDJSON) -> StreamTransport:
        """Connect to the daemon's socket at ``path``; ``DaemonUnreachable`` when nobody
        answers there."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, os.fspath(path))
        except OSError as exc:
            sock.close()
            raise unreachable(os.fspath(path), exc) from None
        except BaseException:
            sock.close()
            raise
        return cls(await SocketConnection.wrap(sock), framing=framing, path=os.fspath(path))

    @classmethod
    async def connected(cls, sock: socket.socket, *,
                        framing: Framing = Framing.NDJSON) -> StreamTransport:
        """Wrap a connected Unix stream socket (the transport owns and closes it)."""
        sock.setblocking(False)
        return cls(await SocketConnection.wrap(sock), framing=framing)

    async def send(self, body: bytes) -> None:
        try:
            await self.conn.send(encode(body, self.framing))
        except STREAM_CLOSED:
            raise ConnectionLost("daemon closed the connection") from None

    async def receive(self) -> bytes:
        """The next whole frame; ``ConnectionLost`` when the stream ends or is unframeable."""
        dec = self._decoder
        while True:
            frame = next_frame(dec)
            if frame is not None:
                return frame
            try:
                chunk = await self.conn.receive_some()
            except STREAM_CLOSED:
                raise ConnectionLost("daemon closed the connection") from None
            dec.feed(chunk)

    async def aclose(self) -> None:
        self.conn.close()
