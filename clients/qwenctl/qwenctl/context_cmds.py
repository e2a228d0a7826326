"""``qwenctl context [SESSION]``: a picture of one session's context window.

One bar the width of the terminal (80 columns when piped) split into the parts
``session.context`` reports — system prompt base, instructions, memory, other system text,
tools, skill listings, other reminders, user / assistant messages, tool results — with the
free space as the remainder, the warn / auto / hard thresholds marked under it, and a table
of the numbers. Coloured on a terminal; one letter per part and a legend when piped;
``--json`` prints the daemon's result.

The session is named by its id or a unique prefix of one (as ``qwenctl sessions show``);
without one, it is this directory's newest open session, else its newest recorded one (or
those of the nearest parent directory with sessions, up to the project root). A
session that is not open in the daemon is resumed for the call and closed again (as
``sessions recap`` does); such a session is counted without the client's own tool
declarations, which only the client knows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenctl import render_context, session_cmds
from qwenctl.cmdutil import add_session_args, command_cwd
from qwenctl.context import emit_json
from qwenctl.daemon_link import EXIT_OK
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as swire

if TYPE_CHECKING:
    from qwenctl.context import Ctx


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``context`` on the top-level subparsers ``sub``."""
    c = sub.add_parser("context", parents=[common],
                       help="a picture of one session's context window, part by part")
    add_session_args(c)
    c.add_argument("--width", type=int, default=None,
                   help="bar width in columns (default: the terminal's, 80 when piped)")


def default_session(ctx: Ctx, cwd: Path) -> swire.SessionInfo | None:
    """The newest open (else newest) session of ``cwd``, or of the nearest parent that has
    sessions, going no higher than the project root (the first directory with ``.git``)."""
    for d in (cwd, *cwd.parents):
        rows = ctx.request(methods.SESSION_LIST, swire.ListParams(cwd=str(d))).sessions
        if rows:  # newest first
            return next((r for r in rows if r.open), rows[0])
        if (d / ".git").exists():
            return None
    return None


def cmd_context(ctx: Ctx) -> int:
    if ctx.args.session is None:
        cwd = command_cwd(ctx)
        row = default_session(ctx, Path(cwd))
        if row is None:
            return session_cmds._fail(  # noqa: SLF001
                ctx, f"no sessions in {cwd} or its project; name one "
                     "(see `qwenctl sessions --all`)")
    else:
        try:
            row = session_cmds.resolve(session_cmds.sessions(ctx), ctx.args.session)
        except session_cmds.Resolve as exc:
            return session_cmds._fail(ctx, str(exc), matches=exc.matches)  # noqa: SLF001
    res = session_cmds.with_open_session(ctx, row, methods.SESSION_CONTEXT)
    if ctx.args.json:
        emit_json(res)
        return EXIT_OK
    if not row.open:
        sys.stderr.write("qwenctl: note: the session was not open; it was resumed for this "
                         "picture, without the client's tool declarations\n")
    render_context.context_report(res, stream=sys.stdout, width=ctx.args.width)
    return EXIT_OK
