"""Human output of ``qwenctl memory``: list, recall, forget candidates and status
(generic helpers live in :mod:`qwenctl.render`)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from qwenctl.render import (
    _line,
    human_bytes,
    parse_iso,
    relative_time,
    short_path,
    table_fold_to,
    table_to,
)

if TYPE_CHECKING:
    from qwenctxd.protocol.memory import Candidate, ListResult, RecallResult, StatusResult


def memory_problems(stream: TextIO, problems: list[dict[str, str]], cwd: str | None,
                    home: str | None) -> None:
    """Memory files that could not be read (``{path, message}``), or ``problems: none``."""
    if not problems:
        _line(stream, "problems: none")
        return
    table_fold_to(stream, f"problems ({len(problems)})",
                  [(short_path(p["path"], cwd, home), p.get("message") or "") for p in problems],
                  ("path", "message"), fold=(0,))


def memory_list_report(res: ListResult, *, cwd: str, scope: str | None,
                       home: str | None, stream: TextIO | None = None) -> None:
    """The ``memory.list`` result: scope, type, name, age, hits and path of every memory file,
    then the problems."""
    out = stream or sys.stdout
    title = f"memories for {short_path(cwd, None, home)}"
    if scope:
        title += f" (scope {scope})"
    docs = res.docs
    if docs:
        rows = [(d.scope, d.type, d.name, d.age, str(d.hits), short_path(d.path, None, home))
                for d in docs]
        table_fold_to(out, f"{title}: {len(docs)}", rows,
                      ("scope", "type", "name", "age", "hits", "path"), right=(4,),
                      nowrap=(0, 1, 3, 4), fold=(5,))
    else:
        _line(out, f"{title}: none")
    memory_problems(out, res.problems, None, home)


def memory_recall_report(res: RecallResult, *, home: str | None, show_prompt: bool = False,
                         explain: bool = False, stream: TextIO | None = None) -> None:
    """The ``memory.recall`` result: the strategy (and why it fell back), the recalled
    documents with their lexical scores, with ``explain`` each tier's status and time and each
    document's rank in every tier, and with ``show_prompt`` the rendered block."""
    out = stream or sys.stdout
    line = f"strategy: {res.strategy}"
    if res.fell_back:
        line += f" (fell back: {res.fell_back})"
    _line(out, line)
    if explain:
        for t in res.tiers:
            extra = f" ({t.detail})" if t.detail else ""
            models = f" [{', '.join(t.models)}]" if t.models else ""
            _line(out, f"tier {t.name}: {t.status}{models} {t.ms:.1f} ms{extra}")
    docs = res.docs
    if docs and explain:
        rows = []
        for n, d in enumerate(docs, 1):
            w = d.why
            rows.append((str(n), _opt(w.lexical_rank if w else None),
                         "-" if w is None or w.semantic is None else f"{w.semantic:.3f}",
                         _opt(w.selector_rank if w else None), d.scope, d.name,
                         short_path(d.path, None, home)))
        table_fold_to(out, f"recalled: {len(docs)}", rows,
                      ("final", "lexical", "similarity", "selector", "scope", "name", "path"),
                      right=(0, 1, 2, 3), nowrap=(0, 1, 2, 3, 4), fold=(6,))
    elif docs:
        rows = [(str(n), d.scope, d.type, d.name, "-" if d.score is None else f"{d.score:.3f}",
                 short_path(d.path, None, home)) for n, d in enumerate(docs, 1)]
        table_fold_to(out, f"recalled: {len(docs)}", rows,
                      ("#", "scope", "type", "name", "score", "path"), right=(0, 4),
                      nowrap=(0, 1, 2, 4), fold=(5,))
    else:
        _line(out, "recalled: none")
    if show_prompt:
        prompt = res.prompt or ""
        if prompt:
            out.write("\n" + prompt + ("" if prompt.endswith("\n") else "\n"))
        else:
            _line(out, "prompt: (empty)")


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def memory_candidates(candidates: list[Candidate], *, query: str, home: str | None,
                      stream: TextIO | None = None) -> None:
    """``memory.forget_candidates``, numbered (the numbers ``--pick`` takes)."""
    out = stream or sys.stdout
    n = len(candidates)
    rows = [(str(i), c.scope, c.name, c.reason, short_path(c.path, None, home))
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


def memory_status_report(res: StatusResult, *, cwd: str, home: str | None,
                         stream: TextIO | None = None) -> None:
    """The ``memory.status`` result: roots, counts per scope, index size, last dream, extract
    cursor, lock; then the problems."""
    out = stream or sys.stdout
    roots = res.roots
    counts = res.counts
    rows: list[tuple[str, ...]] = []
    for scope in ("project", "user", "team"):
        root = roots.get(scope)
        rows.append((f"{scope} root", short_path(root, None, home) if root else "-"))
    scopes = [s for s in ("project", "user", "team") if roots.get(s) or counts.get(s)]
    scopes += sorted(s for s in counts if s not in scopes)
    total = sum(int(v) for v in counts.values())
    rows.append(("memories", ", ".join(f"{s} {counts.get(s, 0)}" for s in scopes)
                 + f" ({total} total)"))
    rows.append(("index size", f"{human_bytes(res.index_bytes)} (MEMORY.md)"))
    rows.append(("last dream", _when(res.last_dream_at)))
    if res.sessions_since_dream is not None:
        rows.append(("sessions since dream", str(res.sessions_since_dream)))
    rows.append(("extract cursor", memory_cursor(res.cursor)))
    lock = res.lock
    rows.append(("lock", ", ".join(f"{k}={v}" for k, v in lock.items()) if lock else "none"))
    table_to(out, f"memory status for {short_path(cwd, None, home)}", rows, nowrap=(0,))
    memory_problems(out, res.problems, None, home)
