"""The daemon without its process: the composed services, the dispatcher over them, and
what every connection and the ``daemon.*`` handlers need of the daemon.

:class:`ServiceHost` builds the services (:func:`qwenctxd.server.compose.build_services`) and
the :class:`~qwenctxd.server.dispatch.Dispatcher` over ``served_specs``; it is the
:class:`~qwenctxd.server.connection.ConnectionHost` of every connection (request and
connection accounting, subscriptions), the ``DaemonControl`` of the ``daemon.*`` handlers
(``status``, ``request_shutdown``) and runs the shutdown path's drain. What belongs to a process
— pid lock, socket, accept loop, signals, systemd, the watchdog — is
:class:`qwenctxd.server.app.Daemon`'s, which extends it; the in-process test daemon
(:mod:`qwenctxd.testing.inprocess`) extends it too, with no socket at all.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import structlog

from qwenctxd import PROTOCOL_VERSION, __version__
from qwenctxd.config import ConfigStore
from qwenctxd.config.schema import Settings
from qwenctxd.events import Subscription
from qwenctxd.paths import state_dir
from qwenctxd.protocol import daemon as wire
from qwenctxd.secrets import COUNTERS as secret_counters
from qwenctxd.server import logging as daemon_logging
from qwenctxd.server import systemd
from qwenctxd.server.compose import build_services
from qwenctxd.server.connection import Connection, ConnectionLimits
from qwenctxd.server.dispatch import Dispatcher
from qwenctxd.server.handlers import served_specs
from qwenctxd.tasks import TaskRecord
from qwenctxd.tasks.supervise import supervise

if TYPE_CHECKING:
    from qwenctxd.server.transport import SocketConnection

log = structlog.get_logger("qwenctxd.daemon")
INOTIFY_COUNT_TTL_S = 5.0

StatusContributor = Callable[[wire.StatusResult], None]


class ServiceHost:
    """The services, the dispatcher and the connection host of one daemon; no socket."""

    def __init__(
        self,
        config: ConfigStore,
        socket_path: Path,
        *,
        activated_fd: int | None = None,
    ) -> None:
        self.config = config
        self.settings: Settings = config.global_settings
        self.socket_path = socket_path  # reported by daemon.status (bound by Daemon only)
        self.activated_fd = activated_fd
        self.state = "starting"
        self.started_monotonic = time.monotonic()
        self.status_contributors: list[StatusContributor] = [self._projects_status]
        self.in_flight_requests = 0
        self.counters: dict[str, int] = {}
        self.connection_limits = ConnectionLimits.of(self.settings)
        self.services = services = build_services(
            config, state=state_dir(), bump=self.bump, in_flight=lambda: self.in_flight_requests)
        # the lifecycle drives these; handlers get theirs in server/handlers.py
        self.bus = services.bus
        self.tasks = services.tasks
        self.hub = services.hub
        self.model = services.model
        self.tasks.add_listener(self._on_task_event)
        self.status_contributors.append(self._sessions_status)
        self.status_contributors.append(self._search_status)
        self.dispatcher = Dispatcher(is_stopping=lambda: self.state != "serving")
        self._requests_idle = anyio.Event()
        self._inotify_count: tuple[float | None, int] = (None, 0)
        self.connections = 0
        self._fresh: dict[int, Connection] = {}  # connections yet to send their first frame
        self._open: dict[int, Connection] = {}  # every open connection
        self._stop = anyio.Event()
        self._shutdown_started = False
        self._drain_on_stop = True
        self._stop_timeout: float | None = None
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

    # -- the services' lifecycle (the same for a process and in-process) ---------------------
    async def _start_services(self, tg: anyio.abc.TaskGroup) -> None:
        """Watchers, config reload, sessions and search, started in ``tg`` (the tasks'
        group, attached by the caller) before the first connection is served."""
        await tg.start(self.hub.run)
        await tg.start(functools.partial(self.config.run, self.hub, tasks=self.tasks))
        await self.services.sessions.start()
        await self.services.search.start()
        tg.start_soon(self._supervised, "session-search", self.services.search.run)

    def _start_idle_loops(self, tg: anyio.abc.TaskGroup) -> None:
        """The loops that run once serving: idle dreaming and idle session close."""
        tg.start_soon(self._supervised, "idle-dream", self.services.background.idle_loop)
        tg.start_soon(self._supervised, "idle-close", self.services.sessions.idle_close_loop)

    async def _close_services(self) -> None:
        """After the shutdown path: close what holds files and clients (shielded)."""
        with anyio.CancelScope(shield=True):
            await self.services.sessions.aclose()
            await self.services.search.aclose()
            await self.services.memory.aclose()
            self.services.speculation.close()

    # -- the ConnectionHost of every connection ------------------------------------------------
    def request_started(self) -> None:
        self.in_flight_requests += 1

    def request_finished(self) -> None:
        self.in_flight_requests -= 1
        if not self.in_flight_requests:
            self._requests_idle.set()

    async def _handle(self, conn: SocketConnection, peer_uid: int) -> None:
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
            self._stop_listening()
            log.info("shutdown: stopped listening", in_flight=self.in_flight_requests)

    def _stop_listening(self) -> None:
        """The shutdown path's last step: stop accepting (a Daemon closes its listener)."""

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

    # -- status -------------------------------------------------------------------------------
    def _status_line(self) -> str:
        """systemd's STATUS= line, sent at every background job's start and end: from the
        counters only (a whole ``status()`` read /proc for every descriptor each time)."""
        return (
            f"{self.state}: {len(self.services.sessions.sessions)} sessions, "
            f"{len(self.tasks.in_flight)} background jobs, {self.tasks.queued} queued"
        )

    def _inotify_watches(self) -> int:
        """The process's inotify watches, counted at most every :data:`INOTIFY_COUNT_TTL_S`:
        the count reads a /proc link for every open descriptor (milliseconds on the event
        loop with many clients), and a status line or editor may ask every second."""
        now = time.monotonic()
        at, count = self._inotify_count
        if at is None or now - at >= INOTIFY_COUNT_TTL_S:
            count = self.hub.inotify_watches()
            self._inotify_count = (now, count)
        return count

    def _on_task_event(self, rec: TaskRecord) -> None:
        if self.bus.wanted("background/progress"):  # 3-4 task events a turn, mostly unheard
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
            inotify_watches=self._inotify_watches(),
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
            memory=self.services.memory.semantic_status() or {},
        )
        for contribute in self.status_contributors:
            contribute(st)
        return st


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
