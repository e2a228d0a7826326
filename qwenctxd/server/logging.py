"""Logging set-up: structlog events as JSON lines on stderr (journald keeps them).

On a terminal (``make run``) the console renderer is used instead unless ``log_format=json``.
Stdlib loggers (jsonrpcserver, aiosqlite, watchfiles) are routed through the same renderer so
every line of the daemon's stderr is one JSON object.
"""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


debug_enabled = False  # hot paths check this before building a debug event


def configure(level: str = "info", fmt: str = "auto") -> None:
    global debug_enabled
    lvl = LEVELS.get(level, logging.INFO)
    debug_enabled = lvl <= logging.DEBUG
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
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
    structlog.configure(
        processors=[*shared, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
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
