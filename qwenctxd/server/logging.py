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

The reason a daemon exits is never left in that queue: :func:`fatal` first lets the writer
thread empty it (bounded), then writes its own line to fd 2 synchronously, whatever the sink's
state (queued, full or marked dead), waiting at most a bounded time for a full pipe. At exit
the queue is flushed too (``atexit``, bounded), so the last lines before a clean exit arrive.
"""

from __future__ import annotations

import atexit
import collections
import datetime
import errno
import json
import logging
import os
import select
import stat
import sys
import threading
import time
from typing import Any

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
QUEUE_LINES = 4096  # lines held for a slow pipe before new ones are dropped
EXIT_FLUSH_S = 2.0  # how long an exit waits for queued lines to reach a slow pipe
FATAL_WRITE_S = 2.0  # how long the fatal line waits for room in a full pipe

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
        self._writing = False  # the writer thread holds a line it has not finished writing
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
                self._writing = True
            self._write_all(line)  # may block on a full pipe: only this thread waits
            with self._wake:
                self._writing = False
                self._wake.notify_all()
                if self.dead:
                    self.dropped += len(self._queue)
                    self._queue.clear()
                    return

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every queued line is written; True when so."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while (self._queue or self._writing) and not self.dead:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._wake.wait(min(left, 0.05))
        return not self._queue

    def write_now(self, data: bytes, timeout: float) -> bool:
        """Write ``data`` to the fd from this thread, whatever the sink's state; a full pipe
        is waited on for at most ``timeout`` s (writes of at most PIPE_BUF bytes after poll
        says there is room, so none blocks). True when all of it was written."""
        deadline = time.monotonic() + timeout
        view = memoryview(data)
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                ready = poller.poll(left * 1000)
            except InterruptedError:
                continue
            if not ready:
                return False
            if ready[0][1] & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                return False
            try:
                n = os.write(self.fd, view[:select.PIPE_BUF])
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return False
            view = view[n:]
        return True


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
_console = False  # lines are rendered for a terminal rather than as JSON


def fatal(event: str, **fields: Any) -> None:
    """Log the reason the process is about to exit and make sure it reaches stderr now.

    Queued lines go first (the writer thread gets a bounded time to empty the queue), then
    this line is written synchronously to fd 2, bypassing the queue, even when the sink is
    full or marked dead. With stderr on a regular file it is one ordinary inline line."""
    sink = _sink
    if sink is None or (sink.inline and not sink.dead):
        structlog.get_logger("qwenctxd").error(event, **fields)
        return
    sink.flush(EXIT_FLUSH_S)
    if _console:
        extra = " ".join(f"{k}={v}" for k, v in fields.items() if k != "message")
        line = f"qwenctxd: {fields.get('message') or event}" + (f" ({extra})" if extra else "")
    else:
        stamp = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
        line = json.dumps({"event": event, **fields, "level": "error", "timestamp": stamp},
                          default=str, ensure_ascii=False)
    sink.write_now(line.encode("utf-8", "replace") + b"\n", FATAL_WRITE_S)


def flush_at_exit() -> None:
    """Give queued lines a bounded time to reach a slow pipe before the process goes."""
    if _sink is not None and not _sink.inline:
        _sink.flush(EXIT_FLUSH_S)


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
    global debug_enabled, _sink, _console
    ensure_standard_fds()
    lvl = LEVELS.get(level, logging.INFO)
    debug_enabled = lvl <= logging.DEBUG
    if _sink is None:
        _sink = StderrSink(2)
        atexit.register(flush_at_exit)
    try:
        tty = os.isatty(2)
    except OSError:
        tty = False
    use_console = fmt == "console" or (fmt == "auto" and tty)
    _console = use_console
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
