"""Handlers of the ``daemon.*`` family (hello, ping, status, drain, shutdown, subscribe),
``rpc.discover`` (the OpenRPC document of every method), and the cancellation pair
``rpc.cancel`` / ``$/cancelRequest`` (cancel an in-flight request of the same connection).

The lifecycle the family drives (status, shutdown) is the daemon's, reached through the narrow
:class:`DaemonControl` it implements; the served method table through the dispatcher."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

from qwenctxd import PROTOCOL_VERSION, __version__
from qwenctxd.protocol import daemon as wire
from qwenctxd.protocol import errors, methods
from qwenctxd.server.dispatch import handler

if TYPE_CHECKING:
    from qwenctxd.config import ConfigStore
    from qwenctxd.server.connection import Connection
    from qwenctxd.server.dispatch import Dispatcher
    from qwenctxd.tasks import TaskRegistry

CAPABILITIES = ["framing.ndjson", "framing.lsp", "batch", "notifications", "drain", "cancel"]


class DaemonControl(Protocol):
    """What the ``daemon.*`` handlers need of the daemon's lifecycle."""

    def status(self) -> wire.StatusResult: ...

    def request_shutdown(self, *, drain: bool = True, timeout_s: float | None = None) -> None: ...


class DaemonHandlers:
    def __init__(self, *, control: DaemonControl, dispatcher: Dispatcher, tasks: TaskRegistry,
                 config: ConfigStore) -> None:
        self.control = control
        self.dispatcher = dispatcher
        self.tasks = tasks
        self.config = config
        self.discovered: dict[str, Any] = {}

    @handler(methods.DAEMON_HELLO, allowed_while_stopping=True, inline=True)
    async def hello(self, ctx: Connection, p: wire.HelloParams) -> wire.HelloResult:
        return wire.HelloResult(
            protocol=PROTOCOL_VERSION,
            version=__version__,
            pid=os.getpid(),
            capabilities=list(CAPABILITIES) + sorted(self.dispatcher.specs),
        )

    @handler(methods.DAEMON_PING, allowed_while_stopping=True, quiet=True, inline=True)
    async def ping(self, ctx: Connection, p: wire.Empty) -> str:
        return "pong"

    @handler(methods.DAEMON_STATUS, allowed_while_stopping=True, inline=True)
    async def status(self, ctx: Connection, p: wire.Empty) -> wire.StatusResult:
        return self.control.status()

    @handler(methods.DAEMON_DRAIN, allowed_while_stopping=True)
    async def drain(self, ctx: Connection, p: wire.DrainParams) -> wire.DrainResult:
        timeout = (p.timeout_s if p.timeout_s is not None
                   else self.config.global_settings.daemon.drain_timeout_s)
        if timeout < 0:
            raise errors.InvalidParams(
                "timeout_s must be >= 0", data={"field": "timeout_s", "message": "negative"}
            )
        drained = await self.tasks.drain(timeout)
        return wire.DrainResult(drained=drained, pending=self.tasks.pending)

    @handler(methods.DAEMON_SHUTDOWN, allowed_while_stopping=True)
    async def shutdown(self, ctx: Connection, p: wire.ShutdownParams) -> wire.OkResult:
        # The shutdown path waits for in-flight requests, so this reply still goes out.
        self.control.request_shutdown(drain=p.drain, timeout_s=p.timeout_s)
        return wire.OkResult()

    @handler(methods.DAEMON_SUBSCRIBE)
    async def subscribe(self, ctx: Connection, p: wire.SubscribeParams) -> wire.OkResult:
        if p.topics is not None:
            unknown = [t for t in p.topics if t not in wire.TOPICS]
            if unknown:
                raise errors.InvalidParams(
                    f"unknown topic {unknown[0]!r}; known: {', '.join(wire.TOPICS)}",
                    data={"field": "topics", "message": f"unknown topic {unknown[0]}"},
                )
        ctx.subscribe(p.topics)
        return wire.OkResult()

    @handler(methods.RPC_DISCOVER, allowed_while_stopping=True)
    async def discover(self, ctx: Connection, p: wire.Empty) -> dict[str, Any]:
        if not self.discovered:
            from qwenctxd.server.discover import openrpc_document

            self.discovered.update(openrpc_document(self.dispatcher.specs.values(),
                                                    version=__version__))
        return self.discovered

    @handler(methods.RPC_CANCEL, allowed_while_stopping=True, inline=True)
    @handler(methods.CANCEL_REQUEST, allowed_while_stopping=True, inline=True)
    async def cancel(self, ctx: Connection, p: wire.CancelParams) -> wire.CancelResult:
        return wire.CancelResult(cancelled=ctx.cancel_request(p.id))
