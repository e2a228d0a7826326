"""Human output of ``qwenctl sessions``: the session list and one session's detail
(generic helpers live in :mod:`qwenctl.render`)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from qwenctl.render import (
    _line,
    parse_iso,
    relative_time,
    short_path,
    table_to,
)


def sessions_table(sessions: list[dict[str, Any]], *, title: str, home: str | None,
                   stream: TextIO | None = None) -> None:
    """``session.list`` rows: short id, updated, messages, open/closed, title, cwd."""
    out = stream or sys.stdout
    if not sessions:
        _line(out, f"{title}: none")
        return
    rows = [
        (s["session_id"][:8], relative_time(s.get("updated_at")), str(s.get("messages", 0)),
         "open" if s.get("open") else "closed", s.get("title") or "-",
         short_path(s["cwd"], None, home) if s.get("cwd") else "-")
        for s in sessions
    ]
    table_to(out, title, rows, ("id", "updated", "msgs", "state", "title", "cwd"),
             right=(2,), nowrap=(0, 1, 5))


def session_detail(row: dict[str, Any], live: dict[str, Any] | None, *, home: str | None,
                   stream: TextIO | None = None) -> None:
    """One session: its list row, plus model, tokens and level when open in the daemon."""
    out = stream or sys.stdout

    def when(value: str | None) -> str:
        ts = parse_iso(value)
        if ts is None:
            return value or "-"
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({relative_time(value)})"

    rows: list[tuple[str, ...]] = [
        ("id", row["session_id"]),
        ("cwd", short_path(row["cwd"], None, home) if row.get("cwd") else "-"),
        ("title", row.get("title") or "-"),
        ("messages", str(row.get("messages", 0))),
        ("started", when(row.get("started_at"))),
        ("updated", when(row.get("updated_at"))),
        ("state", "open in the daemon" if row.get("open") else "closed"),
    ]
    if live:
        used, window = int(live.get("prompt_tokens") or 0), int(live.get("window_tokens") or 0)
        pct = f" ({100 * used / window:.1f}%)" if window else ""
        rows += [
            ("model", str(live.get("model") or "-")),
            ("tokens", f"{used:,} / {window:,}{pct}"),
            ("level", str(live.get("level") or "-")),
        ]
    table_to(out, f"session {row['session_id'][:8]}", rows, nowrap=(0,))
