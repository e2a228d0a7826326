"""One client connection: peer check, framing detection, the read → dispatch → reply loop.

A connection speaks the framing its first non-blank byte chose (NDJSON or LSP Content-Length).
Requests on one connection are answered in order; server notifications (after
``daemon.subscribe``) are interleaved between replies under a write lock. Any failure of a
connection — bad bytes, an oversized frame, a client that vanishes mid-request — ends that
connection only.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from qwenctxd.events import Subscription
from qwenctxd.protocol import errors, framing
from qwenctxd.protocol.framing import Framing
from qwenctxd.server.dispatch import error_frame

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon

log = structlog.get_logger("qwenctxd.conn")
_conn_ids = itertools.count(1)
_encoder = msgspec.json.Encoder()


class _Closed(Exception):
    """The peer went away or the connection must end."""


def peer_credentials(stream: SocketStream) -> tuple[int, int, int]:
    raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    data = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return pid, uid, gid


class Connection:
    """Request context handed to every method handler (``ctx`` in the handlers)."""

    def __init__(self, daemon: Daemon, stream: SocketStream) -> None:
        self.daemon = daemon
        self.stream = stream
        self.id = next(_conn_ids)
        self.peer_pid: int | None = None
        self.framing: Framing | None = None
        self.subscription: Subscription | None = None
        self._reader = BufferedByteReceiveStream(stream)
        self._write_lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def serve(self) -> None:
        try:
            pid, uid, _ = peer_credentials(self.stream)
        except OSError:
            log.warning("peer credentials unavailable; closing", conn_id=self.id)
            return
        if uid != os.getuid():
            log.warning("refused peer of another uid", conn_id=self.id, peer_uid=uid, peer_pid=pid)
            return
        self.peer_pid = pid
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    await self._loop()
                except _Closed:
                    pass
                tg.cancel_scope.cancel()
        finally:
            if self.subscription is not None:
                self.daemon.bus.unsubscribe(self.subscription)

    async def _loop(self) -> None:
        max_frame = self.daemon.max_frame_bytes
        while True:
            try:
                frame = await self._read_frame(max_frame)
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError,
                    anyio.ClosedResourceError, ConnectionError):
                return
            except framing.FrameTooLarge as exc:
                log.warning("frame over the cap; closing", conn_id=self.id, limit=exc.limit)
                err = errors.InvalidRequest(
                    f"Frame too large (limit {exc.limit} bytes)",
                    data={"limit": exc.limit, "size": exc.size},
                )
                await self._send_raw(error_frame(err))
                return
            except framing.BadHeader as exc:
                await self._send_raw(error_frame(errors.ParseError(f"Bad LSP header: {exc}")))
                return
            if frame is None:  # unknown framing
                await self._send_raw(
                    error_frame(errors.ParseError("Unrecognised framing: expected JSON or "
                                                  "Content-Length header"))
                )
                return
            self.daemon.request_started()
            try:
                reply = await self.daemon.dispatcher.dispatch(frame, self)
                if reply is not None:
                    await self._send_raw(reply)
            finally:
                self.daemon.request_finished()

    # -- reading -----------------------------------------------------------------------------
    async def _read_frame(self, max_frame: int) -> bytes | None:
        reader = self._reader
        if self.framing is None:
            first = await self._first_byte()
            self.framing = framing.detect(first)
            if self.framing is None:
                return None
        if self.framing is Framing.NDJSON:
            while True:
                try:
                    line = await reader.receive_until(b"\n", max_frame + 1)
                except anyio.DelimiterNotFound:
                    raise framing.FrameTooLarge(None, max_frame) from None
                if len(line) > max_frame:
                    raise framing.FrameTooLarge(len(line), max_frame)
                if line.strip():
                    return line
        while True:
            try:
                header = await reader.receive_until(b"\r\n\r\n", framing.MAX_HEADER_BYTES)
            except anyio.DelimiterNotFound:
                raise framing.BadHeader("header block over 8 KiB") from None
            if header.strip():
                break
        length = framing.parse_content_length(header.lstrip())
        if length > max_frame:
            raise framing.FrameTooLarge(length, max_frame)
        return await reader.receive_exactly(length)

    async def _first_byte(self) -> int:
        reader = self._reader
        while True:
            chunk = await reader.receive()
            stripped = chunk.lstrip(framing.WHITESPACE)
            if stripped:
                reader.feed_data(stripped)
                return stripped[0]

    # -- writing -----------------------------------------------------------------------------
    async def _send_raw(self, body: bytes) -> None:
        data = framing.encode(body, self.framing or Framing.NDJSON)
        try:
            async with self._write_lock:
                await self.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            raise _Closed from None

    def subscribe(self, topics: list[str] | None) -> None:
        """Start forwarding bus events on ``topics`` (all when None) to this connection."""
        if self.subscription is not None:
            self.daemon.bus.unsubscribe(self.subscription)
        self.subscription = self.daemon.bus.subscribe(topics)
        assert self._tg is not None
        self._tg.start_soon(self._forward, self.subscription)

    async def _forward(self, sub: Subscription) -> None:
        while True:
            try:
                topic, params = await sub.get()
            except anyio.EndOfStream:
                return
            note: dict[str, Any] = {"jsonrpc": "2.0", "method": topic, "params": params}
            try:
                await self._send_raw(_encoder.encode(note))
            except _Closed:
                return
