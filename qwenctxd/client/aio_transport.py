"""The anyio frame transport under :class:`~qwenctxd.client.aio.AsyncClient`.

:class:`StreamTransport` moves whole frames over an anyio byte stream, cut by the shared
``FrameDecoder`` (:mod:`qwenctxd.protocol.framing`), as the blocking
:class:`~qwenctxd.client.transport.SocketTransport` does over a socket. Build it by path
(``await StreamTransport.connect(path)``) or over a socket that is already connected
(``await StreamTransport.connected(sock)``, e.g. one end of ``socket.socketpair()`` served by an
in-process daemon); ``AsyncClient(transport=...)`` takes either. Imports anyio: the blocking
client never imports this module.
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

import anyio
import anyio.abc

from qwenctxd.client.errors import ConnectionLost
from qwenctxd.client.transport import next_frame, unreachable
from qwenctxd.protocol.framing import FrameDecoder, Framing, encode

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
    """Frames over an anyio byte stream; ``send`` is serialised so concurrent callers never
    interleave their frames."""

    def __init__(self, stream: anyio.abc.ByteStream, *, framing: Framing = Framing.NDJSON,
                 path: str = "") -> None:
        self.stream = stream
        self.framing = framing
        self.path = path
        self._decoder = FrameDecoder(framing)
        self._send_lock = anyio.Lock(fast_acquire=True)  # one a call: no loop trip uncontended

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], *,
                      framing: Framing = Framing.NDJSON) -> StreamTransport:
        """Connect to the daemon's socket at ``path``; ``DaemonUnreachable`` when nobody
        answers there."""
        try:
            stream = await anyio.connect_unix(path)
        except OSError as exc:
            raise unreachable(os.fspath(path), exc) from None
        return cls(stream, framing=framing, path=os.fspath(path))

    @classmethod
    async def connected(cls, sock: socket.socket, *,
                        framing: Framing = Framing.NDJSON) -> StreamTransport:
        """Wrap a connected Unix stream socket (the transport owns and closes it)."""
        sock.setblocking(False)
        stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
        return cls(stream, framing=framing)

    async def send(self, body: bytes) -> None:
        async with self._send_lock:
            await self.stream.send(encode(body, self.framing))

    async def receive(self) -> bytes:
        """The next whole frame; ``ConnectionLost`` when the stream ends or is unframeable."""
        dec = self._decoder
        while True:
            frame = next_frame(dec)
            if frame is not None:
                return frame
            try:
                chunk = await self.stream.receive()
            except STREAM_CLOSED:
                raise ConnectionLost("daemon closed the connection") from None
            dec.feed(chunk)

    async def aclose(self) -> None:
        await self.stream.aclose()
