"""``qwenctl compress [--fast] [SESSION]``: compact one session's context now.

The session is chosen as ``qwenctl context`` chooses it: an id or a unique prefix, else this
directory's newest open session (else its newest recorded one, up to the project root). Full
compression asks the model for a summary (``session.compress {mode: "full"}``); ``--fast``
clears old tool results and reasoning without a model call. A session not open in the daemon
is resumed for the call and closed again. Prints the token count before and after; exit 1
when the daemon could not compress (the model unavailable, say), with the reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenctl import context_cmds, session_cmds
from qwenctl.cmdutil import add_session_args, command_cwd
from qwenctl.context import emit_json, wire
from qwenctl.daemon_link import EXIT_DAEMON_ERROR, EXIT_OK
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as swire

if TYPE_CHECKING:
    from qwenctl.context import Ctx


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``compress`` on the top-level subparsers ``sub``."""
    c = sub.add_parser("compress", parents=[common],
                       help="compact one session's context now (a model summary, or --fast)")
    add_session_args(c)
    c.add_argument("--fast", action="store_true",
                   help="clear old tool results and reasoning only (no model call)")
    c.add_argument("--instructions", metavar="TEXT",
                   help="what the summary should focus on (full compression only)")


def cmd_compress(ctx: Ctx) -> int:
    a = ctx.args
    if a.session is None:
        cwd = command_cwd(ctx)
        row = context_cmds.default_session(ctx, Path(cwd))
        if row is None:
            return session_cmds._fail(  # noqa: SLF001
                ctx, f"no sessions in {cwd} or its project; name one "
                     "(see `qwenctl sessions --all`)")
    else:
        try:
            row = session_cmds.resolve(session_cmds.sessions(ctx), a.session)
        except session_cmds.Resolve as exc:
            return session_cmds._fail(ctx, str(exc), matches=exc.matches)  # noqa: SLF001
    params = swire.CompressParams(session_id=row.session_id, mode="fast" if a.fast else "full",
                                  instructions=None if a.fast else a.instructions or None)
    res = session_cmds.with_open_session(ctx, row, methods.SESSION_COMPRESS, params)
    if a.json:
        emit_json({"session_id": row.session_id, **wire(res)})
    status = res.status
    ok = status in ("compressed", "noop")
    if not a.json:
        before, after = res.tokens_before, res.tokens_after
        sid = row.session_id[:8]
        if status == "compressed":
            saved = before - after
            pct = f" ({100 * saved / before:.0f}% less)" if before else ""
            sys.stdout.write(f"{sid}: compressed {before:,} → {after:,} tokens{pct}"
                             f"{' (fast: tool results and reasoning cleared)' if a.fast else ''}\n")
        elif status == "noop":
            sys.stdout.write(f"{sid}: nothing to compress ({before:,} tokens)\n")
        else:
            hint = ("; is the model reachable? see `qwenctl doctor`, or try --fast"
                    if status == "failed_model_error" else "")
            sys.stderr.write(f"qwenctl: {sid}: not compressed: {status}; the history is "
                             f"unchanged{hint}\n")
    return EXIT_OK if ok else EXIT_DAEMON_ERROR
