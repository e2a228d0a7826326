"""Human output of ``qwenctl prompt`` and ``qwenctl instructions``: the system-prompt
summary and the instruction files in load order (generic helpers live in :mod:`qwenctl.render`).

Paths are shown relative to the project root (the header names it), whichever subdirectory the
command runs in, so one listing never mixes cwd-relative and absolute paths; files outside the
project (``~/.qwen/QWEN.md``) are shown from ``~``, else absolute."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from qwenctl.render import (
    _line,
    human_bytes,
    short_path,
    table_to,
)

if TYPE_CHECKING:
    from qwenctxd.protocol.instructions import InstructionsFilesResult, Problem, PromptSystemResult


def _problems(stream: TextIO, errors: list[Problem], cwd: str, home: str | None) -> None:
    if not errors:
        _line(stream, "problems: none")
        return
    table_to(stream, "problems",
             [(e.kind, short_path(e.path, cwd, home), e.message) for e in errors],
             ("kind", "path", "message"), nowrap=(1,))


def _where(cwd: str, root: str | None, home: str | None) -> str:
    where = short_path(cwd, None, home)
    return (f"{where} (project root {short_path(root, None, home)}; paths below are "
            "relative to it)") if root else f"{where} (no project root)"


def _base(cwd: str, root: str | None) -> str:
    """The directory the listing's paths are relative to: the project root, else cwd."""
    return root or cwd


def prompt_report(res: PromptSystemResult, *, cwd: str, home: str | None,
                  stream: TextIO | None = None) -> None:
    """The summary of a ``prompt.system`` result: sections, total, files, hash, problems."""
    out = stream or sys.stderr
    _line(out, f"system prompt for {_where(cwd, res.project_root, home)}")
    cwd = _base(cwd, res.project_root)
    rows = [(s.name, str(s.chars), str(s.est_tokens)) for s in res.sections]
    rows.append(("total", str(sum(s.chars for s in res.sections)),
                 str(sum(s.est_tokens for s in res.sections))))
    table_to(out, "sections", rows, ("section", "chars", "est_tokens"), right=(1, 2))
    if res.files:
        table_to(out, "files", [(f.type, short_path(f.path, cwd, home)) for f in res.files],
                 nowrap=(1,))
    else:
        _line(out, "files: none")
    _line(out, f"prefix hash: {res.prefix_hash[:16]}")
    _problems(out, res.errors, cwd, home)


def instructions_report(res: InstructionsFilesResult, *, cwd: str, home: str | None,
                        stream: TextIO | None = None) -> None:
    """The ``instructions.files`` result: files in load order with their imports, rules,
    problems."""
    out = stream or sys.stdout
    _line(out, f"instructions for {_where(cwd, res.project_root, home)}")
    cwd = _base(cwd, res.project_root)
    if res.files:
        rows: list[tuple[str, ...]] = []
        for n, f in enumerate(res.files, 1):
            note = "truncated at the size cap" if f.truncated else ""
            rows.append((str(n), f.type, short_path(f.path, cwd, home), human_bytes(f.bytes),
                         note))
            for imp in f.imports:
                rows.append(("", "", "  imports " + short_path(imp, cwd, home), "", ""))
        table_to(out, "files (load order)", rows, ("#", "type", "path", "size", "note"),
                 right=(0, 3), nowrap=(2,))
    else:
        _line(out, "files: none")
    if res.rules:
        table_to(out, "rules", [
            ("conditional" if r.conditional else "baseline", short_path(r.path, cwd, home),
             human_bytes(r.bytes), ", ".join(r.paths) if r.conditional else "always")
            for r in res.rules
        ], ("kind", "path", "size", "applies to"), right=(2,), nowrap=(1,))
    else:
        _line(out, "rules: none")
    _problems(out, res.errors, cwd, home)
