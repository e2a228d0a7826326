"""Human output of qwenctl: rich tables on a terminal, plain aligned text when piped.

rich is imported only when stdout is a TTY, so piped and ``--json`` runs stay fast.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO


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


# -- prompt / instructions --------------------------------------------------------------------
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


def _problems(stream: TextIO, errors: list[dict[str, Any]], cwd: str, home: str | None) -> None:
    if not errors:
        _line(stream, "problems: none")
        return
    table_to(stream, "problems",
             [(e["kind"], short_path(e["path"], cwd, home), e["message"]) for e in errors],
             ("kind", "path", "message"), nowrap=(1,))


def _where(cwd: str, root: str | None, home: str | None) -> str:
    where = short_path(cwd, None, home)
    return f"{where} (project root {short_path(root, None, home)})" if root else \
        f"{where} (no project root)"


def prompt_report(res: dict[str, Any], *, cwd: str, home: str | None,
                  stream: TextIO | None = None) -> None:
    """The summary of a ``prompt.system`` result: sections, total, files, hash, problems."""
    out = stream or sys.stderr
    _line(out, f"system prompt for {_where(cwd, res.get('project_root'), home)}")
    rows = [(s["name"], str(s["chars"]), str(s["est_tokens"])) for s in res["sections"]]
    rows.append(("total", str(sum(s["chars"] for s in res["sections"])),
                 str(sum(s["est_tokens"] for s in res["sections"]))))
    table_to(out, "sections", rows, ("section", "chars", "est_tokens"), right=(1, 2))
    if res["files"]:
        table_to(out, "files", [(f["type"], short_path(f["path"], cwd, home))
                                for f in res["files"]], nowrap=(1,))
    else:
        _line(out, "files: none")
    _line(out, f"prefix hash: {res['prefix_hash'][:16]}")
    _problems(out, res.get("errors") or [], cwd, home)


def instructions_report(res: dict[str, Any], *, cwd: str, home: str | None,
                        stream: TextIO | None = None) -> None:
    """The ``instructions.files`` result: files in load order with their imports, rules,
    problems."""
    out = stream or sys.stdout
    _line(out, f"instructions for {_where(cwd, res.get('project_root'), home)}")
    if res["files"]:
        rows: list[tuple[str, ...]] = []
        for n, f in enumerate(res["files"], 1):
            note = "truncated at the size cap" if f.get("truncated") else ""
            rows.append((str(n), f["type"], short_path(f["path"], cwd, home),
                         human_bytes(f["bytes"]), note))
            for imp in f.get("imports") or []:
                rows.append(("", "", "  imports " + short_path(imp, cwd, home), "", ""))
        table_to(out, "files (load order)", rows, ("#", "type", "path", "size", "note"),
                 right=(0, 3), nowrap=(2,))
    else:
        _line(out, "files: none")
    if res.get("rules"):
        table_to(out, "rules", [
            ("conditional" if r["conditional"] else "baseline", short_path(r["path"], cwd, home),
             human_bytes(r["bytes"]), ", ".join(r["paths"]) if r["conditional"] else "always")
            for r in res["rules"]
        ], ("kind", "path", "size", "applies to"), right=(2,), nowrap=(1,))
    else:
        _line(out, "rules: none")
    _problems(out, res.get("errors") or [], cwd, home)


# -- sessions ---------------------------------------------------------------------------------
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


# -- skills -----------------------------------------------------------------------------------
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


def skill_applies(s: dict[str, Any]) -> str:
    """``"always"`` for an unconditional skill, else its globs."""
    if not s.get("conditional"):
        return "always"
    return ", ".join(s.get("paths") or []) or "(no valid globs)"


def skills_report(res: dict[str, Any], *, cwd: str, home: str | None,
                  stream: TextIO | None = None) -> None:
    """The ``skills.list`` result: skills (first description line, cut to fit), the skills
    they shadow, and load errors."""
    out = stream or sys.stdout
    _line(out, f"skills for {short_path(cwd, None, home)}")
    skills = res.get("skills") or []
    if skills:
        headers = ("name", "level", "applies to", "model-invocable", "description")
        rows = [(s["name"], s["level"], skill_applies(s),
                 "yes" if s.get("model_invocable", True) else "no",
                 first_line(s.get("description") or "")) for s in skills]
        room = _last_column_width(out, rows, headers)
        rows = [(*r[:-1], truncate(r[-1], room)) for r in rows]
        table_to(out, f"skills ({len(skills)})", rows, headers, nowrap=(0, 4))
    else:
        _line(out, "skills: none")
    shadowed = res.get("shadowed") or []
    if shadowed:
        table_to(out, "shadowed (a higher level has a skill of the same name)",
                 [(s["name"], s["level"], short_path(s["path"], cwd, home)) for s in shadowed],
                 ("name", "level", "path"), nowrap=(0, 2))
    else:
        _line(out, "shadowed: none")
    errors = res.get("errors") or []
    if errors:
        table_to(out, "errors",
                 [(short_path(e["path"], cwd, home), e["message"]) for e in errors],
                 ("path", "message"), nowrap=(0,))
    else:
        _line(out, "errors: none")


def skill_detail(info: dict[str, Any] | None, loaded: dict[str, Any],
                 shadowed: list[dict[str, Any]], *, cwd: str, home: str | None,
                 stream: TextIO | None = None) -> None:
    """One skill: its ``skills.list`` metadata, what it shadows, then the full text
    ``skills.load`` returns (verbatim, after a blank line)."""
    out = stream or sys.stdout
    rows: list[tuple[str, ...]] = [("name", loaded["name"])]
    if info is not None:
        rows += [
            ("level", info["level"]),
            ("path", short_path(info["path"], cwd, home)),
        ]
    rows.append(("base dir", short_path(loaded["base_dir"], cwd, home)))
    if info is not None:
        rows += [
            ("applies to", skill_applies(info)),
            ("model-invocable", "yes" if info.get("model_invocable", True) else "no"),
        ]
        desc = [ln.strip() for ln in (info.get("description") or "").splitlines() if ln.strip()]
        rows += [("description" if i == 0 else "", ln) for i, ln in enumerate(desc or ["-"])]
    lw = max((len(s["level"]) for s in shadowed), default=0)
    for i, s in enumerate(shadowed):
        rows.append(("shadows" if i == 0 else "",
                     f"{s['level'].ljust(lw)}  {short_path(s['path'], cwd, home)}"))
    table_to(out, f"skill {loaded['name']}", rows, nowrap=(0,))
    content = loaded["content"]
    out.write("\n" + content + ("" if content.endswith("\n") else "\n"))


# -- memory -----------------------------------------------------------------------------------
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


def memory_problems(stream: TextIO, problems: list[dict[str, Any]], cwd: str | None,
                    home: str | None) -> None:
    """Memory files that could not be read (``{path, message}``), or ``problems: none``."""
    if not problems:
        _line(stream, "problems: none")
        return
    table_fold_to(stream, f"problems ({len(problems)})",
                  [(short_path(p["path"], cwd, home), p.get("message") or "") for p in problems],
                  ("path", "message"), fold=(0,))


def memory_list_report(res: dict[str, Any], *, cwd: str, scope: str | None,
                       home: str | None, stream: TextIO | None = None) -> None:
    """The ``memory.list`` result: scope, type, name, age, hits and path of every memory file,
    then the problems."""
    out = stream or sys.stdout
    title = f"memories for {short_path(cwd, None, home)}"
    if scope:
        title += f" (scope {scope})"
    docs = res.get("docs") or []
    if docs:
        rows = [(d["scope"], d["type"], d["name"], d["age"], str(d.get("hits", 0)),
                 short_path(d["path"], None, home)) for d in docs]
        table_fold_to(out, f"{title}: {len(docs)}", rows,
                      ("scope", "type", "name", "age", "hits", "path"), right=(4,),
                      nowrap=(0, 1, 3, 4), fold=(5,))
    else:
        _line(out, f"{title}: none")
    memory_problems(out, res.get("problems") or [], None, home)


def memory_recall_report(res: dict[str, Any], *, home: str | None, show_prompt: bool = False,
                         stream: TextIO | None = None) -> None:
    """The ``memory.recall`` result: the strategy (and why it fell back), the recalled
    documents with their lexical scores, and with ``show_prompt`` the rendered block."""
    out = stream or sys.stdout
    line = f"strategy: {res['strategy']}"
    if res.get("fell_back"):
        line += f" (fell back: {res['fell_back']})"
    _line(out, line)
    docs = res.get("docs") or []
    if docs:
        rows = [(str(n), d["scope"], d["type"], d["name"],
                 "-" if d.get("score") is None else f"{d['score']:.3f}",
                 short_path(d["path"], None, home)) for n, d in enumerate(docs, 1)]
        table_fold_to(out, f"recalled: {len(docs)}", rows,
                      ("#", "scope", "type", "name", "score", "path"), right=(0, 4),
                      nowrap=(0, 1, 2, 4), fold=(5,))
    else:
        _line(out, "recalled: none")
    if show_prompt:
        prompt = res.get("prompt") or ""
        if prompt:
            out.write("\n" + prompt + ("" if prompt.endswith("\n") else "\n"))
        else:
            _line(out, "prompt: (empty)")


def memory_candidates(candidates: list[dict[str, Any]], *, query: str, home: str | None,
                      stream: TextIO | None = None) -> None:
    """``memory.forget_candidates``, numbered (the numbers ``--pick`` takes)."""
    out = stream or sys.stdout
    n = len(candidates)
    rows = [(str(i), c["scope"], c["name"], c["reason"], short_path(c["path"], None, home))
            for i, c in enumerate(candidates, 1)]
    table_fold_to(out, f"{n} {'memory matches' if n == 1 else 'memories match'} {query!r}",
                  rows, ("#", "scope", "name", "reason", "path"), right=(0,), nowrap=(0, 1),
                  fold=(4,))


def _when(value: str | None) -> str:
    ts = parse_iso(value)
    if ts is None:
        return value or "never"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ts))} ({relative_time(value)})"


def memory_cursor(cursor: dict[str, Any] | None) -> str:
    """The extract cursor (``{sessionId, processedOffset, updatedAt}``) in words."""
    cursor = cursor or {}
    sid = cursor.get("sessionId")
    if not sid:
        return "nothing extracted yet"
    line = f"session {str(sid)[:8]}"
    if cursor.get("processedOffset") is not None:
        line += f" up to message {cursor['processedOffset']}"
    if parse_iso(cursor.get("updatedAt")) is not None:
        line += f", {relative_time(cursor.get('updatedAt'))}"
    return line


def memory_status_report(res: dict[str, Any], *, cwd: str, home: str | None,
                         stream: TextIO | None = None) -> None:
    """The ``memory.status`` result: roots, counts per scope, index size, last dream, extract
    cursor, lock; then the problems."""
    out = stream or sys.stdout
    roots = res.get("roots") or {}
    counts = res.get("counts") or {}
    rows: list[tuple[str, ...]] = []
    for scope in ("project", "user", "team"):
        root = roots.get(scope)
        rows.append((f"{scope} root", short_path(root, None, home) if root else "-"))
    scopes = [s for s in ("project", "user", "team") if roots.get(s) or counts.get(s)]
    scopes += sorted(s for s in counts if s not in scopes)
    total = sum(int(v) for v in counts.values())
    rows.append(("memories", ", ".join(f"{s} {counts.get(s, 0)}" for s in scopes)
                 + f" ({total} total)"))
    rows.append(("index size", f"{human_bytes(int(res.get('index_bytes') or 0))} (MEMORY.md)"))
    rows.append(("last dream", _when(res.get("last_dream_at"))))
    if res.get("sessions_since_dream") is not None:
        rows.append(("sessions since dream", str(res["sessions_since_dream"])))
    rows.append(("extract cursor", memory_cursor(res.get("cursor"))))
    lock = res.get("lock")
    rows.append(("lock", ", ".join(f"{k}={v}" for k, v in lock.items()) if lock else "none"))
    table_to(out, f"memory status for {short_path(cwd, None, home)}", rows, nowrap=(0,))
    memory_problems(out, res.get("problems") or [], None, home)


# -- context ----------------------------------------------------------------------------------
# part name → (label, plain-text letter, rich colour)
CONTEXT_PARTS: dict[str, tuple[str, str, str]] = {
    "system_base": ("system base", "S", "blue"),
    "instructions": ("instructions", "I", "cyan"),
    "memory": ("memory", "M", "magenta"),
    "system_other": ("system other", "O", "bright_blue"),
    "tools": ("tools", "T", "yellow"),
    "skills": ("skills", "K", "bright_yellow"),
    "reminders": ("reminders", "N", "bright_magenta"),
    "history_user": ("user messages", "U", "green"),
    "history_assistant": ("assistant messages", "A", "bright_green"),
    "history_tool_results": ("tool results", "R", "red"),
}
CONTEXT_FREE = ("free", ".", "grey50")
CONTEXT_MARKS = (("warn", "W"), ("auto", "A"), ("hard", "H"))
CONTEXT_PIPED_WIDTH = 80
CONTEXT_MIN_WIDTH = 20


def context_part_style(name: str) -> tuple[str, str, str]:
    """(label, letter, colour) of a context part; unknown parts get ``?``."""
    return CONTEXT_PARTS.get(name, (name.replace("_", " "), "?", "white"))


def context_width(stream: TextIO, override: int | None = None) -> int:
    """Bar width: ``override``; else the terminal's width less a margin on a TTY; else 80."""
    import shutil

    if override is not None:
        return max(CONTEXT_MIN_WIDTH, override)
    if stream.isatty():
        return max(CONTEXT_MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns - 4)
    return CONTEXT_PIPED_WIDTH


def context_cells(tokens: list[int], window: int, width: int) -> tuple[list[int], int]:
    """Cells of a ``width``-cell bar for each part (≥ 1 when its tokens > 0) and the free
    remainder. The used cells follow ``sum(tokens) / window``; a full window fills the bar."""
    used_tok = sum(max(0, t) for t in tokens)
    nonzero = [i for i, t in enumerate(tokens) if t > 0]
    cells = [0] * len(tokens)
    if not nonzero:
        return cells, width
    share = used_tok / window if window > 0 else 1.0
    used = min(width, max(len(nonzero), round(share * width)))
    if used < len(nonzero):  # a bar narrower than the parts: the largest parts win
        for i in sorted(nonzero, key=lambda i: -tokens[i])[:used]:
            cells[i] = 1
        return cells, width - used
    exact = {i: tokens[i] * used / used_tok for i in nonzero}
    for i in nonzero:
        cells[i] = max(1, int(exact[i]))
    diff = used - sum(cells)
    if diff > 0:  # hand out the rest by largest remainder
        for i in sorted(nonzero, key=lambda i: exact[i] - cells[i], reverse=True)[:diff]:
            cells[i] += 1
    while diff < 0:  # the minimum of one cell overshot: take from the most over-served
        i = max((i for i in nonzero if cells[i] > 1), key=lambda i: cells[i] - exact[i])
        cells[i] -= 1
        diff += 1
    return cells, width - used


def context_marks(thresholds: dict[str, int], window: int, width: int) -> str:
    """The line under the bar: ``^W``, ``^A``, ``^H`` with the caret under the cell where the
    warn / auto / hard threshold falls; labels that would collide are nudged apart, never
    past the bar's end."""
    if window <= 0:
        return ""
    marks = []
    for key, letter in CONTEXT_MARKS:
        if key in thresholds:
            pos = min(width - 1, max(0, int(thresholds[key] * width / window)))
            marks.append((pos, "^" + letter))
    marks.sort(key=lambda m: m[0])
    starts = []
    cursor = 0
    for pos, label in marks:  # forward: no overlap
        start = max(pos, cursor)
        starts.append(start)
        cursor = start + len(label)
    limit = width
    for i in range(len(marks) - 1, -1, -1):  # backward: stay inside the bar
        starts[i] = max(0, min(starts[i], limit - len(marks[i][1])))
        limit = starts[i]
    line = [" "] * width
    for (_, label), start in zip(marks, starts, strict=True):
        for j, ch in enumerate(label):
            if start + j < width:
                line[start + j] = ch
    return "".join(line).rstrip()


def context_report(res: dict[str, Any], *, stream: TextIO | None = None,
                   width: int | None = None) -> None:
    """The ``session.context`` result: a one-line bar of the window split into its parts
    (colours on a TTY, one letter per part plus a legend when piped), the threshold markers
    under it, then a table of tokens and shares of the window."""
    out = stream or sys.stdout
    w = context_width(out, width)
    window = int(res.get("window_tokens") or 0)
    parts = res.get("parts") or []
    tokens = [int(p.get("tokens") or 0) for p in parts]
    cells, free_cells = context_cells(tokens, window, w)
    th = res.get("thresholds") or {}
    used = int(res.get("prompt_tokens") or 0)
    pct = f" ({100 * used / window:.1f}%)" if window else ""
    head = (f"context of session {str(res.get('session_id', ''))[:8]}: {used:,} / {window:,} "
            f"tokens{pct}, level {res.get('level', '?')}"
            + (", API-anchored" if res.get("anchored") else ", estimated"))
    marks = context_marks(th, window, w)
    th_line = "thresholds: " + "  ".join(
        f"^{letter} {key} {int(th[key]):,}" + (f" ({100 * th[key] / window:.0f}%)" if window
                                               else "")
        for key, letter in CONTEXT_MARKS if key in th)
    shown = [(p, c) for p, c in zip(parts, cells, strict=True) if c > 0]
    if out.isatty():
        from rich.console import Console
        from rich.text import Text

        console = Console(file=out, highlight=False)
        console.print(Text(head))
        bar = Text()
        for p, c in shown:
            bar.append("█" * c, style=context_part_style(p["name"])[2])
        bar.append("░" * free_cells, style="dim")
        console.print(bar, no_wrap=True, overflow="crop")
        console.print(Text(marks, style="bold"), no_wrap=True, overflow="crop")
        legend = Text()
        for p, _c in shown:
            label, _letter, colour = context_part_style(p["name"])
            legend.append("█ ", style=colour)
            legend.append(label + "  ")
        legend.append("░ ", style="dim")
        legend.append("free")
        console.print(legend)
        console.print(Text(th_line))
    else:
        bar_s = "".join(context_part_style(p["name"])[1] * c for p, c in shown)
        bar_s += CONTEXT_FREE[1] * free_cells
        legend_s = "legend: " + "  ".join(
            f"{context_part_style(p['name'])[1]}={context_part_style(p['name'])[0]}"
            for p in parts) + f"  {CONTEXT_FREE[1]}={CONTEXT_FREE[0]}"
        out.write("\n".join([head, bar_s, marks, legend_s, th_line]) + "\n")
    rows: list[tuple[str, ...]] = []
    for p in parts:
        label, letter, _colour = context_part_style(p["name"])
        t = int(p.get("tokens") or 0)
        rows.append((letter, label, f"{t:,}", f"{float(p.get('pct') or 0):.1f}%"))
    free = int(res.get("free_tokens") or 0)
    rows.append((CONTEXT_FREE[1], "free", f"{free:,}", f"{float(res.get('free_pct') or 0):.1f}%"))
    rows.append(("", "total in prompt", f"{used:,}",
                 f"{100 * used / window:.1f}%" if window else "-"))
    table_to(out, "parts", rows, ("", "part", "tokens", "% of window"), right=(2, 3),
             nowrap=(0, 1, 2, 3))
