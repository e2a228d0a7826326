"""Small helpers every qwenctl command module shares (the cwd a command acts on, $HOME, the
one-result output)."""

from __future__ import annotations

import os
import sys
from typing import Any

from qwenctl.context import emit_json


def command_cwd(ctx: Any) -> str:
    """``--cwd`` made absolute, or the current directory."""
    cwd = getattr(ctx.args, "cwd", None)
    return os.path.abspath(cwd) if cwd else os.getcwd()


def add_session_args(parser: Any) -> None:
    """The optional SESSION positional and ``--cwd`` of commands that act on one session."""
    parser.add_argument("session", metavar="SESSION", nargs="?",
                        help="session id or a unique prefix of one (default: this directory's "
                             "newest open session, else its newest)")
    parser.add_argument("--cwd", metavar="DIR", help="the directory whose session is meant "
                                                     "(default: the current one)")


def home_dir() -> str | None:
    """The home directory for ``~/`` shortening, None when it cannot be determined."""
    home = os.path.expanduser("~")
    return home if home != "~" else None


def emit_result(ctx: Any, result: Any, line: str) -> None:
    """The daemon's ``result`` as JSON with ``--json``, else ``line`` for people."""
    if ctx.args.json:
        emit_json(result)
    else:
        sys.stdout.write(line + "\n")
