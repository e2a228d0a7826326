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

A connection knows the daemon only through :class:`ConnectionHost` (limits, request and
connection accounting, the event bus) and answers through the :class:`Dispatcher` it is given.
Its requests run in an anyio task group the connection owns, each under its own CancelScope.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import msgspec
import structlog

from qwenctxd.events import Subscription
from qwenctxd.protocol import errors, framing
from qwenctxd.protocol.framing import FrameDecoder, Framing
from qwenctxd.server.dispatch import error_frame

if TYPE_CHECKING:
    from qwenctxd.config.schema import Settings
    from qwenctxd.server.dispatch import Dispatcher
    from qwenctxd.server.transport import SocketConnection

log = structlog.get_logger("qwenctxd.conn")
_conn_ids = itertools.count(1)
_encoder = msgspec.json.Encoder()

MAX_IN_FLIGHT = 64  # per connection; past it the connection stops reading (backpressure)


class _Closed(Exception):
    """The peer went away or the connection must end."""


@dataclass(frozen=True)
class ConnectionLimits:
    """The settings a connection reads (``daemon.*`` and ``limits.*``), current as of the last
    config reload."""

    max_frame_bytes: int
    max_message_bytes: int
    first_frame_timeout_s: float
    idle_connection_s: float

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(max_frame_bytes=settings.daemon.max_frame_bytes,
                   max_message_bytes=settings.limits.max_message_bytes,
                   first_frame_timeout_s=settings.daemon.first_frame_timeout_s,
                   idle_connection_s=settings.limits.idle_connection_s)


class ConnectionHost(Protocol):
    """What a connection needs of the daemon that accepted it."""

    @property
    def connection_limits(self) -> ConnectionLimits: ...

    def request_started(self) -> None: ...

    def request_finished(self) -> None: ...

    def connection_active(self, connection: Connection) -> None:
        """``connection`` sent its first frame (it is no longer evictable as new)."""

    def subscribe(self, topics: list[str] | None) -> Subscription: ...

    def unsubscribe(self, subscription: Subscription) -> None: ...

    def count_error(self) -> None:
        """One more error reply, answered by the connection itself (an undecodable frame)."""


class Connection:
    """Request context handed to every method handler (``ctx`` in the handlers)."""

    def __init__(self, host: ConnectionHost, dispatcher: Dispatcher,
                 conn: SocketConnection) -> None:
        self.host = host
        self.dispatcher = dispatcher
        self.id = next(_conn_ids)
        self.subscription: Subscription | None = None
        self.got_first_frame = False
        self.last_active = time.monotonic()
        self._io = conn
        limits = host.connection_limits
        self._decoder = FrameDecoder(max_frame=limits.max_frame_bytes,
                                     max_message=limits.max_message_bytes)
        self._tg: anyio.abc.TaskGroup | None = None  # subscription forwarders
        self._requests: anyio.abc.TaskGroup | None = None  # one task per request
        self._running: set[anyio.CancelScope] = set()  # requests admitted and not finished
        self._slot_freed: anyio.Event | None = None
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
                # leaving this group waits for every request: after the peer closed its side
                # they finish and answer; when the connection must end they are cancelled
                async with anyio.create_task_group() as requests:
                    self._requests = requests
                    try:
                        await self._loop()
                    except _Closed:
                        self._cancel_requests()
                    except BaseException:
                        self._cancel_requests()
                        raise
                tg.cancel_scope.cancel()
        finally:
            if self.subscription is not None:
                self.host.unsubscribe(self.subscription)

    def _cancel_requests(self) -> None:
        """The client is gone: cancel every running request (through its anyio scope, so
        shields inside handlers hold)."""
        for scope in self._running:
            scope.cancel()

    async def _loop(self) -> None:
        deadline = self.host.connection_limits.first_frame_timeout_s
        frame: bytes | None = None
        with anyio.move_on_after(deadline) as first:
            frame = await self._next_frame()
        if first.cancelled_caught:
            log.info("no frame before the deadline; closing", conn_id=self.id, after_s=deadline)
            return
        if frame is None:
            return
        self.got_first_frame = True
        self.host.connection_active(self)
        while frame is not None:
            await self._admit(frame)
            frame = await self._next_frame()
        # the peer closed its side: the requests it sent finish and answer (serve waits)

    async def _next_frame(self) -> bytes | None:
        """The next frame; None at end of stream. Framing errors get one reply, then close."""
        dec = self._decoder
        while True:
            try:
                frame = dec.next_frame()
            except framing.FrameSkipped as exc:
                log.warning("message over limits.max_message_bytes; discarded", conn_id=self.id,
                            limit=exc.limit, size=exc.size)
                self.host.count_error()
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
            idle = self.host.connection_limits.idle_connection_s
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
            self.host.count_error()
            await self._send_raw(error_frame(errors.ParseError(
                "Parse error: nesting too deep",
                data={"message": str(exc), "limit": framing.MAX_NESTING})))
            return
        except (msgspec.DecodeError, RecursionError) as exc:
            self.host.count_error()
            await self._send_raw(error_frame(errors.ParseError(data={"message": str(exc)})))
            return
        if isinstance(obj, dict) and obj.get("method") in self.dispatcher.inline:
            # never waits (ping, status, cancel, …): answered in the read loop, no task
            self.host.request_started()
            try:
                reply = await self.dispatcher.dispatch_obj(obj, self)
            finally:
                self.host.request_finished()
            if reply is not None:
                await self._send_raw(reply)
            return
        while len(self._running) >= MAX_IN_FLIGHT:  # backpressure: stop reading
            self._slot_freed = anyio.Event()
            await self._slot_freed.wait()
        rid = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(rid, bool) or not isinstance(rid, (int, str)):
            rid = None
        # arrival order per session: wait for the previous frame on each named session
        before: list[anyio.Event] = []
        mine: anyio.Event | None = None
        sessions = _sessions_named(obj)
        if sessions:
            mine = anyio.Event()
            for sid in sessions:
                prev = self._session_tail.get(sid)
                if prev is not None:
                    before.append(prev)
                self._session_tail[sid] = mine
        scope = anyio.CancelScope()
        if rid is not None:
            self._in_flight[rid] = scope
        self.host.request_started()
        self._running.add(scope)
        assert self._requests is not None
        self._requests.start_soon(self._run, obj, rid, scope, before, mine)

    async def _run(self, obj: Any, rid: Any, scope: anyio.CancelScope,
                   before: list[anyio.Event], mine: anyio.Event | None) -> None:
        try:
            await self._answer(obj, rid, scope, before, mine)
        except Exception:  # a bug answering one request must not end the connection
            log.exception("request task failed", conn_id=self.id, id=rid)
        finally:
            self._running.discard(scope)
            waiter = self._slot_freed
            if waiter is not None:
                waiter.set()

    async def _answer(self, obj: Any, rid: Any, scope: anyio.CancelScope,
                      before: list[anyio.Event], mine: anyio.Event | None) -> None:
        reply: bytes | None = None
        try:
            with scope:
                for ev in before:
                    await ev.wait()
                reply = await self.dispatcher.dispatch_obj(obj, self)
            if scope.cancelled_caught and rid is not None:
                log.info("request cancelled", conn_id=self.id, id=rid)
                reply = error_frame(errors.RequestCancelled(data={"id": rid}), rid)
        finally:
            if rid is not None and self._in_flight.get(rid) is scope:
                del self._in_flight[rid]
            self.host.request_finished()
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
            self.host.unsubscribe(self.subscription)
        self.subscription = self.host.subscribe(topics)
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
