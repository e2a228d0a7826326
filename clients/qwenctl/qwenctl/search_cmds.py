"""``qwenctl sessions search QUERY``: what was said in every past conversation, and the MCP
server's ``search_sessions`` tool (:func:`search_for_agent`).

The current project's sessions unless ``--all``; ``--role`` (repeatable) picks user, assistant
or tool entries, ``--since`` takes an ISO date or a span back from now (``3d``, ``12h``,
``2w``, ``30m``). The table shows the session's title, when, the role and the snippet (the
match highlighted on a TTY), then how to see a hit in its conversation:
``qwenctl sessions show ID --messages --around ENTRY``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from qwenctl import render
from qwenctl.cmdutil import home_dir
from qwenctl.daemon_link import EXIT_OK, EXIT_USAGE
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire

if TYPE_CHECKING:
    from qwenctl.context import Ctx

ROLES = ("user", "assistant", "tool")
_SPAN = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$")
_SPAN_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WORDS = re.compile(r'"([^"]+)"|(\S+)')


def add_parser(ss: Any, common: argparse.ArgumentParser) -> None:
    """Register ``sessions search`` on the ``sessions`` subparsers ``ss``."""
    se = ss.add_parser("search", parents=[common],
                       help="search what was said in past sessions (this project, or --all)")
    se.add_argument("query", metavar="QUERY", nargs="+",
                    help='words that must all occur; "a quoted phrase"; Chinese/Japanese text')
    se.add_argument("--all", action="store_true", default=argparse.SUPPRESS,
                    help="search the sessions of every project")
    se.add_argument("--cwd", default=argparse.SUPPRESS,
                    help="search the project of this directory (default: the current one)")
    se.add_argument("--role", action="append", choices=ROLES, dest="roles",
                    help="only entries of this role (repeatable; default: user and assistant)")
    se.add_argument("--since", metavar="WHEN",
                    help="only entries since WHEN: an ISO date/time, or 30m, 12h, 3d, 2w ago")
    se.add_argument("--limit", type=int, default=20, help="at most this many hits (1..100)")


def since_iso(value: str, now: float | None = None) -> str:
    """``value`` as the ISO-8601 time ``session.search`` takes: a span (``3d``) back from
    ``now``, or the value itself (the daemon checks it)."""
    m = _SPAN.match(value)
    if m is None:
        return value
    ts = (time.time() if now is None else now) - int(m.group(1)) * _SPAN_S[m.group(2)]
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def query_words(query: str) -> list[str]:
    """The words and phrases of ``query``, to highlight in snippets."""
    return [a or b for a, b in _WORDS.findall(query) if (a or b).strip('"')]


def cmd_search(ctx: Ctx) -> int:
    from qwenctl.context import emit_json

    a = ctx.args
    query = " ".join(a.query)
    if getattr(a, "all", False):
        cwd, scope = None, "all projects"
    else:
        cwd = os.path.abspath(a.cwd) if getattr(a, "cwd", None) else os.getcwd()
        scope = render.short_path(cwd, None, home_dir())
    if not 1 <= a.limit <= 100:
        sys.stderr.write("qwenctl: --limit must be 1..100\n")
        return EXIT_USAGE
    params = wire.SearchParams(query=query, cwd=cwd, roles=a.roles or ["user", "assistant"],
                               since=since_iso(a.since) if a.since else None, limit=a.limit)
    res = ctx.request(methods.SESSION_SEARCH, params)
    if a.json:
        emit_json(res)
        return EXIT_OK
    hits_table(res, query=query, scope=scope, stream=sys.stdout)
    return EXIT_OK


def _when(value: str | None) -> str:
    return render.relative_time(value) if value else "-"


def hits_table(res: wire.SearchResult, *, query: str, scope: str, stream: TextIO) -> None:
    """The hits as a table: session (title, short id), when, role, entry, snippet."""
    pending = res.indexed.pending
    note = f" — still indexing {pending} session(s)" if pending else ""
    title = f"{len(res.hits)} hit(s) for {query!r} in {scope}{note}"
    if not res.hits:
        stream.write(f"{title}\n")
        return
    headers = ("session", "when", "role", "entry", "snippet")
    rows = [(f"{h.title or '(untitled)'} [{h.session_id[:8]}]", _when(h.time), h.role,
             str(h.entry), h.snippet) for h in res.hits]
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(title=title, title_justify="left")
        for i, name in enumerate(headers):
            t.add_column(name, no_wrap=i in (1, 2, 3), justify="right" if i == 3 else "left")
        words = query_words(query)
        for row in rows:
            snippet = Text(row[4])
            snippet.highlight_words(words, style="bold yellow", case_sensitive=False)
            t.add_row(*(Text(c) for c in row[:4]), snippet)
        Console(file=stream).print(t)
    else:
        render.table_to(stream, title, rows, headers, right=(3,))
    first = res.hits[0]
    stream.write(f"\nshow a hit in its conversation: qwenctl sessions show "
                 f"{first.session_id[:8]} --messages --around {first.entry}\n")


def agent_params(query: str, *, limit: int, all_projects: bool, cwd: str) -> wire.SearchParams:
    """The MCP tool ``search_sessions``' arguments as ``session.search`` params."""
    return wire.SearchParams(query=query, cwd=None if all_projects else cwd,
                             limit=max(1, min(int(limit), 100)))


def agent_text(res: wire.SearchResult, query: str) -> str:
    """The hits as text for a model: one block per hit (session, entry, when, role, snippet)."""
    if not res.hits:
        return f"No past session mentions {query!r}."
    lines = [f"{len(res.hits)} past session entr{'y' if len(res.hits) == 1 else 'ies'} "
             f"matching {query!r} (best first):"]
    for h in res.hits:
        lines.append(f"- session {h.session_id} ({h.title or 'untitled'}; {h.cwd or '?'}), "
                     f"entry {h.entry}, {h.role}, {h.time or 'time unknown'}:\n  {h.snippet}")
    if res.indexed.pending:
        lines.append(f"(still indexing {res.indexed.pending} session file(s))")
    return "\n".join(lines)
