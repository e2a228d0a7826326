"""``qwenctl skills``: the skills a directory sees, the ones they shadow, and load problems.

``list`` (the default) shows the winning skill of every name (level, where it applies, whether
the model may invoke it, the first line of its description), then the skills shadowed by a
higher level and the SKILL.md files that could not be loaded. ``show NAME`` prints one skill's
metadata and the full text the model receives when it loads the skill (``skills.load``); an
unknown name is the daemon's error (exit 1).

``review`` lists the skill drafts the background skill reviewer staged for the directory's
project (id, name, description, path; ``*`` marks a draft that would update an existing
project skill, ``!`` one that would not load); ``review accept ID`` copies a draft into
``<root>/.qwen/skills/<name>/`` and ``review discard ID`` deletes it; ``review run SESSION``
asks for a review of a live session now (ignoring the tool-call count).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from qwenctl import render, render_skills
from qwenctl.cmdutil import command_cwd, home_dir
from qwenctl.context import emit_json, wire
from qwenctl.daemon_link import EXIT_OK
from qwenctxd.protocol import methods
from qwenctxd.protocol import skills as kwire

if TYPE_CHECKING:
    from qwenctl.context import Ctx



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
    rv = ss.add_parser("review", parents=[common],
                       help="skill drafts staged by the skill reviewer: list, accept, discard")
    _cwd_option(rv)
    rs = rv.add_subparsers(dest="review_command", metavar="ACTION")
    rl = rs.add_parser("list", parents=[common], help="staged drafts (the default)")
    _cwd_option(rl)
    ra = rs.add_parser("accept", parents=[common],
                       help="copy a draft into the project's .qwen/skills")
    ra.add_argument("draft_id", metavar="ID", help="draft id (from `skills review`)")
    _cwd_option(ra)
    rd = rs.add_parser("discard", parents=[common], help="delete a draft")
    rd.add_argument("draft_id", metavar="ID", help="draft id (from `skills review`)")
    _cwd_option(rd)
    rr = rs.add_parser("run", parents=[common],
                       help="review a live session now (ignores the tool-call count)")
    rr.add_argument("session_id", metavar="SESSION", help="session id")


# -- helpers ----------------------------------------------------------------------------------


# -- commands ---------------------------------------------------------------------------------
def cmd_skills(ctx: Ctx) -> int:
    sub = getattr(ctx.args, "skills_command", None) or "list"
    return _COMMANDS[sub](ctx)


def cmd_list(ctx: Ctx) -> int:
    cwd = command_cwd(ctx)
    res = ctx.request(methods.SKILLS_LIST, kwire.ListParams(cwd=cwd))
    if ctx.args.json:
        emit_json(res)
    else:
        render_skills.skills_report(res, cwd=cwd, home=home_dir(), stream=sys.stdout)
    return EXIT_OK  # load errors are information, not a failure


def cmd_show(ctx: Ctx) -> int:
    cwd = command_cwd(ctx)
    name = ctx.args.name
    # load first: an unknown name is the daemon's error (with the known names) -> exit 1
    loaded = ctx.request(methods.SKILLS_LOAD, kwire.LoadParams(cwd=cwd, name=name))
    listed = ctx.request(methods.SKILLS_LIST, kwire.ListParams(cwd=cwd))
    info = next((s for s in listed.skills if s.name == loaded.name), None)
    shadowed = [s for s in listed.shadowed if s.name == loaded.name]
    if ctx.args.json:
        emit_json({**(wire(info) if info else {"name": loaded.name}), "base_dir": loaded.base_dir,
                   "content": loaded.content, "shadowed": shadowed})
        return EXIT_OK
    render_skills.skill_detail(info, loaded, shadowed, cwd=cwd, home=home_dir(), stream=sys.stdout)
    return EXIT_OK


def cmd_review(ctx: Ctx) -> int:
    action = getattr(ctx.args, "review_command", None) or "list"
    if action == "run":
        res = ctx.request(methods.SKILLS_REVIEW_RUN,
                          kwire.ReviewRunParams(session_id=ctx.args.session_id))
        if ctx.args.json:
            emit_json(res)
        elif res.scheduled:
            sys.stdout.write("skill review scheduled\n")
        else:
            sys.stdout.write(f"skill review skipped: {res.reason}\n")
        return EXIT_OK
    cwd = command_cwd(ctx)
    if action == "accept":
        draft = kwire.ReviewDraftParams(cwd=cwd, draft_id=ctx.args.draft_id)
        accepted = ctx.request(methods.SKILLS_REVIEW_ACCEPT, draft)
        if ctx.args.json:
            emit_json(accepted)
        else:
            sys.stdout.write(f"accepted {ctx.args.draft_id}: {accepted.path}\n")
        return EXIT_OK
    if action == "discard":
        draft = kwire.ReviewDraftParams(cwd=cwd, draft_id=ctx.args.draft_id)
        discarded = ctx.request(methods.SKILLS_REVIEW_DISCARD, draft)
        if ctx.args.json:
            emit_json(discarded)
        else:
            sys.stdout.write(f"discarded {ctx.args.draft_id}\n")
        return EXIT_OK
    listed = ctx.request(methods.SKILLS_REVIEW_LIST, kwire.ReviewListParams(cwd=cwd))
    if ctx.args.json:
        emit_json(listed)
        return EXIT_OK
    drafts = listed.drafts
    if not drafts:
        sys.stdout.write("skill drafts: none\n")
        return EXIT_OK
    home = home_dir()
    rows = [(d.id, d.name + ("*" if d.updates_existing else "") + ("!" if d.problem else ""),
             render.first_line(d.description or ""),
             render.short_path(d.path, None, home)) for d in drafts]
    render.table_to(sys.stdout, f"skill drafts ({len(drafts)})", rows,
                    ("id", "name", "description", "path"), nowrap=(0, 1, 3))
    if any(d.updates_existing for d in drafts):
        sys.stdout.write("* updates an existing project skill\n")
    for d in drafts:
        if d.problem:
            sys.stdout.write(f"! {d.id}: {d.problem}\n")
    sys.stdout.write("accept: qwenctl skills review accept ID   "
                     "discard: qwenctl skills review discard ID\n")
    return EXIT_OK


_COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
    "review": cmd_review,
}
