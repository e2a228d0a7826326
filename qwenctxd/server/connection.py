"""One client connection: peer check, framing detection, the read → dispatch → reply loop.

A connection speaks the framing its first non-blank byte chose (NDJSON or LSP Content-Length).
Requests on one connection are answered in order; server notifications (after
``daemon.subscribe``) are interleaved between replies, each message one transport write. Any failure of a
connection — bad bytes, an oversized frame, a client that vanishes mid-request — ends that
connection only.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog

from qwenctxd.events import Subscription
from qwenctxd.protocol import errors, framing
from qwenctxd.protocol.framing import Framing
from qwenctxd.server.dispatch import error_frame
from qwenctxd.server.transport import SocketConnection

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon

log = structlog.get_logger("qwenctxd.conn")
_conn_ids = itertools.count(1)
_encoder = msgspec.json.Encoder()


class _Closed(Exception):
    """The peer went away or the connection must end."""


class Connection:
    """Request context handed to every method handler (``ctx`` in the handlers)."""

    def __init__(self, daemon: Daemon, conn: SocketConnection) -> None:
        self.daemon = daemon
        self.id = next(_conn_ids)
        self.framing: Framing | None = None
        self.subscription: Subscription | None = None
        self._io = conn
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def serve(self, peer_uid: int) -> None:
        if peer_uid != os.getuid():
            log.warning("refused peer of another uid", conn_id=self.id, peer_uid=peer_uid)
            return
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
            except (anyio.IncompleteRead, anyio.BrokenResourceError, ConnectionError):
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
        reader = self._io
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
        while True:
            chunk = await self._io.receive_some()
            stripped = chunk.lstrip(framing.WHITESPACE)
            if stripped:
                self._io.unread(stripped)
                return stripped[0]

    # -- writing -----------------------------------------------------------------------------
    async def _send_raw(self, body: bytes) -> None:
        data = framing.encode(body, self.framing or Framing.NDJSON)
        try:
            await self._io.send(data)  # one write per message: no interleaving
        except (anyio.BrokenResourceError, ConnectionError):
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
