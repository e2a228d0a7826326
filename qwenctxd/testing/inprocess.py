"""The real daemon's services and dispatcher run in this process, reached without a socket.

:class:`InProcessDaemon` composes the services a spawned daemon composes (through
:class:`qwenctxd.server.host.ServiceHost`, the part of the daemon that is not a process) for a
scratch HOME, serves the real ``Dispatcher`` over ``served_specs`` on an anyio event loop in a
background thread, and hands out :class:`qwenctxd.client.Client`\\ s over
an :class:`InProcessTransport`: a request's frame goes to a real
:class:`~qwenctxd.server.connection.Connection` (per-session order, ``rpc.cancel``, error
replies, ``daemon.subscribe`` notifications — the same code a socket connection runs), through
an in-memory byte pipe instead of a socket. No socket file, no pid file, no process::

    with InProcessDaemon() as d:
        assert d.call("daemon.ping") == "pong"
        with d.client() as c:
            c.request(methods.MEMORY_STATUS, ...)

What it is not: the start-up and shutdown of a process (pid lock, socket binding, signals,
systemd notifications, the watchdog), the socket transport and its framing bytes on the wire,
or a daemon a test can ``kill -9``. Tests about those keep :class:`~qwenctxd.testing.spawn.
SpawnedDaemon`. ``qwenctl`` runs as a process too, so CLI tests keep a spawned daemon unless
they call ``qwenctxd.client`` directly.

The services read ``HOME`` and ``XDG_*`` from ``os.environ`` when they are called, so the
daemon sets them (as a spawned daemon's environment would be) for its whole life and restores
the test process's environment at :meth:`~InProcessDaemon.cleanup`; hence one in-process
daemon per process at a time (a second ``start`` raises ``RuntimeError``). Process-wide
state a fresh daemon process would start without: the secret-redaction counters are reset at
start; structlog keeps the test process's configuration (the daemon's lines go to captured
stdout, so ``log_text()``/``logged()`` of ``SpawnedDaemon`` have no counterpart here).
"""

from __future__ import annotations

import functools
import math
import os
import queue
import shutil
import tempfile
import threading
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread

from qwenctxd.client import Client
from qwenctxd.client.errors import ConnectionLost
from qwenctxd.protocol.framing import FrameDecoder, Framing, FramingError, encode
from qwenctxd.secrets import COUNTERS as secret_counters
from qwenctxd.testing import spawn as spawn_mod
from qwenctxd.testing.wait import until_async

with warnings.catch_warnings():  # jsonrpcserver reads its schema with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from qwenctxd.config import ConfigStore
    from qwenctxd.server.host import ServiceHost

#: held while an in-process daemon runs: it owns this process's environment for its life
_ENVIRON_OWNER = threading.Lock()

#: environment variables of the test process a scratch daemon must not inherit (as in spawn)
_NOT_INHERITED = ("OPENAI_", "QWEN", "XDG_", "LISTEN_", "NOTIFY_", "WATCHDOG_")

_EOF = b""
SEARCH_READY_S = 10.0  # bound on the wait for the search index's first scan at start


class _PipeConnection:
    """The daemon's end of one in-memory connection: the byte I/O a Connection drives
    (``receive_some``, ``send``, ``wait_writable``, ``close``), as ``SocketConnection`` has it."""

    def __init__(self, to_client: queue.SimpleQueue[bytes]) -> None:
        self.inbox_send, self._inbox = anyio.create_memory_object_stream[bytes](math.inf)
        self._to_client = to_client
        self.closed = False

    async def receive_some(self) -> bytes:
        try:
            return await self._inbox.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise anyio.IncompleteRead from None

    async def send(self, data: bytes) -> None:
        if self.closed:
            raise anyio.BrokenResourceError
        self._to_client.put(data)
        await anyio.lowlevel.checkpoint()

    async def wait_writable(self) -> None:
        """Replies go to an unbounded queue: never past a high-water mark."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.inbox_send.close()
            self._to_client.put(_EOF)

    def dispose(self) -> None:
        """Release the inbox once the connection no longer reads it."""
        self.close()
        self._inbox.close()


class InProcessTransport:
    """A blocking client transport (``framing``, ``send``, ``receive``, ``close``) whose frames
    go to a Connection served on the in-process daemon's loop."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, pipe: _PipeConnection,
                 replies: queue.SimpleQueue[bytes], *, framing: Framing = Framing.NDJSON,
                 timeout: float | None = 30.0) -> None:
        self.framing = framing
        self.path = ""
        self.timeout = timeout
        self._portal = portal
        self._pipe = pipe
        self._replies = replies
        self._decoder = FrameDecoder(framing)
        self._closed = False

    def send(self, body: bytes) -> None:
        data = encode(body, self.framing)
        try:
            self._portal.call(self._pipe.inbox_send.send_nowait, data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError):
            raise ConnectionLost("daemon closed the connection") from None

    def receive(self) -> bytes:
        dec = self._decoder
        while True:
            try:
                frame = dec.next_frame()
            except FramingError as exc:
                raise ConnectionLost(f"bad frame from the daemon: {exc}") from None
            if frame is not None:
                return frame
            try:
                chunk = self._replies.get(timeout=self.timeout)
            except queue.Empty:
                raise TimeoutError("no reply from the in-process daemon") from None
            if chunk == _EOF:
                self._replies.put(_EOF)  # every later receive ends the same way
                raise ConnectionLost("daemon closed the connection")
            dec.feed(chunk)

    def close(self) -> None:
        """End the client's side: the connection finishes what it runs, then closes."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._pipe.inbox_send.close)
        except RuntimeError:  # the daemon's loop has already stopped
            pass


class _InProcessHost(ServiceHost):
    """The daemon's ConnectionHost and DaemonControl, served without a listener: its services
    run as in ``Daemon.run`` (:mod:`qwenctxd.server.app`) minus what belongs to a process (pid
    lock, socket, signals, systemd, the watchdog, ``gc.freeze``)."""

    async def serve_in_process(self, *, task_status: anyio.abc.TaskStatus[
            anyio.abc.TaskGroup]) -> None:
        async with anyio.create_task_group() as tg:
            self.tasks.attach(tg)
            await self._start_services(tg)
            async with anyio.create_task_group() as conns:
                self.state = "serving"
                self._start_idle_loops(tg)
                await self._first_search_scan()
                task_status.started(conns)
                await self._stop.wait()
                await self._finish_shutdown()
                conns.cancel_scope.cancel()
            await self._close_services()
            with anyio.CancelScope(shield=True):
                # a process exits here; this loop closes instead, so its HTTP clients go first
                await self.model.aclose()
            tg.cancel_scope.cancel()

    async def _first_search_scan(self) -> None:
        """Wait (bounded) for the search index's first open and scan. A process exits after
        its shutdown; this loop closes, and an index open cancelled half-way (a test that
        cleans up at once) would leave aiosqlite's thread posting to a closed loop."""
        search = self.services.search
        await until_async(lambda: not search.pending, timeout=SEARCH_READY_S, interval=0.01,
                          what="the search index's first scan")

    async def serve_pipe(self, pipe: _PipeConnection) -> None:
        """What the accept loop does for each connection: serve it (counted in
        ``daemon.status``), then close it."""
        try:
            await self._handle(pipe, os.getuid())  # type: ignore[arg-type]
        finally:
            pipe.dispose()


class InProcessDaemon:
    """The daemon's services and dispatcher on a background event loop, for one scratch HOME.

    ``root`` is the scratch tree (default: a fresh dir in /tmp, removed by :meth:`cleanup`);
    ``env`` adds to the daemon's environment (``QWENCTXD_DEBUG_METHODS``, ``QWENCTXD_*``
    settings, ``OPENAI_*`` for a scripted model). Same attributes as ``SpawnedDaemon`` where
    they make sense: ``root``, ``home``, ``runtime``, ``socket`` (never bound), ``env``,
    ``client()``, ``call()``.
    """

    def __init__(self, root: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="qcd-ip-", dir="/tmp"))
        self._own_root = root is None
        if self._own_root:
            spawn_mod.CREATED_ROOTS.add(self.root)
        self.home = self.root / "home"
        self.runtime = self.root / "run"
        self.home.mkdir(parents=True, exist_ok=True)
        self.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket = self.runtime / "qwenctxd" / "qwenctxd.sock"
        self.env = {
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.runtime),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_STATE_HOME": str(self.home / ".local" / "state"),
            **(env or {}),
        }
        self.host: _InProcessHost | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._conns: anyio.abc.TaskGroup | None = None
        self._served: Any = None  # the Future of serve_in_process
        self._stack = ExitStack()
        self._saved_environ: dict[str, str] | None = None
        self._clients: list[InProcessTransport] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> InProcessDaemon:
        if not _ENVIRON_OWNER.acquire(blocking=False):
            raise RuntimeError("another InProcessDaemon runs in this process (it owns "
                               "os.environ): clean it up first")
        try:
            self._saved_environ = dict(os.environ)
            kept = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
            os.environ.clear()
            os.environ.update({**kept, **self.env})
            secret_counters.reset()  # process-wide: daemon.status shows this daemon's numbers
            self._portal = self._stack.enter_context(
                anyio.from_thread.start_blocking_portal(backend="asyncio"))
            store = ConfigStore()
            store.load_global()
            # built on the loop: the daemon's events belong to it
            self.host = self._portal.call(_InProcessHost, store, self.socket)
            self._served, self._conns = self._portal.start_task(self.host.serve_in_process)
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __enter__(self) -> InProcessDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Close the clients, shut the daemon down (no drain: as ``SpawnedDaemon.stop`` asks),
        stop the loop and its thread, restore the environment, remove the scratch tree."""
        try:
            for transport in self._clients:
                transport.close()
            self._clients.clear()
            if self._portal is not None and self.host is not None and self._served is not None:
                self._portal.call(functools.partial(self.host.request_shutdown, drain=False))
                self._served.result(timeout=30)
        finally:
            self._stop_loop()
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)
                spawn_mod.CREATED_ROOTS.discard(self.root)

    def _stop_loop(self) -> None:
        try:
            self._stack.close()  # stops the portal's loop and joins its thread
        finally:
            self._portal = None
            if self._saved_environ is not None:
                os.environ.clear()
                os.environ.update(self._saved_environ)
                self._saved_environ = None
                _ENVIRON_OWNER.release()

    @property
    def running(self) -> bool:
        return self._served is not None and not self._served.done()

    # -- clients -----------------------------------------------------------------------------
    def transport(self, *, framing: Framing = Framing.NDJSON,
                  timeout: float | None = 30.0) -> InProcessTransport:
        """A new connection to the daemon, as a client transport."""
        if self._portal is None or self.host is None or self._conns is None:
            raise RuntimeError("the in-process daemon is not running")
        replies: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        pipe = _PipeConnection(replies)
        host, conns = self.host, self._conns

        def open_connection() -> None:
            conns.start_soon(host.serve_pipe, pipe)

        self._portal.call(open_connection)
        transport = InProcessTransport(self._portal, pipe, replies, framing=framing,
                                       timeout=timeout)
        self._clients.append(transport)
        return transport

    def client(self, *, framing: Framing = Framing.NDJSON, timeout: float | None = 30.0
               ) -> Client:
        return Client(transport=self.transport(framing=framing, timeout=timeout))

    def call(self, method: str, params: Any = None) -> Any:
        with self.client() as c:
            return c.call(method, params)
