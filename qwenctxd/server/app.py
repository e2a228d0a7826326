"""The daemon process: owns the lifecycle and serves the socket over the services that
:class:`qwenctxd.server.host.ServiceHost` composes (with the dispatcher, connection accounting,
status and the drain; this module adds the pid lock, the socket, signals and systemd).

Start-up order: RLIMIT_NOFILE raised → pid lock → socket (adopted or bound) → watchers and
config reload → accept loop → READY=1. Shutdown (``daemon.shutdown``, SIGTERM or SIGINT)
follows one path: STOPPING=1, state ``draining`` (the socket still accepts: ``daemon.status``
answers, new work gets Busy), background jobs drained up to the deadline with a progress line
each second and the rest cancelled, replies in flight sent, then the listener closes, socket
and pid file removed, exit 0. A second signal exits at once.
"""

from __future__ import annotations

import functools
import gc
import os
import resource
import signal
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd import __version__
from qwenctxd.config import ConfigStore
from qwenctxd.idle_gc import IdleCollector
from qwenctxd.paths import ensure_private_dir, pid_path
from qwenctxd.protocol import errors
from qwenctxd.server import logging as daemon_logging
from qwenctxd.server import systemd, transport
from qwenctxd.server.dispatch import error_frame
from qwenctxd.server.host import ServiceHost
from qwenctxd.server.lock import PidLock

EVICT_GRACE_S = 5.0  # at the cap, a connection idle for less is not evicted

log = structlog.get_logger("qwenctxd.daemon")


class Daemon(ServiceHost):
    """The daemon process: the services of :class:`ServiceHost` served on a Unix socket."""

    def __init__(
        self,
        config: ConfigStore,
        socket_path: Path,
        *,
        activated_fd: int | None = None,
    ) -> None:
        super().__init__(config, socket_path, activated_fd=activated_fd)
        self._lock = PidLock(pid_path(socket_path))
        self._bound_here = False
        self._accept_scope: anyio.CancelScope | None = None
        self._listener: socket.socket | None = None

    # -- run ----------------------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until shut down; the process exit code."""
        raise_nofile_limit()
        if self.activated_fd is None or not self.socket_path.parent.is_dir():
            # socket activation passes the socket, but the pid lock beside it needs its dir
            # (without XDG_RUNTIME_DIR that is /tmp/qwenctxd-UID, which may not exist yet)
            ensure_private_dir(self.socket_path.parent)
        self._lock.acquire()
        try:
            return await self._serve()
        finally:
            self._cleanup_files()

    async def _serve(self) -> int:
        if self.activated_fd is not None:
            self._listener = transport.adopt(self.activated_fd)
            log.info("adopted inherited socket", fd=self.activated_fd)
        else:
            self._listener = transport.bind(self.socket_path)
            self._bound_here = True
        try:
            return await self._serve_loop()
        finally:
            self._listener.close()

    async def _serve_loop(self) -> int:
        async with anyio.create_task_group() as tg:
            self.tasks.attach(tg)
            tg.start_soon(self._signals)
            await self._start_services(tg)
            async with anyio.create_task_group() as conns:
                await conns.start(self._accept, conns)
                self.state = "serving"
                systemd.notify(f"READY=1\nSTATUS={self._status_line()}\nMAINPID={os.getpid()}")
                log.info(
                    "serving",
                    socket=str(self.socket_path),
                    pid=os.getpid(),
                    version=__version__,
                    activated=self.activated_fd is not None,
                )
                self._start_idle_loops(tg)
                if self.model.configured:  # the ~1 s openai import, off the first request
                    tg.start_soon(self._warm_model)
                # start-up garbage is permanent: keep the collector from rescanning it
                gc.collect()
                gc.freeze()
                # full collections wait for a moment without requests (idle_gc)
                tg.start_soon(IdleCollector(lambda: self.dispatcher.requests,
                                            lambda: self.in_flight_requests).run)
                interval = systemd.watchdog_interval_s()
                if interval:
                    tg.start_soon(self._supervised, "watchdog",
                                  functools.partial(self._watchdog, interval))
                await self._stop.wait()
                await self._finish_shutdown()
                conns.cancel_scope.cancel()
            await self._close_services()
            tg.cancel_scope.cancel()
        log.info("stopped", pid=os.getpid())
        return 0

    async def _accept(
        self, conns: anyio.abc.TaskGroup, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        assert self._listener is not None
        with anyio.CancelScope() as scope:
            self._accept_scope = scope
            await transport.accept_loop(
                self._listener,
                self._handle,
                conns,
                max_connections=lambda: self.settings.daemon.max_connections,
                evict_idle=self._evict_idle,
                busy_reply=error_frame(errors.Busy(
                    "Too many connections",
                    data={"limit": self.settings.daemon.max_connections})) + b"\n",
                task_status=task_status,
            )

    # -- connections ---------------------------------------------------------------------------
    async def _warm_model(self) -> None:
        try:
            await self.model.warm_up()
        except Exception:
            log.warning("model warm-up failed", exc_info=True)
            return
        # the SDK's ~60 000 objects are as permanent as start-up's: out of every later
        # full collection (they made each one ~30 ms)
        gc.collect()
        gc.freeze()

    def _evict_idle(self) -> bool:
        """At the connection cap: close the oldest connection that never sent a frame, else the
        longest-idle one with nothing in flight and no subscription (protocol.md "Bounds on one
        connection"); False when every connection is busy."""
        for conn_id, connection in self._fresh.items():
            del self._fresh[conn_id]
            self._open.pop(conn_id, None)
            log.info("connection cap reached; closing an idle new connection", conn_id=conn_id)
            connection.close()
            return True
        # a client between two requests is not evicted: only idle past a short grace
        grace = min(EVICT_GRACE_S, self.settings.limits.idle_connection_s / 2)
        now = time.monotonic()
        idle = [c for c in self._open.values() if c.idle and now - c.last_active >= grace]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.last_active)
        self._open.pop(victim.id, None)
        log.info("connection cap reached; closing the longest-idle connection",
                 conn_id=victim.id, idle_s=round(time.monotonic() - victim.last_active, 1))
        victim.close()
        return True

    # -- shutdown -----------------------------------------------------------------------------
    def _stop_listening(self) -> None:
        if self._accept_scope is not None:
            self._accept_scope.cancel()
        if self._listener is not None:
            self._listener.close()

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self._shutdown_started:
                    self._cleanup_files()
                    # os._exit skips atexit: the reason is written synchronously instead
                    daemon_logging.fatal("second signal; exiting now", signal=signum)
                    os._exit(1)
                log.info("signal received", signal=signal.Signals(signum).name)
                self.request_shutdown(drain=True)

    def _cleanup_files(self) -> None:
        if self._bound_here:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            self._bound_here = False
        self._lock.release()

    async def _watchdog(self, interval: float) -> None:
        while True:
            systemd.notify("WATCHDOG=1")
            await anyio.sleep(interval)


def raise_nofile_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (each connection holds a descriptor)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("raised RLIMIT_NOFILE", soft=target, was=soft)
    except (OSError, ValueError):
        log.warning("could not raise RLIMIT_NOFILE", exc_info=True)

def describe(obj: Any) -> str:
    return type(obj).__name__
