"""Human output of ``qwenctl sessions``: the session list and one session's detail
(generic helpers live in :mod:`qwenctl.render`)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from qwenctl.render import (
    _line,
    parse_iso,
    relative_time,
    short_path,
    table_to,
)

if TYPE_CHECKING:
    from qwenctxd.protocol.daemon import SessionSummary
    from qwenctxd.protocol.session import SessionInfo


def sessions_table(sessions: list[SessionInfo], *, title: str, home: str | None,
                   stream: TextIO | None = None) -> None:
    """``session.list`` rows: short id, updated, messages, open/closed, title, cwd."""
    out = stream or sys.stdout
    if not sessions:
        _line(out, f"{title}: none")
        return
    rows = [
        (s.session_id[:8], relative_time(s.updated_at), str(s.messages),
         "open" if s.open else "closed", s.title or "-",
         short_path(s.cwd, None, home) if s.cwd else "-")
        for s in sessions
    ]
    table_to(out, title, rows, ("id", "updated", "msgs", "state", "title", "cwd"),
             right=(2,), nowrap=(0, 1, 5))


def session_detail(row: SessionInfo, live: SessionSummary | None, *, home: str | None,
                   stream: TextIO | None = None) -> None:
    """One session: its list row, plus model, tokens and level when open in the daemon."""
    out = stream or sys.stdout

    def when(value: str | None) -> str:
        ts = parse_iso(value)
        if ts is None:
            return value or "-"
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({relative_time(value)})"

    rows: list[tuple[str, ...]] = [
        ("id", row.session_id),
        ("cwd", short_path(row.cwd, None, home) if row.cwd else "-"),
        ("title", row.title or "-"),
        ("messages", str(row.messages)),
        ("started", when(row.started_at)),
        ("updated", when(row.updated_at)),
        ("state", "open in the daemon" if row.open else "closed"),
    ]
    if live:
        used, window = live.prompt_tokens, live.window_tokens
        pct = f" ({100 * used / window:.1f}%)" if window else ""
        rows += [
            ("model", live.model or "-"),
            ("tokens", f"{used:,} / {window:,}{pct}"),
            ("level", live.level or "-"),
        ]
    table_to(out, f"session {row.session_id[:8]}", rows, nowrap=(0,))
