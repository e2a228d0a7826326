"""A Connection served in-process over a socket pair, with a stand-in ConnectionHost and a
dispatcher of its own: what the connection asks of its host (request accounting, first-frame
notice, error counting, subscriptions) goes through the host interface alone, and requests
run in the connection's task group (cancelled by ``rpc.cancel`` → -32800)."""

from __future__ import annotations

import json
import os
import socket
import warnings
from typing import Any

import anyio
import pytest

from qwenctxd.events import EventBus, Subscription
from qwenctxd.protocol import daemon as wire
from qwenctxd.protocol import errors, methods

with warnings.catch_warnings():  # jsonrpcserver reads its schema with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from qwenctxd.server.connection import Connection, ConnectionLimits
    from qwenctxd.server.dispatch import Dispatcher, Handler, bind
    from qwenctxd.server.transport import SocketConnection


class Host:
    """A ConnectionHost that records what the connection asked of it."""

    def __init__(self) -> None:
        self.connection_limits = ConnectionLimits(max_frame_bytes=1 << 20,
                                                  max_message_bytes=1 << 20,
                                                  first_frame_timeout_s=10.0,
                                                  idle_connection_s=30.0)
        self.started = self.finished = self.errors = 0
        self.active: list[int] = []
        self.bus = EventBus()
        self.subscriptions: list[Subscription] = []
        self.unsubscribed: list[Subscription] = []

    def request_started(self) -> None:
        self.started += 1

    def request_finished(self) -> None:
        self.finished += 1

    def connection_active(self, connection: Connection) -> None:
        self.active.append(connection.id)

    def subscribe(self, topics: list[str] | None) -> Subscription:
        sub = self.bus.subscribe(topics)
        self.subscriptions.append(sub)
        return sub

    def unsubscribe(self, subscription: Subscription) -> None:
        self.unsubscribed.append(subscription)
        self.bus.unsubscribe(subscription)

    def count_error(self) -> None:
        self.errors += 1


async def pong(ctx: Connection, p: wire.Empty) -> str:
    return "pong"


def dispatcher(ping: Handler = pong, *, ping_inline: bool = True) -> Dispatcher:
    d = Dispatcher()

    async def slow(ctx: Connection, p: wire.DrainParams) -> wire.DrainResult:
        await anyio.sleep(60)  # sleep-ok: a request that runs until cancelled
        return wire.DrainResult(drained=True, pending=0)

    async def subscribe(ctx: Connection, p: wire.SubscribeParams) -> wire.OkResult:
        ctx.subscribe(p.topics)
        return wire.OkResult()

    async def cancel(ctx: Connection, p: wire.CancelParams) -> wire.CancelResult:
        return wire.CancelResult(cancelled=ctx.cancel_request(p.id))

    d.register(bind(methods.DAEMON_PING, ping, inline=ping_inline))
    d.register(bind(methods.DAEMON_DRAIN, slow))
    d.register(bind(methods.DAEMON_SUBSCRIBE, subscribe))
    d.register(bind(methods.RPC_CANCEL, cancel, inline=True))
    return d


async def read_replies(sock: socket.socket, n: int) -> list[dict[str, Any]]:
    buf = b""
    out: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        while len(out) < n:
            buf += await anyio.to_thread.run_sync(sock.recv, 65536)
            *lines, buf = buf.split(b"\n")
            out.extend(json.loads(line) for line in lines if line.strip())
    return out


async def serve(connection: Connection) -> None:
    """What the accept loop does for each connection: serve it, then close its socket."""
    try:
        await connection.serve(os.getuid())
    finally:
        connection.close()


def send(sock: socket.socket, *msgs: Any) -> None:
    sock.sendall(b"".join((m if isinstance(m, bytes) else json.dumps(m).encode()) + b"\n"
                          for m in msgs))


def test_a_connection_reaches_only_its_host_and_dispatcher() -> None:
    host = Host()
    served, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    async def main() -> None:
        connection = Connection(host, dispatcher(), await SocketConnection.wrap(served))
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, connection)
            send(client, {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"})
            assert (await read_replies(client, 1))[0]["result"] == "pong"
            assert host.active == [connection.id]
            send(client, b"{not json",
                 {"jsonrpc": "2.0", "id": 2, "method": "daemon.drain", "params": {}},
                 {"jsonrpc": "2.0", "id": 3, "method": "daemon.subscribe", "params": {}})
            replies = await read_replies(client, 2)
            assert replies[0]["error"]["code"] == errors.PARSE_ERROR
            assert host.errors == 1  # counted through the host, not the dispatcher
            assert replies[1] == {"jsonrpc": "2.0", "id": 3, "result": {"ok": True}}
            assert len(host.subscriptions) == 1
            assert not connection.idle  # the slow request runs in the connection's group
            send(client, {"jsonrpc": "2.0", "id": 4, "method": "rpc.cancel",
                          "params": {"id": 2}})
            replies = await read_replies(client, 2)
            by_id = {r["id"]: r for r in replies}
            assert by_id[4]["result"] == {"cancelled": True}
            assert by_id[2]["error"]["code"] == errors.REQUEST_CANCELLED
            client.shutdown(socket.SHUT_WR)  # the peer is done: serve returns
        assert host.started == host.finished == 4
        assert host.unsubscribed == host.subscriptions

    try:
        anyio.run(main)
    finally:
        client.close()
        served.close()


@pytest.mark.parametrize("closing", ["peer_closes", "frame_too_large"])
def test_requests_in_flight_when_the_connection_ends(closing: str) -> None:
    """The peer closing its side lets a request finish and answer; a connection that must end
    (a frame over the cap) cancels what it runs — either way serve returns with nothing left
    running and every request accounted finished."""
    host = Host()
    host.connection_limits = ConnectionLimits(max_frame_bytes=4096, max_message_bytes=4096,
                                              first_frame_timeout_s=10.0,
                                              idle_connection_s=30.0)
    served, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    started, finished = anyio.Event(), anyio.Event()

    async def held(ctx: Connection, p: wire.Empty) -> str:
        started.set()
        await finished.wait()
        return "done"

    d = dispatcher(held, ping_inline=False)  # ping as a task, held until ``finished``

    async def main() -> list[dict[str, Any]]:
        connection = Connection(host, d, await SocketConnection.wrap(served))
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, connection)
            send(client, {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"})
            with anyio.fail_after(10):
                await started.wait()
            assert not connection.idle
            if closing == "peer_closes":
                client.shutdown(socket.SHUT_WR)
                finished.set()
            else:
                client.sendall(b"x" * 8192)
        return await read_replies(client, 1)

    try:
        replies = anyio.run(main)
    finally:
        client.close()
        served.close()
    if closing == "peer_closes":
        assert replies == [{"jsonrpc": "2.0", "id": 1, "result": "done"}]
    else:
        assert replies[0]["error"]["code"] == errors.INVALID_REQUEST
    assert host.started == host.finished == 1
