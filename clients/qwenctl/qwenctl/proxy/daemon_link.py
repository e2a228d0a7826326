"""The proxy's one connection to the daemon, re-established when the daemon restarts.

An ``AsyncClient`` lives in a task of its own (its reader task group must be entered and left
by one task); a call that finds the connection lost asks that task for a new one and is
retried once. A daemon restarted in between has forgotten its open sessions, which the
mapping handles (SessionNotFound → reopen, resuming the recorded file). A daemon that stopped
is started again, as every other client does (unless ``--no-autostart``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import anyio
import structlog

from qwenctxd.client import AsyncClient, ConnectionLost, DaemonUnreachable
from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import methods
from qwenctxd.protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")

log = structlog.get_logger("qwenctl.proxy")
LOST = (ConnectionLost, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class DaemonLink:
    def __init__(self, socket: str | None, *, autostart: bool = True) -> None:
        self.socket = socket
        self.autostart = autostart
        self._client: AsyncClient | None = None
        self._generation = 0
        self._want = anyio.Event()
        self._ready = anyio.Event()
        self._error: BaseException | None = None

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the connection; reconnect when a caller reports it lost. Run in a task group."""
        started = False
        while True:
            try:
                async with AsyncClient(self.socket) as client:
                    await client.request(methods.DAEMON_HELLO, dwire.HelloParams(
                        client=dwire.ClientInfo(name="qwenctl-proxy"), protocol=1))
                    self._client, self._error = client, None
                    self._generation += 1
                    self._ready.set()
                    if not started:
                        started = True
                        task_status.started()
                    await self._want.wait()
                    self._want = anyio.Event()
            except DaemonUnreachable as exc:
                if not started:
                    raise
                if self.autostart and await self._start_daemon():
                    continue
                self._client, self._error = None, exc
                self._ready.set()
                await anyio.sleep(0.2)
                await self._want.wait()
                self._want = anyio.Event()

    async def _start_daemon(self) -> bool:
        """Start a daemon on our socket (as qwenctl does); whether one now answers."""
        from qwenctl.daemon_link import Unreachable, connect

        def start() -> None:
            connect(self.socket, autostart=True, timeout=5.0).close()

        try:
            await anyio.to_thread.run_sync(start)
        except (Unreachable, OSError) as exc:
            log.warning("proxy could not start the daemon", error=str(exc))
            return False
        log.info("proxy started the daemon again")
        return True

    async def _renew(self, seen: int) -> AsyncClient:
        if self._generation == seen and self._ready.is_set():
            self._ready = anyio.Event()
            self._want.set()
        await self._ready.wait()
        if self._client is None:
            raise self._error or DaemonUnreachable(str(self.socket), "no connection")
        return self._client

    async def _client_now(self) -> tuple[int, AsyncClient]:
        gen, client = self._generation, self._client
        if client is None:
            client = await self._renew(gen)
            gen = self._generation
        return gen, client

    async def request(self, method: Method[P, R], params: P) -> R:
        """The typed call of a table method, sent once more on a fresh connection when the
        daemon went away underneath."""
        gen, client = await self._client_now()
        try:
            return await client.request(method, params)
        except LOST:
            log.info("proxy lost the daemon connection; reconnecting", method=str(method))
            client = await self._renew(gen)
            return await client.request(method, params)

    async def call(self, method: Method[Any, Any], params: Any = None) -> Any:
        """A table method with JSON params and an untyped result: what
        :class:`~qwenctxd.client.SessionHistory` sends ``session.turn`` through (its reply's
        messages are forwarded upstream as JSON), with the same one retry."""
        gen, client = await self._client_now()
        try:
            return await client.call(method, params)
        except LOST:
            log.info("proxy lost the daemon connection; reconnecting", method=str(method))
            client = await self._renew(gen)
            return await client.call(method, params)
