"""``qwenctl memory``: the auto memory a directory sees — list, recall, forget, status.

``list`` (the default) shows every memory file of the directory's project, user and team
scopes with its age and how often recall picked it. ``recall QUERY…`` runs the same selection a
session turn runs (the model when one is configured, else lexical) and shows the documents it
chose. ``forget QUERY…`` is two steps: the daemon proposes candidates (``memory.forget_candidates``),
qwenctl prints them and asks before anything is deleted (``memory.forget``); without a terminal
to ask on it needs ``--yes``. ``status`` shows the memory roots, counts, index size and the
extract / dream bookkeeping. ``add TEXT…`` is upstream's ``/memory add``: one bullet under
``## Qwen Added Memories`` in the project's QWEN.md (``--global``: ``~/.qwen/QWEN.md``), read by
every later prompt of that scope.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from qwenctl import render, render_memory
from qwenctl.cmdutil import command_cwd, emit_result, home_dir
from qwenctl.context import emit_json
from qwenctl.daemon_link import EXIT_DAEMON_ERROR, EXIT_OK, EXIT_USAGE
from qwenctxd.protocol import instructions as iwire
from qwenctxd.protocol import memory as mwire
from qwenctxd.protocol import methods

if TYPE_CHECKING:
    from qwenctl.context import Ctx

SCOPES = ("project", "user", "team")


class BadPick(ValueError):
    """A ``--pick`` selection that does not name the printed candidates."""


# -- parser -----------------------------------------------------------------------------------
def _cwd_option(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: `memory --cwd D` and `memory list --cwd D` land in the same attribute without
    # the subparser's default overwriting the parent's value
    p.add_argument("--cwd", metavar="DIR", default=argparse.SUPPRESS,
                   help="working directory (default: the current one)")


def _scope_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scope", choices=SCOPES, default=argparse.SUPPRESS,
                   help="only the memories of this scope")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``memory`` and its subcommands on the top-level subparsers ``sub``."""
    m = sub.add_parser("memory", parents=[common],
                       help="auto memory of a directory: list, recall, forget, add, status")
    _cwd_option(m)
    _scope_option(m)
    ms = m.add_subparsers(dest="memory_command", metavar="SUBCOMMAND")
    ls = ms.add_parser("list", parents=[common],
                       help="memory files with scope, type, age and hits (the default)")
    _cwd_option(ls)
    _scope_option(ls)
    rc = ms.add_parser("recall", parents=[common],
                       help="which memories a turn with this text would recall")
    rc.add_argument("query", nargs="+", metavar="QUERY", help="the text to recall for")
    rc.add_argument("--show-prompt", action="store_true",
                    help="also print the memory block the model would receive")
    rc.add_argument("--explain", action="store_true",
                    help="per memory: its lexical rank, semantic similarity, selector rank "
                         "and final rank; per tier: its status and time")
    rc.add_argument("--limit", type=int, default=None, metavar="N",
                    help="how many memories to recall (1-20; default 5)")
    rc.add_argument("--tool", dest="tools", action="append", metavar="NAME",
                    help="an active tool name (repeatable): memories about its usage are "
                         "left out, as in a session")
    _cwd_option(rc)
    fg = ms.add_parser("forget", parents=[common],
                       help="find the memories matching QUERY and delete them after asking")
    fg.add_argument("query", nargs="+", metavar="QUERY", help="what to forget")
    fg.add_argument("--yes", "-y", action="store_true",
                    help="delete the (picked) candidates without asking")
    fg.add_argument("--limit", type=_positive, default=None, metavar="N",
                    help="at most N candidates (daemon default 5, at most 50)")
    fg.add_argument("--pick", metavar="LIST", default=None,
                    help="only these of the numbered candidates, e.g. 1,3 or 2-4")
    _cwd_option(fg)
    st = ms.add_parser("status", parents=[common],
                       help="memory roots, counts, index size, last dream, extract cursor")
    _cwd_option(st)
    dr = ms.add_parser("dream", parents=[common],
                       help="consolidate this project's memories now (gates apply unless --force)")
    dr.add_argument("--force", action="store_true",
                    help="skip the time and session-count gates (never a held lock)")
    _cwd_option(dr)
    lg = ms.add_parser("log", parents=[common],
                       help="what background agents created, edited or deleted")
    lg.add_argument("--limit", type=_positive, default=30, metavar="N",
                    help="the last N entries (default 30)")
    ad = ms.add_parser("add", parents=[common],
                       help="add a bullet to the project's QWEN.md (--global: ~/.qwen/QWEN.md)")
    ad.add_argument("text", nargs="+", metavar="TEXT", help="what to remember")
    ad.add_argument("--global", dest="global_scope", action="store_true",
                    help="the user's ~/.qwen/QWEN.md instead of the project's")
    _cwd_option(ad)
    ud = ms.add_parser("undo", parents=[common],
                       help="restore the content before a logged change (see `memory log`)")
    ud.add_argument("id", metavar="ID", help="the entry id from `qwenctl memory log`")


# -- helpers ----------------------------------------------------------------------------------


def _query(ctx: Ctx) -> str:
    return " ".join(ctx.args.query).strip()


def _err(text: str) -> None:
    sys.stderr.write(f"qwenctl: {text}\n")


def _fail(ctx: Ctx, message: str, code: int = EXIT_DAEMON_ERROR, **data: Any) -> int:
    _err(message)
    if ctx.args.json:
        emit_json({"error": {"code": None, "message": message, "data": data or None}})
    return code


def parse_pick(text: str, count: int) -> list[int]:
    """``"1,3"`` / ``"2-4"`` / ``"1 3"`` as sorted, distinct 0-based indexes into ``count``
    candidates; :class:`BadPick` when a part is not a number or out of range."""
    chosen: set[int] = set()
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise BadPick("--pick names no candidate")
    for part in parts:
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise BadPick(f"--pick: {part!r} is not a number or a range like 2-4") from None
        if lo > hi:
            lo, hi = hi, lo
        if lo < 1 or hi > count:
            raise BadPick(f"--pick: {part!r} is out of range (candidates are 1-{count})")
        chosen.update(range(lo - 1, hi))
    return sorted(chosen)


def _plural(n: int) -> str:
    return "memory" if n == 1 else "memories"


# -- commands ---------------------------------------------------------------------------------
def cmd_memory(ctx: Ctx) -> int:
    sub = getattr(ctx.args, "memory_command", None) or "list"
    return _COMMANDS[sub](ctx)


def cmd_list(ctx: Ctx) -> int:
    cwd = command_cwd(ctx)
    scope = getattr(ctx.args, "scope", None)
    res = ctx.request(methods.MEMORY_LIST, mwire.ListParams(cwd=cwd, scope=scope or None))
    if ctx.args.json:
        emit_json(res)
    else:
        render_memory.memory_list_report(res, cwd=cwd, scope=scope, home=home_dir(), stream=sys.stdout)
    return EXIT_OK  # problems are information, not a failure


def cmd_recall(ctx: Ctx) -> int:
    cwd = command_cwd(ctx)
    query = _query(ctx)
    if not query:
        return _fail(ctx, "the query is empty", EXIT_USAGE)
    params = mwire.RecallParams(cwd=cwd, query=query,
                                active_tools=list(ctx.args.tools) if ctx.args.tools else None)
    if ctx.args.limit is not None:
        if not 1 <= ctx.args.limit <= 20:
            return _fail(ctx, "--limit must be between 1 and 20", EXIT_USAGE)
        params.limit = ctx.args.limit
    res = ctx.request(methods.MEMORY_RECALL, params)
    if ctx.args.json:
        emit_json(res)
    else:
        render_memory.memory_recall_report(res, home=home_dir(), show_prompt=ctx.args.show_prompt,
                                           explain=ctx.args.explain, stream=sys.stdout)
    return EXIT_OK


def _confirm(n: int) -> bool:
    what = "this memory" if n == 1 else f"these {n} memories"
    sys.stderr.write(f"forget {what}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_forget(ctx: Ctx) -> int:
    a = ctx.args
    cwd = command_cwd(ctx)
    home = home_dir()
    query = _query(ctx)
    if not query:
        return _fail(ctx, "the query is empty", EXIT_USAGE)
    params = mwire.ForgetCandidatesParams(cwd=cwd, query=query)
    if a.limit is not None:
        params.limit = a.limit
    candidates = ctx.request(methods.MEMORY_FORGET_CANDIDATES, params).candidates
    if not candidates:
        if a.json:
            emit_json({"candidates": [], "selected": [], "removed": []})
        else:
            sys.stdout.write(f"nothing matches {query!r}\n")
        return EXIT_OK
    if not a.json:
        render_memory.memory_candidates(candidates, query=query, home=home, stream=sys.stdout)
        sys.stdout.flush()
    selected = candidates
    if a.pick is not None:
        try:
            selected = [candidates[i] for i in parse_pick(a.pick, len(candidates))]
        except BadPick as exc:
            return _fail(ctx, f"{exc}; nothing forgotten", EXIT_USAGE,
                         candidates=candidates)
    paths = [c.path for c in selected]
    if not a.yes:
        if not sys.stdin.isatty():
            return _fail(ctx, f"refusing to forget {len(paths)} {_plural(len(paths))} without "
                              "--yes (stdin is not a terminal to ask on); nothing forgotten",
                         candidates=candidates, selected=paths)
        if not _confirm(len(paths)):
            return _fail(ctx, "nothing forgotten", selected=paths)
    removed = ctx.request(methods.MEMORY_FORGET, mwire.ForgetParams(cwd=cwd, paths=paths)).removed
    missing = [p for p in paths if p not in set(removed)]
    if a.json:
        emit_json({"candidates": candidates, "selected": paths, "removed": removed})
    else:
        for p in removed:
            sys.stdout.write(f"forgot {p}\n")
    for p in missing:
        _err(f"{p} was not removed (already gone?)")
    return EXIT_DAEMON_ERROR if missing else EXIT_OK


def cmd_status(ctx: Ctx) -> int:
    cwd = command_cwd(ctx)
    res = ctx.request(methods.MEMORY_STATUS, mwire.StatusParams(cwd=cwd))
    if ctx.args.json:
        emit_json(res)
    else:
        render_memory.memory_status_report(res, cwd=cwd, home=home_dir(), stream=sys.stdout)
    return EXIT_OK


def cmd_add(ctx: Ctx) -> int:
    scope = "global" if ctx.args.global_scope else "project"
    res = ctx.request(methods.INSTRUCTIONS_ADD_MEMORY, iwire.AddMemoryParams(
        cwd=command_cwd(ctx), scope=scope, text=" ".join(ctx.args.text)))
    emit_result(ctx, res, f"added to {render.short_path(res.path, None, home_dir())}")
    return EXIT_OK


def cmd_dream(ctx: Ctx) -> int:
    res = ctx.request(methods.MEMORY_DREAM, mwire.DreamParams(cwd=command_cwd(ctx),
                                                              force=bool(ctx.args.force)))
    if ctx.args.json:
        emit_json(res)
    elif res.scheduled:
        sys.stdout.write("dream scheduled; `qwenctl drain` waits for it, "
                         "`qwenctl memory log` shows what it changed\n")
    else:
        sys.stdout.write(dream_skipped_line(res) + "\n")
    return EXIT_OK


DREAM_REASONS = {
    "scan_throttled": "the session files were scanned for new sessions a moment ago",
    "min_hours": "the last dream was less than 24 hours ago",
    "min_sessions": "too few sessions since the last dream",
    "same_session": "this session already dreamed",
    "disabled": "auto dream is disabled (memory.enableManagedAutoDream)",
    "memory_pressure": "the machine is short of memory",
    "locked": "another process holds this project's consolidation lock",
    "running": "a dream for this project is already running or queued",
    "no_model": "no model is configured (see `qwenctl doctor`)",
}


def dream_skipped_line(res: mwire.DreamScheduledResult) -> str:
    """``dream skipped: REASON (what it means); when it may run again; whether --force helps``."""
    reason = res.skipped_reason or res.reason or "unknown"
    parts = [f"dream skipped: {reason}"]
    if reason in DREAM_REASONS:
        parts[0] += f" ({DREAM_REASONS[reason]})"
    retry = res.retry_at
    if isinstance(retry, int | float):
        left = max(0.0, retry - time.time())
        when = time.strftime("%H:%M:%S", time.localtime(retry))
        parts.append(f"the next attempt is allowed at {when} (in {render.human_duration(left)})")
    if res.force_skips:
        parts.append("`qwenctl memory dream --force` runs it now")
    return "; ".join(parts)


def cmd_log(ctx: Ctx) -> int:
    res = ctx.request(methods.MEMORY_LOG, mwire.LogParams(limit=ctx.args.limit))
    if ctx.args.json:
        emit_json(res)
        return EXIT_OK
    entries = res.entries  # audit entries as the daemon's log holds them (dicts)
    if not entries:
        sys.stdout.write("no background changes recorded\n")
        return EXIT_OK
    rows = []
    for e in reversed(entries):  # newest first
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))
        target = f"undoes {e['undoes']}" if e.get("undoes") else render.short_path(
            e["path"], cwd=os.getcwd(), home=home_dir())
        rows.append((e["id"], when, e["agent"], e["action"], target))
    # the path column folds onto more lines on a narrow terminal instead of being cut
    render.table_fold_to(sys.stdout, f"background changes (last {len(entries)})", rows,
                         ("id", "time", "agent", "action", "path"), nowrap=(0, 1, 2, 3),
                         fold=(4,))
    return EXIT_OK


def cmd_undo(ctx: Ctx) -> int:
    res = ctx.request(methods.MEMORY_UNDO, mwire.UndoParams(id=ctx.args.id))
    if ctx.args.json:
        emit_json(res)
    else:
        said = res.message or f"the change is now a {res.action}"
        sys.stdout.write(f"restored {res.restored}: {said}\n")
    return EXIT_OK


_COMMANDS = {
    "add": cmd_add,
    "dream": cmd_dream,
    "log": cmd_log,
    "undo": cmd_undo,
    "list": cmd_list,
    "recall": cmd_recall,
    "forget": cmd_forget,
    "status": cmd_status,
}
