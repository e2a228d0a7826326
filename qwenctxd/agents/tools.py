"""The one tool set of the daemon's background agents, written once over a filesystem seam.

read_file, list_directory, glob and grep_search read (bounded) only what the run's filesystem
lets them (:meth:`~qwenctxd.agents.fs.AgentFS.read_refusal`: inside the read roots, never a
credential file; grep leaves such files out and says how many); write_file and edit
write only where the run's filesystem allows (:mod:`qwenctxd.agents.fs`: the real tree through
the agent's write scope and the audit log, or a speculation's copy-on-write overlay);
run_shell_command runs only commands the AST classifier proves read-only and whose paths all
pass the read scope (:mod:`qwenctxd.agents.shell_paths`), in the real working
directory, with a timeout and an output cap (over an overlay it says which changes the shell
cannot see). Every result is capped so one tool call cannot flood the agent's context. A
refusal is returned as the tool result — the model sees why, and the call never happens.
What the reading tools return passes the secret scanner: a key in a file the agent reads
reaches its model as ``[redacted: <rule id>]``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from wcmatch import glob as wglob

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.fs import AgentFS, OverlayTreeFS, RealTreeFS
from qwenctxd.agents.overlay import OverlayClosed, OverlayFS
from qwenctxd.agents.permissions import MemoryWriteScope, ReadScope, shell_verdict
from qwenctxd.agents.shell_paths import shell_read_refusal
from qwenctxd.fsutil import read_regular
from qwenctxd.memory.secrets import redaction_note
from qwenctxd.protocol.errors import PathOutsideProject
from qwenctxd.secrets import COUNTERS, redact

log = structlog.get_logger("qwenctxd.agents.tools")
MAX_RESULT_CHARS = 16_000
MAX_READ_BYTES = 512 * 1024
MAX_GREP_MATCHES = 200
SHELL_TIMEOUT_S = 20.0


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
    """What the tools of one agent run may touch: its filesystem, and whether it may run
    read-only shell commands."""

    fs: AgentFS
    allow_shell: bool = True
    files_written: list[str] = field(default_factory=list)
    reads: int = 0

    @property
    def cwd(self) -> Path:
        return self.fs.cwd

    @classmethod
    def real_tree(cls, cwd: Path, scope: MemoryWriteScope, audit: AuditLog, *, agent: str,
                  session: str | None = None, allow_shell: bool = True,
                  read_scope: ReadScope | None = None) -> ToolContext:
        """Tools over the real tree: writes through ``scope``, recorded in ``audit``; reads
        within ``read_scope`` (default: ``cwd`` and the writable roots)."""
        return cls(RealTreeFS(cwd, scope, audit, agent=agent, session=session,
                              read_scope=read_scope), allow_shell=allow_shell)

    @classmethod
    def over_overlay(cls, cwd: Path, overlay: OverlayFS, *, allow_shell: bool = True,
                     read_scope: ReadScope | None = None) -> ToolContext:
        """Tools over a speculation's copy-on-write overlay of the project; reads within
        ``read_scope`` (default: the project root)."""
        return cls(OverlayTreeFS(cwd, overlay, read_scope), allow_shell=allow_shell)


Tool = Callable[[ToolContext, dict[str, Any]], Awaitable[str]]


def _abs(ctx: ToolContext, raw: Any, key: str) -> Path:
    """The absolute, normalised path an argument names (relative paths: from ``cwd``)."""
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{key} is required")
    if "\x00" in raw:
        raise ValueError(f"{key} must not contain NUL")
    return Path(os.path.normpath(raw if os.path.isabs(raw) else ctx.cwd / raw))


def read_lines(data: bytes, args: dict[str, Any]) -> str:
    """The text of ``data`` (≤ 512 KiB), 1-based ``offset`` and ``limit`` lines from ``args``."""
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
    if (refusal := ctx.fs.read_refusal(path)) is not None:
        return refusal
    ctx.reads += 1
    data = await anyio.to_thread.run_sync(ctx.fs.read_bytes, path, MAX_READ_BYTES + 1)
    return cap(read_lines(data, args))


async def list_directory(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("path"), "path")
    if (refusal := ctx.fs.read_refusal(path)) is not None:
        return refusal
    entries = await anyio.to_thread.run_sync(ctx.fs.list, path)
    return cap("\n".join(n + ("/" if d else "") for n, d in entries) or "(empty)")


async def glob(ctx: ToolContext, args: dict[str, Any]) -> str:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("pattern is required")
    root = _abs(ctx, args.get("path") or str(ctx.cwd), "path")
    if (refusal := ctx.fs.read_refusal(root)) is not None:
        return refusal
    found = await anyio.to_thread.run_sync(ctx.fs.glob, root, pattern)
    return cap("\n".join(found) or "(no matches)")


async def grep_search(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = args.get("pattern")
    if not isinstance(raw, str) or not raw:
        raise ValueError("pattern is required")
    if not isinstance(args.get("path") or "", str):
        raise ValueError("path must be a string")
    root = _abs(ctx, args.get("path") or str(ctx.cwd), "path")
    if (refusal := ctx.fs.read_refusal(root)) is not None:
        return refusal
    include = args.get("include")
    matcher = wglob.compile([include], flags=wglob.GLOBSTAR | wglob.BRACE) if include else None
    rx = re.compile(raw)

    def run() -> str:
        files = ctx.fs.walk(root)
        out: list[str] = []
        skipped = 0
        for shown in sorted(files, key=os.fspath):
            if matcher is not None and not matcher.match(shown.name):
                continue
            if ctx.fs.read_refusal(shown) is not None:
                skipped += 1  # a credential file, or a link out of the read roots
                continue
            if grep_file(shown, files[shown], rx, out):
                break
        note = (f"\n[{skipped} file(s) not searched: credential files or outside the "
                f"directories this agent may read]") if skipped else ""
        return ("\n".join(out) or "(no matches)") + note

    return cap(await anyio.to_thread.run_sync(run))


async def _write(ctx: ToolContext, path: Path, text: str) -> bool | str:
    """Write through the run's filesystem: True when created, or the refusal line."""
    try:
        created = await anyio.to_thread.run_sync(ctx.fs.write_text, path, text)
    except PathOutsideProject:  # the tree changed under us since the check
        return ctx.fs.write_refusal(path) or f"Error: write refused: {path}"
    ctx.files_written.append(str(path))
    return created


def redaction_suffix(ctx: ToolContext, path: Path) -> str:
    """What the tool result adds when the write had secrets replaced (else "")."""
    redacted = ctx.fs.redactions(path)
    if not redacted:
        return ""
    return (f"; redacted {redaction_note(redacted)} before writing: secrets are never stored "
            "in memory, the file holds [redacted: <rule id>] in their place")


async def write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = _abs(ctx, args.get("file_path"), "file_path")
    content = args.get("content")
    if not isinstance(content, str):
        raise ValueError("content must be a string")
    refusal = ctx.fs.write_refusal(path)  # on the loop: calls are judged in their order
    if refusal is not None:
        return refusal
    created = await _write(ctx, path, content)
    if isinstance(created, str):
        return created
    return (f"{'Created' if created else 'Wrote'} {path} ({len(content)} chars)"
            + redaction_suffix(ctx, path))


def apply_edit(path: Path, text: str, old: str, new: str, replace_all: bool
               ) -> tuple[str | None, str]:
    """The ``edit`` tool's rule: ``old`` must occur exactly once unless ``replace_all``.
    (new text, success message) or (None, the error)."""
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
    refusal = ctx.fs.write_refusal(path) or ctx.fs.read_refusal(path)  # judged in order
    if refusal is not None:
        return refusal
    try:
        text = (await anyio.to_thread.run_sync(ctx.fs.read_bytes, path)).decode("utf-8")
    except OSError as exc:
        return f"Error: cannot read {path}: {exc.strerror or exc}"
    updated, message = apply_edit(path, text, old, new, bool(args.get("replace_all")))
    if updated is None:
        return message
    written = await _write(ctx, path, updated)
    return written if isinstance(written, str) else message + redaction_suffix(ctx, path)


def _clean_env() -> dict[str, str]:
    """The environment the classifier assumes: a trusted PATH, no BASH_ENV or exported
    functions, no pager or editor hooks."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME")
            if k in os.environ}
    keep["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return keep


async def run_readonly_shell(command: object, cwd: Path, *, allow: bool = True,
                             read_scope: ReadScope | None = None) -> str:
    """Run ``command`` in ``cwd`` if the AST classifier proves it read-only and (given a
    ``read_scope``) every path it reads is one the agent may read
    (:mod:`qwenctxd.agents.shell_paths`); the result text (exit code, stdout, stderr) or an
    ``Error:`` line."""
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command is required")
    if not allow:
        return "Error: run_shell_command is not available to this agent"
    verdict = await anyio.to_thread.run_sync(shell_verdict, command)
    if not verdict.allowed:
        return f"Error: {verdict.reason}"
    env = _clean_env()
    if read_scope is not None:
        refusal = await anyio.to_thread.run_sync(shell_read_refusal, command, cwd, read_scope,
                                                 env)
        if refusal is not None:
            return f"Error: {refusal}"
    try:
        with anyio.fail_after(SHELL_TIMEOUT_S):
            proc = await anyio.run_process(
                ["bash", "--norc", "--noprofile", "-c", command], cwd=str(cwd), check=False,
                stdin=subprocess.DEVNULL, env=env)
    except TimeoutError:
        return f"Error: command timed out after {SHELL_TIMEOUT_S:.0f} s"
    out = proc.stdout.decode("utf-8", errors="replace")
    err = proc.stderr.decode("utf-8", errors="replace")
    text = out + (f"\n[stderr]\n{err}" if err.strip() else "")
    return f"[exit {proc.returncode}]\n{text}"


async def run_shell_command(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = await run_readonly_shell(args.get("command"), ctx.cwd, allow=ctx.allow_shell,
                                      read_scope=ctx.fs.read_scope)
    unseen = ctx.fs.unseen_by_shell()
    if result.startswith("Error:") or not unseen:
        return cap(result)
    shown = ", ".join(str(p) for p in unseen[:20]) + (" ..." if len(unseen) > 20 else "")
    note = (f"[note: the shell sees the project as it was; files changed in this session "
            f"are not visible to it: {shown}]\n")
    return cap(note + result)


READ_TOOLS = frozenset({"read_file", "grep_search", "run_shell_command"})
TOOLS: dict[str, Tool] = {
    "read_file": read_file,
    "list_directory": list_directory,
    "glob": glob,
    "grep_search": grep_search,
    "write_file": write_file,
    "edit": edit,
    "run_shell_command": run_shell_command,
}


async def call_tool(ctx: ToolContext, name: str, raw_args: str | dict[str, Any]) -> str:
    """Run one tool call; any failure becomes an ``Error:`` result the model can read, and
    never takes the agent (or the daemon) down."""
    tool = TOOLS.get(name)
    if tool is None:
        return f"Error: unknown tool {name!r}"
    try:
        args = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        result = cap(await tool(ctx, args))
        if name in READ_TOOLS:  # what the agent's model reads of a file: never a secret
            red = redact(result)
            COUNTERS.add("redacted_out", len(red.findings))
            result = red.text
        return result
    except PathOutsideProject as exc:
        return f"Error: write refused: {exc.message}"
    except OverlayClosed:
        return "Error: the speculation was stopped"
    except (ValueError, OSError, re.error) as exc:
        return f"Error: {exc}"
    except Exception:
        log.exception("tool failed", tool=name)
        return f"Error: {name} failed inside the daemon; see its log"
