"""One client connection: peer check, frames in, one task per request, replies out.

A connection speaks the framing its first non-blank byte chose (NDJSON or LSP Content-Length;
``qwenctxd.protocol.framing`` cuts the frames). Each frame runs as its own task, so requests on
one connection run concurrently and may be answered out of order; frames naming the same
``session_id`` keep their arrival order (each waits for the previous one on that session).
``$/cancelRequest`` and ``rpc.cancel`` cancel an in-flight request by id: its reply is -32800.
Server notifications (after ``daemon.subscribe``) are interleaved; every message is one
transport write. A connection that sends no complete frame within the first-frame deadline is
closed; later, one with nothing in flight and no subscription is closed after
``limits.idle_connection_s``. A message over ``limits.max_message_bytes`` is discarded as it
arrives and answered -32602 (``data.field: "message"``); the connection goes on. Any failure of
a connection ends that connection only.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog

from qwenctxd.events import Subscription
from qwenctxd.protocol import errors, framing
from qwenctxd.protocol.framing import FrameDecoder, Framing
from qwenctxd.server.dispatch import error_frame
from qwenctxd.server.transport import SocketConnection

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon

log = structlog.get_logger("qwenctxd.conn")
_conn_ids = itertools.count(1)
_encoder = msgspec.json.Encoder()

MAX_IN_FLIGHT = 64  # per connection; past it the connection stops reading (backpressure)


class _Closed(Exception):
    """The peer went away or the connection must end."""


class Connection:
    """Request context handed to every method handler (``ctx`` in the handlers)."""

    def __init__(self, daemon: Daemon, conn: SocketConnection) -> None:
        self.daemon = daemon
        self.id = next(_conn_ids)
        self.subscription: Subscription | None = None
        self.got_first_frame = False
        self.last_active = time.monotonic()
        self._io = conn
        self._decoder = FrameDecoder(max_frame=daemon.max_frame_bytes,
                                     max_message=daemon.settings.limits.max_message_bytes)
        self._tg: anyio.abc.TaskGroup | None = None
        self._running: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._slot_freed: asyncio.Future[None] | None = None
        self._in_flight: dict[Any, anyio.CancelScope] = {}
        self._session_tail: dict[str, anyio.Event] = {}

    @property
    def idle(self) -> bool:
        """Nothing in flight and no subscription: evictable, and closed after
        ``limits.idle_connection_s``."""
        return not self._running and self.subscription is None

    @property
    def framing(self) -> Framing | None:
        return self._decoder.framing

    def close(self) -> None:
        """Close the socket (the read loop then ends)."""
        self._io.close()

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
                finally:
                    for scope in self._running.values():  # the client is gone
                        scope.cancel()  # (through anyio: shields inside handlers hold)
                    if self._running:
                        await asyncio.wait(list(self._running))
                tg.cancel_scope.cancel()
        finally:
            if self.subscription is not None:
                self.daemon.bus.unsubscribe(self.subscription)

    async def _loop(self) -> None:
        deadline = self.daemon.settings.daemon.first_frame_timeout_s
        frame: bytes | None = None
        with anyio.move_on_after(deadline) as first:
            frame = await self._next_frame()
        if first.cancelled_caught:
            log.info("no frame before the deadline; closing", conn_id=self.id, after_s=deadline)
            return
        if frame is None:
            return
        self.got_first_frame = True
        self.daemon.connection_active(self)
        while frame is not None:
            await self._admit(frame)
            frame = await self._next_frame()
        # the peer closed its side: let the requests it sent finish and answer
        while self._running:
            await asyncio.wait(list(self._running))

    async def _next_frame(self) -> bytes | None:
        """The next frame; None at end of stream. Framing errors get one reply, then close."""
        dec = self._decoder
        while True:
            try:
                frame = dec.next_frame()
            except framing.FrameSkipped as exc:
                log.warning("message over limits.max_message_bytes; discarded", conn_id=self.id,
                            limit=exc.limit, size=exc.size)
                self.daemon.dispatcher.errors += 1
                await self._send_raw(error_frame(errors.InvalidParams(
                    f"message: over limits.max_message_bytes ({exc.limit} bytes)",
                    data={"field": "message", "limit": exc.limit, "size": exc.size})))
                continue
            except framing.FrameTooLarge as exc:
                log.warning("frame over the cap; closing", conn_id=self.id, limit=exc.limit)
                err = errors.InvalidRequest(
                    f"Frame too large (limit {exc.limit} bytes)",
                    data={"limit": exc.limit, "size": exc.size},
                )
                await self._send_raw(error_frame(err))
                raise _Closed from None
            except framing.BadHeader as exc:
                await self._send_raw(error_frame(errors.ParseError(f"Bad LSP header: {exc}")))
                raise _Closed from None
            except framing.UnknownFraming:
                await self._send_raw(
                    error_frame(errors.ParseError("Unrecognised framing: expected JSON or "
                                                  "Content-Length header"))
                )
                raise _Closed from None
            if frame is not None:
                self.last_active = time.monotonic()
                return frame
            # replies the client has not read past the transport's high-water mark: stop
            # reading this connection until they drain
            await self._io.wait_writable()
            idle = self.daemon.settings.limits.idle_connection_s
            try:
                if self.got_first_frame and self.idle:
                    with anyio.move_on_after(idle) as waited:
                        data = await self._io.receive_some()
                    if waited.cancelled_caught:
                        if self.idle:
                            log.info("idle connection; closing", conn_id=self.id, after_s=idle)
                            return None
                        data = await self._io.receive_some()
                else:
                    data = await self._io.receive_some()
            except (anyio.IncompleteRead, anyio.BrokenResourceError, ConnectionError, OSError):
                return None
            dec.feed(data)

    # -- requests ----------------------------------------------------------------------------
    async def _admit(self, frame: bytes) -> None:
        """Decode one frame and start its task (waiting for a slot when MAX_IN_FLIGHT run)."""
        try:
            obj = framing.decode_json(frame)
        except framing.NestingTooDeep as exc:
            self.daemon.dispatcher.errors += 1
            await self._send_raw(error_frame(errors.ParseError(
                "Parse error: nesting too deep",
                data={"message": str(exc), "limit": framing.MAX_NESTING})))
            return
        except (msgspec.DecodeError, RecursionError) as exc:
            self.daemon.dispatcher.errors += 1
            await self._send_raw(error_frame(errors.ParseError(data={"message": str(exc)})))
            return
        if isinstance(obj, dict) and obj.get("method") in self.daemon.dispatcher.inline:
            # never waits (ping, status, cancel, …): answered in the read loop, no task
            self.daemon.request_started()
            try:
                reply = await self.daemon.dispatcher.dispatch_obj(obj, self)
            finally:
                self.daemon.request_finished()
            if reply is not None:
                await self._send_raw(reply)
            return
        while len(self._running) >= MAX_IN_FLIGHT:  # backpressure: stop reading
            self._slot_freed = asyncio.get_running_loop().create_future()
            await self._slot_freed
        rid = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(rid, bool) or not isinstance(rid, (int, str)):
            rid = None
        # arrival order per session: wait for the previous frame on each named session
        before: list[asyncio.Event] = []
        mine: asyncio.Event | None = None
        sessions = _sessions_named(obj)
        if sessions:
            mine = asyncio.Event()
            for sid in sessions:
                prev = self._session_tail.get(sid)
                if prev is not None:
                    before.append(prev)
                self._session_tail[sid] = mine
        scope = anyio.CancelScope()
        if rid is not None:
            self._in_flight[rid] = scope
        self.daemon.request_started()
        task = asyncio.get_running_loop().create_task(self._run(obj, rid, scope, before, mine))
        self._running[task] = scope
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        waiter = self._slot_freed
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _run(self, obj: Any, rid: Any, scope: anyio.CancelScope,
                   before: list[asyncio.Event], mine: asyncio.Event | None) -> None:
        reply: bytes | None = None
        try:
            with scope:
                for ev in before:
                    await ev.wait()
                reply = await self.daemon.dispatcher.dispatch_obj(obj, self)
            if scope.cancelled_caught and rid is not None:
                log.info("request cancelled", conn_id=self.id, id=rid)
                reply = error_frame(errors.RequestCancelled(data={"id": rid}), rid)
        finally:
            if rid is not None and self._in_flight.get(rid) is scope:
                del self._in_flight[rid]
            self.daemon.request_finished()
        try:
            if reply is not None:
                try:
                    await self._send_raw(reply)
                except _Closed:
                    self.close()
        finally:
            # the session's order is held until the reply is written (a client that does not
            # read holds back its own next request on that session, nothing else)
            if mine is not None:
                mine.set()
                for sid, tail in list(self._session_tail.items()):
                    if tail is mine:
                        del self._session_tail[sid]

    def cancel_request(self, rid: Any) -> bool:
        """Cancel the in-flight request ``rid`` of this connection; False if none is."""
        scope = self._in_flight.get(rid)
        if scope is None:
            return False
        scope.cancel()
        return True

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


def _sessions_named(obj: Any) -> set[str]:
    """The ``session_id`` values a request (or each member of a batch) names."""
    members = obj if isinstance(obj, list) else (obj,)
    out: set[str] = set()
    for m in members:
        if isinstance(m, dict):
            params = m.get("params")
            if isinstance(params, dict):
                sid = params.get("session_id")
                if isinstance(sid, str):
                    out.add(sid)
    return out
