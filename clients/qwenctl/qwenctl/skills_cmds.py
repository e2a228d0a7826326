"""``qwenctl skills``: the skills a directory sees, the ones they shadow, and load problems.

``list`` (the default) shows the winning skill of every name (level, where it applies, whether
the model may invoke it, the first line of its description), then the skills shadowed by a
higher level and the SKILL.md files that could not be loaded. ``show NAME`` prints one skill's
metadata and the full text the model receives when it loads the skill (``skills.load``); an
unknown name is the daemon's error (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from qwenctl import render
from qwenctl.daemon_link import EXIT_OK

if TYPE_CHECKING:
    from qwenctl.cli import Ctx

SUBCOMMANDS = ("list", "show")


# -- parser -----------------------------------------------------------------------------------
def _cwd_option(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: `skills --cwd D` and `skills list --cwd D` land in the same attribute without
    # the subparser's default overwriting the parent's value
    p.add_argument("--cwd", default=argparse.SUPPRESS,
                   help="working directory (default: the current one)")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``skills`` and its subcommands on the top-level subparsers ``sub``."""
    s = sub.add_parser("skills", parents=[common],
                       help="skills of a directory: list (shadowed, errors), show one")
    _cwd_option(s)
    ss = s.add_subparsers(dest="skills_command", metavar="SUBCOMMAND")
    ls = ss.add_parser("list", parents=[common],
                       help="skills, shadowed skills and load errors (the default)")
    _cwd_option(ls)
    sh = ss.add_parser("show", parents=[common],
                       help="one skill's metadata and the full text it loads")
    sh.add_argument("name", metavar="NAME", help="skill name")
    _cwd_option(sh)


# -- helpers ----------------------------------------------------------------------------------
def _home() -> str | None:
    home = os.path.expanduser("~")
    return home if home != "~" else None


def _cwd(ctx: Ctx) -> str:
    cwd = getattr(ctx.args, "cwd", None)
    return os.path.abspath(cwd) if cwd else os.getcwd()


# -- commands ---------------------------------------------------------------------------------
def cmd_skills(ctx: Ctx) -> int:
    sub = getattr(ctx.args, "skills_command", None) or "list"
    return _COMMANDS[sub](ctx)


def cmd_list(ctx: Ctx) -> int:
    from qwenctl.cli import emit_json

    cwd = _cwd(ctx)
    res = ctx.call("skills.list", {"cwd": cwd})
    if ctx.args.json:
        emit_json(res)
    else:
        render.skills_report(res, cwd=cwd, home=_home(), stream=sys.stdout)
    return EXIT_OK  # load errors are information, not a failure


def cmd_show(ctx: Ctx) -> int:
    from qwenctl.cli import emit_json

    cwd = _cwd(ctx)
    name = ctx.args.name
    # load first: an unknown name is the daemon's error (with the known names) -> exit 1
    loaded = ctx.call("skills.load", {"cwd": cwd, "name": name})
    listed = ctx.call("skills.list", {"cwd": cwd})
    info = next((s for s in listed["skills"] if s["name"] == loaded["name"]), None)
    shadowed = [s for s in listed.get("shadowed") or [] if s["name"] == loaded["name"]]
    if ctx.args.json:
        emit_json({**(info or {"name": loaded["name"]}), "base_dir": loaded["base_dir"],
                   "content": loaded["content"], "shadowed": shadowed})
        return EXIT_OK
    render.skill_detail(info, loaded, shadowed, cwd=cwd, home=_home(), stream=sys.stdout)
    return EXIT_OK


_COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
}
