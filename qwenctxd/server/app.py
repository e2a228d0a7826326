"""The daemon: owns the lifecycle and serves the socket over the services composed by
:func:`qwenctxd.server.compose.build_services`.

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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd import PROTOCOL_VERSION, __version__
from qwenctxd.config import ConfigStore
from qwenctxd.config.schema import Settings
from qwenctxd.events import Subscription
from qwenctxd.paths import ensure_private_dir, pid_path, state_dir
from qwenctxd.protocol import daemon as wire
from qwenctxd.protocol import errors
from qwenctxd.secrets import COUNTERS as secret_counters
from qwenctxd.server import logging as daemon_logging
from qwenctxd.server import systemd, transport
from qwenctxd.server.compose import build_services
from qwenctxd.server.connection import Connection, ConnectionLimits
from qwenctxd.server.dispatch import Dispatcher, error_frame
from qwenctxd.server.handlers import served_specs
from qwenctxd.server.lock import PidLock
from qwenctxd.tasks import TaskRecord
from qwenctxd.tasks.supervise import supervise

EVICT_GRACE_S = 5.0  # at the cap, a connection idle for less is not evicted

log = structlog.get_logger("qwenctxd.daemon")

StatusContributor = Callable[[wire.StatusResult], None]


class Daemon:
    def __init__(
        self,
        config: ConfigStore,
        socket_path: Path,
        *,
        activated_fd: int | None = None,
    ) -> None:
        self.config = config
        self.settings: Settings = config.global_settings
        self.socket_path = socket_path
        self.activated_fd = activated_fd
        self.state = "starting"
        self.started_monotonic = time.monotonic()
        self.status_contributors: list[StatusContributor] = [self._projects_status]
        self.in_flight_requests = 0
        self.counters: dict[str, int] = {}
        self.connection_limits = ConnectionLimits.of(self.settings)
        self.services = services = build_services(
            config, state=state_dir(), bump=self.bump, in_flight=lambda: self.in_flight_requests)
        # the lifecycle below drives these; handlers get theirs in server/handlers.py
        self.bus = services.bus
        self.tasks = services.tasks
        self.hub = services.hub
        self.model = services.model
        self.tasks.add_listener(self._on_task_event)
        self.status_contributors.append(self._sessions_status)
        self.status_contributors.append(self._search_status)
        self.dispatcher = Dispatcher(is_stopping=lambda: self.state != "serving")
        self._requests_idle = anyio.Event()
        self.connections = 0
        self._fresh: dict[int, Connection] = {}  # connections yet to send their first frame
        self._open: dict[int, Connection] = {}  # every open connection
        self._lock = PidLock(pid_path(socket_path))
        self._bound_here = False
        self._stop = anyio.Event()
        self._shutdown_started = False
        self._drain_on_stop = True
        self._stop_timeout: float | None = None
        self._accept_scope: anyio.CancelScope | None = None
        self._listener: socket.socket | None = None
        config.add_listener(self._on_config_change)
        self.dispatcher.register_all(
            served_specs(services, control=self, dispatcher=self.dispatcher))

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_monotonic

    async def _supervised(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """A life-long loop whose crash is logged and counted (``loop_crashes``), never fatal."""
        await supervise(name, loop, on_crash=lambda _name: self.bump("loop_crashes"))

    def bump(self, counter: str, n: int = 1) -> None:
        """Increment a debug counter shown in ``daemon.status`` (tests and benches read them)."""
        self.counters[counter] = self.counters.get(counter, 0) + n

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
            await tg.start(self.hub.run)
            await tg.start(functools.partial(self.config.run, self.hub, tasks=self.tasks))
            await self.services.sessions.start()
            await self.services.search.start()
            tg.start_soon(self._supervised, "session-search", self.services.search.run)
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
                tg.start_soon(self._supervised, "idle-dream", self.services.background.idle_loop)
                tg.start_soon(self._supervised, "idle-close",
                              self.services.sessions.idle_close_loop)
                if self.model.configured:  # the ~1 s openai import, off the first request
                    tg.start_soon(self._warm_model)
                # start-up garbage is permanent: keep the collector from rescanning it
                gc.collect()
                gc.freeze()
                interval = systemd.watchdog_interval_s()
                if interval:
                    tg.start_soon(self._supervised, "watchdog",
                                  functools.partial(self._watchdog, interval))
                await self._stop.wait()
                await self._finish_shutdown()
                conns.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await self.services.sessions.aclose()
                await self.services.search.aclose()
                await self.services.memory.aclose()
                self.services.speculation.close()
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

    # -- the ConnectionHost of every connection ------------------------------------------------
    def request_started(self) -> None:
        self.in_flight_requests += 1

    def request_finished(self) -> None:
        self.in_flight_requests -= 1
        if not self.in_flight_requests:
            self._requests_idle.set()

    async def _warm_model(self) -> None:
        try:
            await self.model.warm_up()
        except Exception:
            log.warning("model warm-up failed", exc_info=True)

    async def _handle(self, conn: transport.SocketConnection, peer_uid: int) -> None:
        self.connections += 1
        connection = Connection(self, self.dispatcher, conn)
        self._fresh[connection.id] = connection
        self._open[connection.id] = connection
        try:
            await connection.serve(peer_uid)
        finally:
            self._fresh.pop(connection.id, None)
            self._open.pop(connection.id, None)
            self.connections -= 1

    def connection_active(self, connection: Connection) -> None:
        """``connection`` sent its first frame: it is a client, no longer evictable."""
        self._fresh.pop(connection.id, None)

    def subscribe(self, topics: list[str] | None) -> Subscription:
        return self.bus.subscribe(topics)

    def unsubscribe(self, subscription: Subscription) -> None:
        self.bus.unsubscribe(subscription)

    def count_error(self) -> None:
        self.dispatcher.count_error()

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
    def request_shutdown(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Begin the shutdown path once; later calls are ignored."""
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self._drain_on_stop = drain
        self._stop_timeout = timeout_s
        self.state = "draining"
        systemd.notify("STOPPING=1\nSTATUS=draining background work")
        log.info("shutting down", drain=drain)
        self._stop.set()

    async def _finish_shutdown(self) -> None:
        """Drain (the socket still accepts: status answers ``draining``), then stop listening."""
        timeout = self._stop_timeout or self.settings.daemon.drain_timeout_s
        with anyio.CancelScope(shield=True):
            if self._drain_on_stop:
                drained = await self._drain_with_progress(timeout)
                if not drained:
                    log.warning("drain deadline passed; cancelling", pending=self.tasks.pending)
            self.tasks.close()
            self.tasks.cancel_all()
            await self.tasks.drain(2.0)
            with anyio.move_on_after(2.0):
                while self.in_flight_requests:
                    self._requests_idle = anyio.Event()
                    with anyio.move_on_after(0.05):
                        await self._requests_idle.wait()
            self.state = "stopping"
            if self._accept_scope is not None:
                self._accept_scope.cancel()
            if self._listener is not None:
                self._listener.close()
            log.info("shutdown: stopped listening", in_flight=self.in_flight_requests)

    async def _drain_with_progress(self, deadline_s: float) -> bool:
        """``tasks.drain(deadline_s)`` with one progress line a second on stderr."""
        started = time.monotonic()
        result: list[bool] = []

        async def drain() -> None:
            result.append(await self.tasks.drain(deadline_s))
            progress.cancel_scope.cancel()

        async with anyio.create_task_group() as progress:
            progress.start_soon(drain)
            while True:
                pending = self.tasks.pending
                kinds = sorted({r.kind for r in self.tasks.in_flight})
                log.info("shutdown: draining", pending=pending, running=kinds,
                         waited_s=round(time.monotonic() - started, 1), deadline_s=deadline_s)
                await anyio.sleep(1.0)
        return result[0] if result else False

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

    # -- status -------------------------------------------------------------------------------
    def _status_line(self) -> str:
        st = self.status()
        return (
            f"{self.state}: {len(st.sessions)} sessions, {len(st.background.in_flight)} "
            f"background jobs, {st.background.queued} queued"
        )

    def _on_task_event(self, rec: TaskRecord) -> None:
        self.bus.publish(
            "background/progress",
            {
                "id": rec.id,
                "kind": rec.kind,
                "project": rec.project,
                "state": rec.outcome.value if rec.outcome else "started",
                "pending": self.tasks.pending,
            },
        )
        if os.environ.get("NOTIFY_SOCKET"):
            systemd.notify(f"STATUS={self._status_line()}")

    def _on_config_change(self, settings: Settings) -> None:
        self.settings = settings
        self.connection_limits = ConnectionLimits.of(settings)
        self.model.update(settings.endpoint())
        self.bus.publish("config/changed", {"generation": self.config.generation})
        log.info("config reloaded", generation=self.config.generation)

    def _search_status(self, st: wire.StatusResult) -> None:
        st.search = self.services.search.status()

    def _sessions_status(self, st: wire.StatusResult) -> None:
        st.sessions.extend(wire.SessionSummary(**row)
                           for row in self.services.sessions.summaries())

    def _projects_status(self, st: wire.StatusResult) -> None:
        known = {p.root: p for p in st.projects}
        for root, watched in self.services.instructions.projects():
            entry = known.get(str(root))
            if entry is None:
                entry = wire.ProjectSummary(root=str(root))
                st.projects.append(entry)
                known[entry.root] = entry
            entry.watchers += watched
        for root, docs in self.services.memory.projects():
            entry = known.get(str(root))
            if entry is None:
                entry = wire.ProjectSummary(root=str(root))
                st.projects.append(entry)
                known[entry.root] = entry
            entry.memory_docs = docs
        for root, count, watched in self.services.skills.projects():
            if root is None:
                continue
            entry = known.get(str(root))
            if entry is None:
                entry = wire.ProjectSummary(root=str(root))
                st.projects.append(entry)
                known[entry.root] = entry
            entry.skills = count
            entry.watchers += watched

    def status(self) -> wire.StatusResult:
        tasks = self.tasks
        st = wire.StatusResult(
            version=__version__,
            pid=os.getpid(),
            uptime_s=round(self.uptime_s, 3),
            protocol=PROTOCOL_VERSION,
            socket=str(self.socket_path),
            sessions=[],
            projects=[],
            background=wire.BackgroundStatus(
                in_flight=[
                    wire.InFlightTask(
                        id=r.id,
                        kind=r.kind,
                        project=r.project,
                        started_at=r.started_at or r.submitted_at,
                        description=r.description,
                    )
                    for r in tasks.in_flight
                ],
                queued=tasks.queued,
                last_extract_at=tasks.last_finished("extract"),
                last_dream_at=tasks.last_finished("dream"),
                completed=tasks.counts["completed"],
                failed=tasks.counts["failed"],
                cancelled=tasks.counts["cancelled"],
                failed_by_kind=dict(tasks.failed_by_kind),
                recent_failures=[
                    wire.FailedTask(id=r.id, kind=r.kind, project=r.project, cause=r.error,
                                    finished_at=r.finished_at)
                    for r in tasks.recent_failures
                ],
            ),
            rss_bytes=rss_bytes(),
            state=self.state,
            connections=self.connections,
            requests=self.dispatcher.requests,
            activated=self.activated_fd is not None,
            model=self.model.status(),
            config=wire.ConfigStatus(
                files=[str(f) for f in self.config.files],
                generation=self.config.generation,
                last_error=self.config.last_error,
            ),
            inotify_watches=self.hub.inotify_watches(),
            watch=wire.WatchStatus(
                directories=len(self.hub.directories),
                subscriptions=len(self.hub.subscriptions()),
                synced=self.hub.synced,
                batches=self.hub.batches,
                changes=self.hub.changes,
                restarts=self.hub.restarts,
                last_error=self.hub.last_error,
            ),
            counters=dict(self.counters),
            log=wire.LogStatus(**daemon_logging.stats()),
            secrets=secret_counters.snapshot(),
        )
        for contribute in self.status_contributors:
            contribute(st)
        return st


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


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def describe(obj: Any) -> str:
    return type(obj).__name__
