"""The overlay-aware tools of a follow-up speculation (see :mod:`qwenctxd.agents.speculation`).

``read_file``, ``list_directory``, ``glob`` and ``grep_search`` read overlay-first (merged
directory listings, deleted files hidden, files created in the overlay visible); ``write_file``
and ``edit`` write into the copy-on-write :class:`~qwenctxd.agents.overlay.OverlayFS` and refuse
paths outside the project; ``run_shell_command`` runs a classifier-approved read-only command in
the real working directory and says which overlay changes it cannot see.
:func:`call_overlay_tool` dispatches one tool call and turns any failure into an ``Error:``
result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from wcmatch import glob as wglob

from qwenctxd.agents.overlay import OverlayClosed, OverlayFS
from qwenctxd.agents.tools import (
    GLOB_FLAGS,
    MAX_GLOB_RESULTS,
    SKIP_DIRS,
    apply_edit,
    cap,
    dispatch_tool,
    glob_pattern,
    grep_args,
    grep_file,
    read_lines,
    run_readonly_shell,
)
from qwenctxd.fsutil import read_regular
from qwenctxd.protocol.errors import PathOutsideProject

__all__ = ["OVERLAY_TOOLS", "OverlayToolContext", "call_overlay_tool"]

log = structlog.get_logger("qwenctxd.speculation")


@dataclass
class OverlayToolContext:
    """What the tools of one speculation may touch: reads overlay-first, writes to the overlay,
    read-only shell in the real ``cwd``."""

    cwd: Path
    overlay: OverlayFS
    allow_shell: bool = True
    files_written: list[str] = field(default_factory=list)
    reads: int = 0


def _abs(ctx: OverlayToolContext, raw: Any, key: str) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{key} is required")
    p = Path(raw)
    return Path(os.path.normpath(p if p.is_absolute() else ctx.cwd / p))


async def read_file(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")

    def run() -> str:
        try:
            return read_lines(ctx.overlay.resolve_read(path), args)
        except FileNotFoundError:
            raise FileNotFoundError(f"No such file or directory: {path}") from None

    ctx.reads += 1
    return cap(await anyio.to_thread.run_sync(run))


async def list_directory(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("path"), "path")

    def run() -> str:
        entries = ctx.overlay.listdir(path)
        return "\n".join(n + ("/" if d else "") for n, d in entries) or "(empty)"

    return cap(await anyio.to_thread.run_sync(run))


def _overlay_files_under(ctx: OverlayToolContext, root: Path) -> list[tuple[str, Path]]:
    """(path relative to ``root``, overlay file) of the files written under ``root``."""
    key = ctx.overlay.rel(root)
    if key is None:
        return []
    prefix = f"{key}/" if key else ""
    return [(k[len(prefix):], ov) for k, ov in ctx.overlay.iter_overlay_files(key)
            if k.startswith(prefix)]


async def glob(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    pattern = glob_pattern(args)
    root = _abs(ctx, args.get("path") or str(ctx.cwd), "path")

    def run() -> str:
        found: dict[str, None] = {}
        for rel, _ov in _overlay_files_under(ctx, root):
            if wglob.globmatch(rel, pattern, flags=GLOB_FLAGS):
                found[str(root / rel)] = None
        if root.is_dir():
            for m in wglob.iglob(pattern, root_dir=str(root), flags=GLOB_FLAGS):
                p = root / m
                if not ctx.overlay.is_deleted(p):
                    found[str(p)] = None
                if len(found) >= MAX_GLOB_RESULTS:
                    break
        return "\n".join(sorted(found)[:MAX_GLOB_RESULTS]) or "(no matches)"

    return cap(await anyio.to_thread.run_sync(run))


async def grep_search(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    rx, root, matcher = grep_args(ctx.cwd, args)

    def run() -> str:
        files: dict[Path, Path] = {}  # shown path -> where to read it
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in filenames:
                fp = Path(dirpath) / name
                if not ctx.overlay.is_deleted(fp):
                    files[fp] = ctx.overlay.resolve_read(fp)
        for rel, ov in _overlay_files_under(ctx, root):
            if not any(part in SKIP_DIRS for part in rel.split("/")[:-1]):
                files[root / rel] = ov
        out: list[str] = []
        for shown in sorted(files):
            if matcher is not None and not matcher.match(shown.name):
                continue
            if grep_file(shown, files[shown], rx, out):
                return "\n".join(out)
        return "\n".join(out) or "(no matches)"

    return cap(await anyio.to_thread.run_sync(run))


def _refused_outside(ctx: OverlayToolContext, path: Path) -> str:
    return (f"Error: write refused: {path} is outside the project {ctx.overlay.project_root}; "
            f"only files inside the project may be written")


async def write_file(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")
    content = args.get("content")
    if not isinstance(content, str):
        raise ValueError("content must be a string")

    def run() -> bool:
        existed = ctx.overlay.exists(path)
        ctx.overlay.write(path, content)
        return existed

    try:
        existed = await anyio.to_thread.run_sync(run)
    except PathOutsideProject:
        return _refused_outside(ctx, path)
    ctx.files_written.append(str(path))
    return f"{'Wrote' if existed else 'Created'} {path} ({len(content)} chars)"


async def edit(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")
    old, new = args.get("old_string"), args.get("new_string")
    if not isinstance(old, str) or not isinstance(new, str):
        raise ValueError("old_string and new_string must be strings")
    if ctx.overlay.rel(path) is None:
        return _refused_outside(ctx, path)
    try:
        text = await anyio.to_thread.run_sync(
            lambda: read_regular(ctx.overlay.resolve_read(path)).decode("utf-8"))
    except OSError as exc:
        return f"Error: cannot read {path}: {exc.strerror or exc}"
    updated, message = apply_edit(path, text, old, new, bool(args.get("replace_all")))
    if updated is None:
        return message
    try:
        await anyio.to_thread.run_sync(ctx.overlay.write, path, updated)
    except PathOutsideProject:
        return _refused_outside(ctx, path)
    ctx.files_written.append(str(path))
    return message


async def run_shell_command(ctx: OverlayToolContext, args: dict[str, Any]) -> str:
    result = await run_readonly_shell(args.get("command"), ctx.cwd, allow=ctx.allow_shell)
    changed = ctx.overlay.changed()
    if result.startswith("Error:") or not changed:
        return cap(result)
    shown = ", ".join(str(p) for p in changed[:20]) + (" ..." if len(changed) > 20 else "")
    note = (f"[note: the shell sees the project as it was; files changed in this session "
            f"are not visible to it: {shown}]\n")
    return cap(note + result)


OVERLAY_TOOLS = {
    "read_file": read_file,
    "list_directory": list_directory,
    "glob": glob,
    "grep_search": grep_search,
    "write_file": write_file,
    "edit": edit,
    "run_shell_command": run_shell_command,
}


def _explain(exc: Exception) -> str | None:
    if isinstance(exc, PathOutsideProject):
        return f"Error: write refused: {exc.message}"
    if isinstance(exc, OverlayClosed):
        return "Error: the speculation was stopped"
    return None


async def call_overlay_tool(ctx: OverlayToolContext, name: str,
                            raw_args: str | dict[str, Any]) -> str:
    """Run one tool call against the overlay; any failure becomes an ``Error:`` result."""
    return await dispatch_tool(OVERLAY_TOOLS, ctx, name, raw_args, explain=_explain)
