"""Human output of qwenctl: rich tables on a terminal, plain aligned text when piped.

rich is imported only when stdout is a TTY, so piped and ``--json`` runs stay fast.
"""

from __future__ import annotations

import sys
import time
from typing import Any


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


def status(st: dict[str, Any]) -> None:
    bg = st["background"]
    model = st.get("model") or {}
    cfg = st.get("config") or {}
    rows = [
        ("state", st.get("state", "?")),
        ("pid", str(st["pid"])),
        ("version", f"{st['version']} (protocol {st['protocol']})"),
        ("uptime", human_duration(st["uptime_s"])),
        ("socket", st["socket"] + ("  [socket-activated]" if st.get("activated") else "")),
        ("memory (RSS)", human_bytes(st["rss_bytes"])),
        ("connections", f"{st.get('connections', 0)} open, {st.get('requests', 0)} requests served"),
        ("sessions", str(len(st["sessions"]))),
        ("projects", str(len(st["projects"]))),
        ("background", f"{len(bg['in_flight'])} running, {bg['queued']} queued, "
                       f"{bg.get('completed', 0)} done, {bg.get('failed', 0)} failed"),
        ("last extract", ago(bg.get("last_extract_at"))),
        ("last dream", ago(bg.get("last_dream_at"))),
        ("model", _model_line(model)),
        ("config", f"generation {cfg.get('generation', 0)}, {len(cfg.get('files', []))} files"
                   + (f"; last error: {cfg['last_error']}" if cfg.get("last_error") else "")),
        ("watches", f"{st.get('inotify_watches', 0)} inotify watches"),
    ]
    table("qwenctxd status", rows)
    if st["sessions"]:
        table(
            "sessions",
            [
                (s["session_id"][:8], s["cwd"], s["model"], str(s["messages"]),
                 f"{s['prompt_tokens']}/{s['window_tokens']}", s["level"])
                for s in st["sessions"]
            ],
            ("id", "cwd", "model", "msgs", "tokens", "level"),
        )
    if bg["in_flight"]:
        table(
            "background jobs",
            [(str(t["id"]), t["kind"], t.get("project") or "-", ago(t["started_at"]))
             for t in bg["in_flight"]],
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
