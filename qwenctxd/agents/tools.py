"""The tools the daemon implements for its background agents, and their declarations.

read_file, list_directory, glob and grep_search read freely (bounded); write_file and edit go
through the agent's write scope and the audit log; run_shell_command runs only commands the
AST classifier proves read-only, with a timeout and an output cap. Every result is capped so
one tool call cannot flood the agent's context. A refusal is returned as the tool result —
the model sees why, and the call never happens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from wcmatch import glob as wglob

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.permissions import MemoryWriteScope, shell_verdict
from qwenctxd.fsutil import open_regular, read_regular

log = structlog.get_logger("qwenctxd.agents.tools")
MAX_RESULT_CHARS = 16_000
MAX_READ_BYTES = 512 * 1024
MAX_GLOB_RESULTS = 500
MAX_GREP_MATCHES = 200
SHELL_TIMEOUT_S = 20.0
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", ".mypy_cache"}


def cap(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... output truncated: {len(text) - limit} more characters ...]"


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]
        ) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


S = {"type": "string"}
DECLARATIONS: dict[str, dict[str, Any]] = {
    "read_file": _fn("read_file", "Read a text file (absolute path); optional 1-based line "
                     "offset and line limit.", {"file_path": S, "offset": {"type": "integer"},
                                                "limit": {"type": "integer"}}, ["file_path"]),
    "list_directory": _fn("list_directory", "List a directory (absolute path).", {"path": S},
                          ["path"]),
    "glob": _fn("glob", "Find files matching a glob pattern (** allowed) under a directory.",
                {"pattern": S, "path": S}, ["pattern"]),
    "grep_search": _fn("grep_search", "Search file contents with a regular expression under a "
                       "directory; optional glob filter for file names.",
                       {"pattern": S, "path": S, "include": S}, ["pattern"]),
    "write_file": _fn("write_file", "Create or overwrite a file (absolute path) with content.",
                      {"file_path": S, "content": S}, ["file_path", "content"]),
    "edit": _fn("edit", "Replace old_string with new_string in a file (exactly one occurrence "
                "unless replace_all).", {"file_path": S, "old_string": S, "new_string": S,
                                         "replace_all": {"type": "boolean"}},
                ["file_path", "old_string", "new_string"]),
    "run_shell_command": _fn("run_shell_command", "Run a read-only shell command (inspection "
                             "only: anything that writes or is not provably read-only is "
                             "refused).", {"command": S}, ["command"]),
}


@dataclass
class ToolContext:
    """What the tools of one agent run may touch."""

    cwd: Path
    scope: MemoryWriteScope
    audit: AuditLog
    agent: str
    session: str | None = None
    allow_shell: bool = True
    files_written: list[str] = field(default_factory=list)
    reads: int = 0


Tool = Callable[[ToolContext, dict[str, Any]], Awaitable[str]]


def _abs(ctx: ToolContext, raw: Any, key: str) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{key} is required")
    p = Path(raw)
    return p if p.is_absolute() else ctx.cwd / p


def read_lines(src: Path, args: dict[str, Any]) -> str:
    """The text of ``src`` (≤ 512 KiB), 1-based ``offset`` and ``limit`` lines from ``args``."""
    with open_regular(src) as f:
        data = f.read(MAX_READ_BYTES + 1)
    lines = data[:MAX_READ_BYTES].decode("utf-8", errors="replace").splitlines()
    off = max(1, int(args.get("offset") or 1))
    lim = int(args.get("limit") or 2000)
    return "\n".join(lines[off - 1: off - 1 + lim])


def grep_file(shown: Path, src: Path, rx: re.Pattern[str], out: list[str]) -> bool:
    """Append ``shown:line: text`` for each match in ``src``; True once the cap is reached.
    Large, unreadable and non-UTF-8 files are skipped."""
    try:
        if src.stat().st_size > MAX_READ_BYTES:
            return False
        text = read_regular(src).decode("utf-8", errors="strict")
    except (OSError, UnicodeDecodeError):
        return False
    for i, line in enumerate(text.splitlines(), 1):
        if rx.search(line):
            out.append(f"{shown}:{i}: {line[:300]}")
            if len(out) >= MAX_GREP_MATCHES:
                return True
    return False


async def read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")
    ctx.reads += 1
    return cap(await anyio.to_thread.run_sync(read_lines, path, args))


async def list_directory(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("path"), "path")

    def run() -> str:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        return "\n".join(e.name + ("/" if e.is_dir() else "") for e in entries) or "(empty)"

    return cap(await anyio.to_thread.run_sync(run))


GLOB_FLAGS = wglob.GLOBSTAR | wglob.BRACE | wglob.DOTGLOB


def glob_pattern(args: dict[str, Any]) -> str:
    """glob's ``pattern`` argument, required (the real and the overlay glob share it)."""
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("pattern is required")
    return pattern


async def glob(ctx: ToolContext, args: dict[str, Any]) -> str:
    pattern = glob_pattern(args)
    root = _abs(ctx, args.get("path") or str(ctx.cwd), "path")

    def run() -> str:
        found = []
        for m in wglob.iglob(pattern, root_dir=str(root), flags=GLOB_FLAGS):
            found.append(str(root / m))
            if len(found) >= MAX_GLOB_RESULTS:
                break
        return "\n".join(found) or "(no matches)"

    return cap(await anyio.to_thread.run_sync(run))


def grep_args(cwd: Path, args: dict[str, Any]) -> tuple[re.Pattern[str], Path, Any]:
    """(compiled pattern, search root, file-name matcher or None) from grep_search's args."""
    raw = args.get("pattern")
    if not isinstance(raw, str) or not raw:
        raise ValueError("pattern is required")
    raw_root = args.get("path") or str(cwd)
    if not isinstance(raw_root, str):
        raise ValueError("path must be a string")
    root = Path(os.path.normpath(raw_root if os.path.isabs(raw_root) else cwd / raw_root))
    include = args.get("include")
    matcher = wglob.compile([include], flags=wglob.GLOBSTAR | wglob.BRACE) if include else None
    return re.compile(raw), root, matcher


async def grep_search(ctx: ToolContext, args: dict[str, Any]) -> str:
    rx, root, matcher = grep_args(ctx.cwd, args)

    def run() -> str:
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if matcher is not None and not matcher.match(name):
                    continue
                fp = Path(dirpath) / name
                if grep_file(fp, fp, rx, out):
                    return "\n".join(out)
        return "\n".join(out) or "(no matches)"

    return cap(await anyio.to_thread.run_sync(run))


async def write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")
    content = args.get("content")
    if not isinstance(content, str):
        raise ValueError("content must be a string")
    verdict = ctx.scope.check_write(path)
    if not verdict.allowed:
        return f"Error: {verdict.reason}"
    entry = await anyio.to_thread.run_sync(
        lambda: ctx.audit.write_file(path, content, agent=ctx.agent, session=ctx.session))
    ctx.files_written.append(str(path))
    return f"{'Created' if entry.action == 'create' else 'Wrote'} {path} ({len(content)} chars)"


def apply_edit(path: Path, text: str, old: str, new: str, replace_all: bool
               ) -> tuple[str | None, str]:
    """The ``edit`` tool's rule, for the real and the overlay file views: ``old`` must occur
    exactly once unless ``replace_all``. (new text, success message) or (None, the error)."""
    count = text.count(old) if old else 0
    if count == 0:
        return None, f"Error: old_string not found in {path}"
    if count > 1 and not replace_all:
        return None, (f"Error: old_string occurs {count} times in {path}; give more context "
                      f"or set replace_all")
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    return updated, f"Edited {path} ({count if replace_all else 1} replacement(s))"


async def edit(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")
    old, new = args.get("old_string"), args.get("new_string")
    if not isinstance(old, str) or not isinstance(new, str):
        raise ValueError("old_string and new_string must be strings")
    verdict = ctx.scope.check_write(path)
    if not verdict.allowed:
        return f"Error: {verdict.reason}"
    try:
        text = await anyio.to_thread.run_sync(lambda: read_regular(path).decode("utf-8"))
    except OSError as exc:
        return f"Error: cannot read {path}: {exc.strerror}"
    updated, message = apply_edit(path, text, old, new, bool(args.get("replace_all")))
    if updated is None:
        return message
    await anyio.to_thread.run_sync(
        lambda: ctx.audit.write_file(path, updated, agent=ctx.agent, session=ctx.session))
    ctx.files_written.append(str(path))
    return message


def _clean_env() -> dict[str, str]:
    """The environment the classifier assumes: a trusted PATH, no BASH_ENV or exported
    functions, no pager or editor hooks."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME")
            if k in os.environ}
    keep["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return keep


async def run_readonly_shell(command: object, cwd: Path, *, allow: bool = True) -> str:
    """Run ``command`` in ``cwd`` if the AST classifier proves it read-only; the result text
    (exit code, stdout, stderr) or an ``Error:`` line. Shared by every agent's shell tool."""
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command is required")
    if not allow:
        return "Error: run_shell_command is not available to this agent"
    verdict = await anyio.to_thread.run_sync(shell_verdict, command)
    if not verdict.allowed:
        return f"Error: {verdict.reason}"
    try:
        with anyio.fail_after(SHELL_TIMEOUT_S):
            proc = await anyio.run_process(
                ["bash", "--norc", "--noprofile", "-c", command], cwd=str(cwd), check=False,
                stdin=subprocess.DEVNULL, env=_clean_env())
    except TimeoutError:
        return f"Error: command timed out after {SHELL_TIMEOUT_S:.0f} s"
    out = proc.stdout.decode("utf-8", errors="replace")
    err = proc.stderr.decode("utf-8", errors="replace")
    text = out + (f"\n[stderr]\n{err}" if err.strip() else "")
    return f"[exit {proc.returncode}]\n{text}"


async def run_shell_command(ctx: ToolContext, args: dict[str, Any]) -> str:
    return cap(await run_readonly_shell(args.get("command"), ctx.cwd, allow=ctx.allow_shell))


TOOLS: dict[str, Tool] = {
    "read_file": read_file,
    "list_directory": list_directory,
    "glob": glob,
    "grep_search": grep_search,
    "write_file": write_file,
    "edit": edit,
    "run_shell_command": run_shell_command,
}


async def dispatch_tool(table: Mapping[str, Callable[[Any, dict[str, Any]], Awaitable[str]]],
                        ctx: Any, name: str, raw_args: str | dict[str, Any], *,
                        explain: Callable[[Exception], str | None] = lambda exc: None) -> str:
    """Run one tool call from ``table``; any failure becomes an ``Error:`` result the model can
    read (``explain`` words the errors of a particular tool set first)."""
    tool = table.get(name)
    if tool is None:
        return f"Error: unknown tool {name!r}"
    try:
        args = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        return cap(await tool(ctx, args))
    except Exception as exc:  # a broken tool must never take the agent (or the daemon) down
        message = explain(exc)
        if message is not None:
            return message
        if isinstance(exc, ValueError | OSError | re.error):
            return f"Error: {exc}"
        log.exception("tool failed", tool=name)
        return f"Error: {name} failed inside the daemon; see its log"


async def call_tool(ctx: ToolContext, name: str, raw_args: str | dict[str, Any]) -> str:
    """Run one tool call; any failure becomes an ``Error:`` result the model can read."""
    return await dispatch_tool(TOOLS, ctx, name, raw_args)
