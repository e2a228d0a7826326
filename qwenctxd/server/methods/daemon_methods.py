"""Handlers of the ``daemon.*`` family (hello, ping, status, drain, shutdown, subscribe),
``rpc.discover`` (the OpenRPC document of every method), and the cancellation pair
``rpc.cancel`` / ``$/cancelRequest`` (cancel an in-flight request of the same connection)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from qwenctxd import PROTOCOL_VERSION, __version__
from qwenctxd.protocol import daemon as wire
from qwenctxd.protocol import errors, methods
from qwenctxd.server.dispatch import bind

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection

CAPABILITIES = ["framing.ndjson", "framing.lsp", "batch", "notifications", "drain", "cancel"]


def register(daemon: Daemon) -> None:
    async def hello(ctx: Connection, p: wire.HelloParams) -> wire.HelloResult:
        return wire.HelloResult(
            protocol=PROTOCOL_VERSION,
            version=__version__,
            pid=os.getpid(),
            capabilities=list(CAPABILITIES) + sorted(daemon.dispatcher.specs),
        )

    async def ping(ctx: Connection, p: wire.Empty) -> str:
        return "pong"

    async def status(ctx: Connection, p: wire.Empty) -> wire.StatusResult:
        return daemon.status()

    async def drain(ctx: Connection, p: wire.DrainParams) -> wire.DrainResult:
        timeout = p.timeout_s if p.timeout_s is not None else daemon.settings.daemon.drain_timeout_s
        if timeout < 0:
            raise errors.InvalidParams(
                "timeout_s must be >= 0", data={"field": "timeout_s", "message": "negative"}
            )
        drained = await daemon.tasks.drain(timeout)
        return wire.DrainResult(drained=drained, pending=daemon.tasks.pending)

    async def shutdown(ctx: Connection, p: wire.ShutdownParams) -> wire.OkResult:
        # The shutdown path waits for in-flight requests, so this reply still goes out.
        daemon.request_shutdown(drain=p.drain, timeout_s=p.timeout_s)
        return wire.OkResult()

    async def subscribe(ctx: Connection, p: wire.SubscribeParams) -> wire.OkResult:
        if p.topics is not None:
            unknown = [t for t in p.topics if t not in wire.TOPICS]
            if unknown:
                raise errors.InvalidParams(
                    f"unknown topic {unknown[0]!r}; known: {', '.join(wire.TOPICS)}",
                    data={"field": "topics", "message": f"unknown topic {unknown[0]}"},
                )
        ctx.subscribe(p.topics)
        return wire.OkResult()

    async def cancel(ctx: Connection, p: wire.CancelParams) -> wire.CancelResult:
        return wire.CancelResult(cancelled=ctx.cancel_request(p.id))

    discovered: dict[str, Any] = {}

    async def discover(ctx: Connection, p: wire.Empty) -> dict[str, Any]:
        if not discovered:
            from qwenctxd.server.discover import openrpc_document

            discovered.update(openrpc_document(daemon.dispatcher.specs.values(),
                                               version=__version__))
        return discovered

    for spec in (
        bind(methods.DAEMON_HELLO, hello, allowed_while_stopping=True,
                   inline=True),
        bind(methods.DAEMON_PING, ping, allowed_while_stopping=True, quiet=True,
                   inline=True),
        bind(methods.DAEMON_STATUS, status, allowed_while_stopping=True,
                   inline=True),
        bind(methods.DAEMON_DRAIN, drain, allowed_while_stopping=True),
        bind(methods.DAEMON_SHUTDOWN, shutdown, allowed_while_stopping=True),
        bind(methods.DAEMON_SUBSCRIBE, subscribe),
        bind(methods.RPC_DISCOVER, discover, allowed_while_stopping=True),
        bind(methods.RPC_CANCEL, cancel, allowed_while_stopping=True,
                   inline=True),
        bind(methods.CANCEL_REQUEST, cancel, allowed_while_stopping=True,
                   inline=True),
    ):
        daemon.dispatcher.register(spec)
