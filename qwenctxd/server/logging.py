"""Logging set-up: structlog events as JSON lines on stderr (journald keeps them).

On a terminal (``make run``) the console renderer is used instead unless ``log_format=json``.
Stdlib loggers (jsonrpcserver, aiosqlite, watchfiles) are routed through the same renderer so
every line of the daemon's stderr is one JSON object.

Logging never blocks the event loop or shutdown. When stderr is a regular file (a test's log,
a redirect) lines are written inline: such writes do not block. Otherwise (a pipe, journald's
stream socket, a terminal) lines go through a bounded queue to a writer thread: a pipe that is
full (nobody reads) fills the queue and further lines are dropped; a pipe whose reader is gone
(EPIPE) marks the sink dead. Both are counted in ``daemon.status`` ``log``. A closed fd 0–2 at
start-up is reopened on /dev/null, so no later socket or file lands on a standard fd.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import stat
import sys
import threading
from typing import Any

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
QUEUE_LINES = 4096  # lines held for a slow pipe before new ones are dropped

debug_enabled = False  # hot paths check this before building a debug event


class StderrSink:
    """Writes log lines to fd 2 without ever blocking the caller (see the module doc)."""

    def __init__(self, fd: int = 2) -> None:
        self.fd = fd
        self.dropped = 0
        self.dead = False
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        try:
            self.inline = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            self.inline, self.dead = True, True

    @property
    def kind(self) -> str:
        return "dead" if self.dead else ("file" if self.inline else "pipe")

    @property
    def buffered(self) -> int:
        return len(self._queue)

    def write_line(self, line: bytes) -> None:
        if self.dead:
            self.dropped += 1
            return
        if self.inline:
            self._write_all(line)
            return
        with self._wake:
            if len(self._queue) >= QUEUE_LINES:
                self.dropped += 1
                return
            self._queue.append(line)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="qwenctxd-log",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EBADF, errno.EINVAL):
                    self.dead = True
                self.dropped += 1
                return
            view = view[n:]

    def _drain(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                line = self._queue.popleft()
            self._write_all(line)  # may block on a full pipe: only this thread waits
            if self.dead:
                with self._wake:
                    self.dropped += len(self._queue)
                    self._queue.clear()
                return


class _SinkLogger:
    """structlog logger writing rendered lines to the sink."""

    def __init__(self, sink: StderrSink) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write_line(message.encode("utf-8", "replace") + b"\n")

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


class _SinkHandler(logging.Handler):
    def __init__(self, sink: StderrSink) -> None:
        super().__init__()
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._sink.write_line(self.format(record).encode("utf-8", "replace") + b"\n")
        except Exception:
            self._sink.dropped += 1


_sink: StderrSink | None = None


def stats() -> dict[str, Any]:
    """``daemon.status`` ``log``: dropped lines, queued lines, the sink kind."""
    if _sink is None:
        return {"dropped": 0, "buffered": 0, "sink": "file"}
    return {"dropped": _sink.dropped, "buffered": _sink.buffered, "sink": _sink.kind}


def ensure_standard_fds() -> None:
    """Reopen any closed fd 0, 1 or 2 on /dev/null (``qwenctxd 2>&-`` must not crash, and a
    socket must never become fd 2)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - lives as long as the process


def configure(level: str = "info", fmt: str = "auto") -> None:
    global debug_enabled, _sink
    ensure_standard_fds()
    lvl = LEVELS.get(level, logging.INFO)
    debug_enabled = lvl <= logging.DEBUG
    if _sink is None:
        _sink = StderrSink(2)
    try:
        tty = os.isatty(2)
    except OSError:
        tty = False
    use_console = fmt == "console" or (fmt == "auto" and tty)
    renderer: structlog.types.Processor
    if use_console:
        renderer = structlog.dev.ConsoleRenderer(
            exception_formatter=structlog.dev.plain_traceback, colors=True
        )
    else:
        renderer = structlog.processors.JSONRenderer()
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tail: list[structlog.types.Processor] = [structlog.processors.StackInfoRenderer()]
    if not use_console:
        tail.append(structlog.processors.format_exc_info)
    sink = _sink
    structlog.configure(
        processors=[*shared, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=lambda *args: _SinkLogger(sink),
        cache_logger_on_first_use=True,
    )
    handler = _SinkHandler(sink)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[structlog.processors.add_log_level, shared[2]],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(lvl, logging.INFO) if lvl > logging.DEBUG else logging.INFO)
    # jsonrpcserver logs method exceptions itself; our wrapper already logged them.
    logging.getLogger("jsonrpcserver").setLevel(logging.CRITICAL)
