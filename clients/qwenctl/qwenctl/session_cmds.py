"""``qwenctl sessions``: list, inspect, recap, delete and summarise recorded sessions.

``list`` (the default) shows the sessions of the current directory, or of every project with
``--all``. The other subcommands take a session id or any unique prefix of one, resolved
against every project's sessions. ``recap`` and ``summary`` need the session open in the
daemon; a closed one is resumed for the call and closed again afterwards, so no half-configured
session (model "unknown", no tools) stays resident for a real client to pick up.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, TypeVar

from qwenctl import render, render_sessions, search_cmds
from qwenctl.cmdutil import emit_result, home_dir
from qwenctl.context import emit_json, wire
from qwenctl.daemon_link import EXIT_DAEMON_ERROR, EXIT_OK
from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as swire

if TYPE_CHECKING:
    from qwenctl.context import Ctx
    from qwenctxd.protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")

UNKNOWN_MODEL = "unknown"


class Resolve(Exception):
    """A session id prefix matched no session, or more than one."""

    def __init__(self, message: str, matches: list[str]) -> None:
        super().__init__(message)
        self.matches = matches


# -- parser -----------------------------------------------------------------------------------
def _scope(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    # SUPPRESS: `sessions --all` and `sessions list --all` both land in the same attribute
    # without the subparser's default overwriting the parent's value
    g.add_argument("--cwd", default=argparse.SUPPRESS,
                   help="list the sessions of this directory (default: the current one)")
    g.add_argument("--all", action="store_true", default=argparse.SUPPRESS,
                   help="list the sessions of every project")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``sessions`` and its subcommands on the top-level subparsers ``sub``."""
    s = sub.add_parser("sessions", parents=[common],
                       help="recorded sessions: list, search, show, title, recap, delete, summary")
    _scope(s)
    ss = s.add_subparsers(dest="sessions_command", metavar="SUBCOMMAND")
    ls = ss.add_parser("list", parents=[common],
                       help="sessions of the current directory (or --cwd DIR, or --all)")
    _scope(ls)
    sh = ss.add_parser("show", parents=[common], help="one session's details")
    sh.add_argument("session", metavar="ID", help="session id or a unique prefix of one")
    sh.add_argument("--messages", action="store_true",
                    help="also print the transcript (long tool output shortened; --full)")
    sh.add_argument("--full", action="store_true", help="with --messages: nothing shortened")
    sh.add_argument("--around", type=int, metavar="ENTRY",
                    help="with --messages: only the entries around ENTRY (a search hit's)")
    ti = ss.add_parser("title", parents=[common],
                       help="give a session your own title (kept over the automatic one)")
    ti.add_argument("session", metavar="ID", help="session id or a unique prefix of one")
    ti.add_argument("title", metavar="TITLE", nargs="+", help="the new title")
    rc = ss.add_parser("recap", parents=[common], help='a short "where were we" note')
    rc.add_argument("session", metavar="ID", help="session id or a unique prefix of one")
    de = ss.add_parser("delete", parents=[common], help="delete a session's record")
    de.add_argument("session", metavar="ID", help="session id or a unique prefix of one")
    de.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    su = ss.add_parser("summary", parents=[common],
                       help="write <project>/.qwen/PROJECT_SUMMARY.md and print it")
    su.add_argument("session", metavar="ID", help="session id or a unique prefix of one")
    search_cmds.add_parser(ss, common)


# -- helpers ----------------------------------------------------------------------------------

def _err(text: str) -> None:
    sys.stderr.write(f"qwenctl: {text}\n")


def _fail(ctx: Ctx, message: str, **data: Any) -> int:
    _err(message)
    if ctx.args.json:
        emit_json({"error": {"code": None, "message": message, "data": data or None}})
    return EXIT_DAEMON_ERROR


def resolve(rows: list[swire.SessionInfo], ref: str) -> swire.SessionInfo:
    """The row whose id is ``ref`` or starts with it (case-insensitive); else :class:`Resolve`."""
    key = ref.strip().lower()
    if not key:
        raise Resolve("an empty session id matches nothing", [])
    exact = [r for r in rows if r.session_id.lower() == key]
    if exact:
        return exact[0]
    found = [r for r in rows if r.session_id.lower().startswith(key)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise Resolve(f"no session matches {ref!r} (see `qwenctl sessions --all`)", [])
    ids = [r.session_id for r in found]
    shown = ", ".join(ids[:5]) + (f", … ({len(ids) - 5} more)" if len(ids) > 5 else "")
    raise Resolve(f"session id prefix {ref!r} is ambiguous: it matches {len(ids)} sessions "
                  f"({shown}); give more characters", ids)


def sessions(ctx: Ctx) -> list[swire.SessionInfo]:
    """Every project's recorded sessions (``session.list`` without a cwd)."""
    return ctx.request(methods.SESSION_LIST, swire.ListParams()).sessions


def _row(ctx: Ctx) -> swire.SessionInfo:
    return resolve(sessions(ctx), ctx.args.session)


def _live(ctx: Ctx, session_id: str) -> dwire.SessionSummary | None:
    """The session's entry in ``daemon.status`` when it is open there."""
    for s in ctx.request(methods.DAEMON_STATUS).sessions:
        if s.session_id == session_id:
            return s
    return None


def with_open_session(ctx: Ctx, row: swire.SessionInfo, method: Method[P, R],
                      params: P | None = None) -> R:
    """Call ``method`` with ``params`` (default: ``{session_id}``); a session not open in the
    daemon is resumed for the call and closed again after it (with the placeholder model:
    ``session.list`` carries none)."""
    sid = row.session_id
    by_id = swire.SessionIdParams(session_id=sid)
    call_params: Any = by_id if params is None else params
    if row.open:
        return ctx.request(method, call_params)
    ctx.request(methods.SESSION_OPEN, swire.OpenParams(cwd=row.cwd, model=UNKNOWN_MODEL,
                                                       session_id=sid, resume=True))
    try:
        return ctx.request(method, call_params)
    finally:
        try:
            ctx.request(methods.SESSION_CLOSE, by_id)
        except Exception as exc:  # noqa: BLE001 - the answer matters more than the cleanup
            _err(f"warning: could not close session {sid} again: {exc}")


# -- commands ---------------------------------------------------------------------------------
def cmd_sessions(ctx: Ctx) -> int:
    sub = getattr(ctx.args, "sessions_command", None) or "list"
    try:
        return _COMMANDS[sub](ctx)
    except Resolve as exc:
        return _fail(ctx, str(exc), matches=exc.matches)


def cmd_list(ctx: Ctx) -> int:
    a = ctx.args
    home = home_dir()
    if getattr(a, "all", False):
        res = ctx.request(methods.SESSION_LIST, swire.ListParams())
        title = "sessions (all projects)"
    else:
        cwd = os.path.abspath(a.cwd) if getattr(a, "cwd", None) else os.getcwd()
        res = ctx.request(methods.SESSION_LIST, swire.ListParams(cwd=cwd))
        title = f"sessions in {render.short_path(cwd, None, home)}"
    if a.json:
        emit_json(res)
    else:
        render_sessions.sessions_table(res.sessions, title=title, home=home, stream=sys.stdout)
    return EXIT_OK


def cmd_show(ctx: Ctx) -> int:
    row = _row(ctx)
    live = _live(ctx, row.session_id) if row.open else None
    messages = getattr(ctx.args, "messages", False)
    tr = (ctx.request(methods.SESSION_TRANSCRIPT, swire.SessionIdParams(session_id=row.session_id))
          if messages else None)
    if ctx.args.json:
        emit_json({**wire(row), "live": live, **({"transcript": tr} if tr is not None else {})})
    else:
        render_sessions.session_detail(row, live, home=home_dir(), stream=sys.stdout)
        if tr is not None:
            from qwenctl import render_transcript

            render_transcript.transcript(tr, stream=sys.stdout,
                                         full=bool(getattr(ctx.args, "full", False)),
                                         around=getattr(ctx.args, "around", None))
    return EXIT_OK


def cmd_recap(ctx: Ctx) -> int:
    row = _row(ctx)
    res = with_open_session(ctx, row, methods.SESSION_RECAP)
    status = res.status
    if ctx.args.json:
        emit_json(res)
    if status == "ok":
        if not ctx.args.json:
            sys.stdout.write(f"{res.text}\n")
        return EXIT_OK
    if status == "unavailable":
        _err(f"recap unavailable: {res.reason or 'unknown reason'}")
        return EXIT_DAEMON_ERROR
    # "empty": nothing to recap (no dialog yet, or the model gave no usable recap)
    _err(f"nothing to recap ({res.reason or status})")
    return EXIT_OK


def cmd_delete(ctx: Ctx) -> int:
    row = _row(ctx)
    sid = row.session_id
    if not ctx.args.yes:
        if not sys.stdin.isatty():
            return _fail(ctx, f"refusing to delete session {sid} without --yes "
                              "(stdin is not a terminal to ask on)")
        sys.stderr.write(f"delete session {sid} ({row.messages} messages)? [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            return _fail(ctx, "not deleted")
    res = ctx.request(methods.SESSION_DELETE, swire.SessionIdParams(session_id=sid))
    if ctx.args.json:
        emit_json({"session_id": sid, **wire(res)})
    if not res.deleted:
        _err(f"session {sid} had no record file left; removed it from the index")
        return EXIT_DAEMON_ERROR
    if not ctx.args.json:
        sys.stdout.write(f"deleted {sid}\n")
    return EXIT_OK


def cmd_title(ctx: Ctx) -> int:
    row = _row(ctx)
    res = ctx.request(methods.SESSION_SET_TITLE, swire.SetTitleParams(
        session_id=row.session_id, title=" ".join(ctx.args.title)))
    emit_result(ctx, res, f"{res.session_id[:8]}  {res.title}")
    return EXIT_OK


def cmd_summary(ctx: Ctx) -> int:
    row = _row(ctx)
    res = with_open_session(ctx, row, methods.SESSION_PROJECT_SUMMARY)
    if ctx.args.json:
        emit_json(res)
        return EXIT_OK
    sys.stdout.write(f"saved {res.path}\n\n{res.text.rstrip()}\n")
    return EXIT_OK


_COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
    "title": cmd_title,
    "recap": cmd_recap,
    "delete": cmd_delete,
    "summary": cmd_summary,
    "search": search_cmds.cmd_search,
}
