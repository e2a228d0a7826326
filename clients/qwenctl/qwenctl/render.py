"""Human output of qwenctl: rich tables on a terminal, plain aligned text when piped.

rich is imported only when stdout is a TTY, so piped and ``--json`` runs stay fast.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from qwenctxd.protocol.daemon import StatusResult


def is_tty() -> bool:
    return sys.stdout.isatty()


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def ago(ts: float | None) -> str:
    return "never" if not ts else human_duration(time.time() - ts) + " ago"


def table(title: str, rows: list[tuple[str, ...]], headers: tuple[str, ...] | None = None) -> None:
    """Print ``rows`` as a table: rich on a TTY, two-space aligned columns otherwise."""
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, show_header=headers is not None, title_justify="left")
        for h in headers or ("",) * (len(rows[0]) if rows else 1):
            t.add_column(h)
        for row in rows:
            t.add_row(*row)
        Console().print(t)
        return
    out = [title]
    all_rows = ([headers] if headers else []) + rows
    if all_rows:
        widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
        for r in all_rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    sys.stdout.write("\n".join(out) + "\n")


def status(st: StatusResult) -> None:
    """``daemon.status`` for people: the daemon, its sessions and its background jobs."""
    bg = st.background
    model = st.model
    cfg = st.config
    rows = [
        ("state", st.state),
        ("pid", str(st.pid)),
        ("version", f"{st.version} (protocol {st.protocol})"),
        ("uptime", human_duration(st.uptime_s)),
        ("socket", st.socket + ("  [socket-activated]" if st.activated else "")),
        ("memory (RSS)", human_bytes(st.rss_bytes)),
        ("connections", f"{st.connections} open, {st.requests} requests served"),
        ("sessions", str(len(st.sessions))),
        ("projects", str(len(st.projects))),
        ("background", f"{len(bg.in_flight)} running, {bg.queued} queued, "
                       f"{bg.completed} done, {bg.failed} failed"),
        ("last extract", ago(bg.last_extract_at)),
        ("last dream", ago(bg.last_dream_at)),
        ("model", _model_line(model)),
        *([("endpoint quirks", ", ".join(model["quirks"]))] if model.get("quirks") else []),
        *([("last failure", f"{bg.recent_failures[-1].kind}: {bg.recent_failures[-1].cause}")]
          if bg.recent_failures else []),
        ("config", f"generation {cfg.generation if cfg else 0}, "
                   f"{len(cfg.files) if cfg else 0} files"
                   + (f"; last error: {cfg.last_error}" if cfg and cfg.last_error else "")),
        ("watches", f"{st.inotify_watches} inotify watches"),
    ]
    table("qwenctxd status", rows)
    if st.sessions:
        table(
            "sessions",
            [
                (s.session_id[:8], s.cwd, s.model, str(s.messages),
                 f"{s.prompt_tokens}/{s.window_tokens}", s.level)
                for s in st.sessions
            ],
            ("id", "cwd", "model", "msgs", "tokens", "level"),
        )
    if bg.in_flight:
        table(
            "background jobs",
            [(str(t.id), t.kind, t.project or "-", ago(t.started_at)) for t in bg.in_flight],
            ("id", "kind", "project", "started"),
        )


def _model_line(model: dict[str, Any]) -> str:
    if not model.get("configured"):
        return "not configured (set OPENAI_BASE_URL and OPENAI_MODEL)"
    line = f"{model.get('model')} at {model.get('base_url')}"
    if model.get("fast_model"):
        line += f" (fast: {model['fast_model']})"
    if model.get("last_error"):
        line += f"; last error: {model['last_error']}"
    return line


# -- tables and paths -------------------------------------------------------------------------
def table_to(
    stream: TextIO,
    title: str,
    rows: list[tuple[str, ...]],
    headers: tuple[str, ...] | None = None,
    *,
    right: tuple[int, ...] = (),
    nowrap: tuple[int, ...] = (),
    indent: int = 2,
) -> None:
    """Like :func:`table` but on ``stream``: rich when that stream is a TTY, else two-space
    aligned columns under a title line (rows indented by ``indent``). Columns whose index is
    in ``right`` are right-aligned; rich never wraps those in ``nowrap``. Cells are never read
    as rich markup."""
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        ncols = len(headers) if headers else (len(rows[0]) if rows else 1)
        t = Table(title=title, show_header=headers is not None, title_justify="left")
        for i in range(ncols):
            t.add_column(headers[i] if headers else "", no_wrap=i in nowrap,
                         justify="right" if i in right else "left")
        for row in rows:
            t.add_row(*(Text(c) for c in row))
        Console(file=stream).print(t)
        return
    out = [title]
    all_rows = ([headers] if headers else []) + rows
    if all_rows:
        widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]
        for r in all_rows:
            cells = [c.rjust(w) if i in right else c.ljust(w)
                     for i, (c, w) in enumerate(zip(r, widths, strict=True))]
            out.append((" " * indent + "  ".join(cells)).rstrip())
    stream.write("\n".join(out) + "\n")


def short_path(path: str, cwd: str | None = None, home: str | None = None) -> str:
    """``path`` relative when under ``cwd``, ``~/…`` when under ``home``, else absolute.

    Compared lexically first, then with symlinks resolved (``/tmp`` → ``/private/tmp``)."""
    p = os.path.normpath(path)
    for base, prefix in ((cwd, ""), (home, "~")):
        if not base:
            continue
        b = os.path.normpath(base)
        for pp, bb in ((p, b), (os.path.realpath(p), os.path.realpath(b))):
            if pp == bb:
                return prefix or "."
            if pp.startswith(bb.rstrip(os.sep) + os.sep):
                rel = os.path.relpath(pp, bb)
                return f"{prefix}/{rel}" if prefix else rel
    return p


def _line(stream: TextIO, text: str) -> None:
    stream.write(text + "\n")


# -- timestamps -------------------------------------------------------------------------------
def parse_iso(value: str | None) -> float | None:
    """An ISO-8601 timestamp (``…Z`` allowed) as epoch seconds; ``None`` when absent or bad."""
    if not value:
        return None
    from datetime import UTC, datetime

    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def relative_time(value: str | None, now: float | None = None) -> str:
    """``"45s ago"``, ``"5m ago"``, ``"3h ago"``, ``"2d ago"``; a date past 30 days; ``"-"``."""
    ts = parse_iso(value)
    if ts is None:
        return "-"
    delta = (time.time() if now is None else now) - ts
    if delta < 0:
        return "just now" if delta > -60 else time.strftime("%Y-%m-%d", time.localtime(ts))
    for limit, unit, size in ((60, "s", 1), (3600, "m", 60), (86400, "h", 3600),
                              (30 * 86400, "d", 86400)):
        if delta < limit:
            return f"{int(delta // size)}{unit} ago"
    return time.strftime("%Y-%m-%d", time.localtime(ts))


# -- fitting text -----------------------------------------------------------------------------
def truncate(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``…`` when cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…" if width > 0 else ""


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped (``""`` when there is none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _fit_width(stream: TextIO) -> int:
    """Columns to fit in: the terminal's (``COLUMNS`` wins); 100 when not a terminal."""
    import shutil

    if stream.isatty():  # the width rich will lay the table out in (COLUMNS honoured)
        from rich.console import Console

        return Console(file=stream).width
    return shutil.get_terminal_size((100, 24)).columns  # COLUMNS, else 100


def _last_column_width(stream: TextIO, rows: list[tuple[str, ...]], headers: tuple[str, ...],
                       indent: int = 2, minimum: int = 16) -> int:
    """Room left for the last column once the others (and the table chrome) are laid out."""
    n = len(headers)
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(n - 1)]
    # rich: one space of padding either side of every cell plus n + 1 vertical rules;
    # plain: the indent plus two spaces between columns
    chrome = 3 * n + 1 if stream.isatty() else indent + 2 * (n - 1)
    return max(minimum, _fit_width(stream) - chrome - sum(widths))


# -- folding tables ---------------------------------------------------------------------------
def table_fold_to(
    stream: TextIO,
    title: str,
    rows: list[tuple[str, ...]],
    headers: tuple[str, ...],
    *,
    right: tuple[int, ...] = (),
    nowrap: tuple[int, ...] = (),
    fold: tuple[int, ...] = (),
) -> None:
    """:func:`table_to`, except that on a TTY the columns in ``fold`` (paths) are folded onto
    more lines instead of being cut with an ellipsis, so every character stays visible."""
    if not stream.isatty():
        table_to(stream, title, rows, headers, right=right, nowrap=nowrap)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    for i, h in enumerate(headers):
        t.add_column(h, no_wrap=i in nowrap, justify="right" if i in right else "left",
                     overflow="fold" if i in fold else "ellipsis")
    for row in rows:
        t.add_row(*(Text(c) for c in row))
    Console(file=stream).print(t)


# -- command-family renderers -----------------------------------------------------------------
# They live in sibling modules (render_instructions, render_sessions, render_skills,
# render_memory, render_context) that import the helpers above; they stay reachable as
# ``render.<name>`` / ``from qwenctl.render import <name>``. Resolved lazily, because those
# modules import this one.
_MOVED: dict[str, str] = {
    "_problems": "render_instructions",
    "_where": "render_instructions",
    "prompt_report": "render_instructions",
    "instructions_report": "render_instructions",
    "sessions_table": "render_sessions",
    "session_detail": "render_sessions",
    "skill_applies": "render_skills",
    "skills_report": "render_skills",
    "skill_detail": "render_skills",
    "memory_problems": "render_memory",
    "memory_list_report": "render_memory",
    "memory_recall_report": "render_memory",
    "memory_candidates": "render_memory",
    "_when": "render_memory",
    "memory_cursor": "render_memory",
    "memory_status_report": "render_memory",
    "CONTEXT_PARTS": "render_context",
    "CONTEXT_FREE": "render_context",
    "CONTEXT_MARKS": "render_context",
    "CONTEXT_PIPED_WIDTH": "render_context",
    "CONTEXT_MIN_WIDTH": "render_context",
    "context_part_style": "render_context",
    "context_width": "render_context",
    "context_cells": "render_context",
    "context_marks": "render_context",
    "context_report": "render_context",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"qwenctl.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_MOVED])
