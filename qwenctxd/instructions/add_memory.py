"""``/memory add``: append a bullet under ``## Qwen Added Memories`` in the right QWEN.md.

Scope ``global`` writes ``~/.qwen/<first context filename>``; ``project`` writes the file of
that name at the project root, and only there (:func:`project_target`): the git root, else the
nearest directory from the cwd upwards that already holds that file or a ``.qwen`` directory
(never ``/``, never above the home directory, never the global ``~/.qwen`` itself). A cwd in
no project is refused (``NotInProject``) instead of leaving a QWEN.md in ``/tmp`` or ``/``. The
file and the section are created when missing; the write is atomic (temp file + rename) so an
editor or a crash never sees half a file. A secret in the text is replaced by
``[redacted: <rule id>]`` first (:func:`qwenctxd.secrets.redact`): the QWEN.md memories ride in
every system prompt.
"""

from __future__ import annotations

import os
from pathlib import Path

from qwenctxd.fsutil import atomic_write, read_regular
from qwenctxd.secrets import COUNTERS, redact

SECTION_HEADER = "## Qwen Added Memories"


class NotInProject(ValueError):
    """Project scope asked for a directory that belongs to no project."""


def project_target(cwd: Path, name: str, *, git_root: Path | None, home: Path,
                   qwen_home: Path) -> Path:
    """Where a project-scope memory goes: ``<root>/<name>`` for the git root, else for the
    nearest directory from ``cwd`` up (inclusive) holding ``name`` or a ``.qwen`` directory
    that is not the global ``qwen_home``; the walk stops below ``/`` and at ``home`` (which
    counts only for a ``name`` file of its own). NotInProject when there is none."""
    if git_root is not None:
        return git_root / name
    start = Path(os.path.normpath(os.path.abspath(cwd)))
    home = Path(os.path.normpath(os.path.abspath(home)))
    under_home = start == home or home in start.parents
    for directory in (start, *start.parents):
        if directory == directory.parent:  # the filesystem root is never a project
            break
        if under_home and directory in home.parents:
            break
        if (directory / name).is_file():
            return directory / name
        qwen = directory / ".qwen"
        if qwen.is_dir() and os.path.realpath(qwen) != os.path.realpath(qwen_home):
            return directory / name
        if directory == home:
            break
    raise NotInProject(f"{cwd} is not inside a project (no git root, {name} or .qwen)")


def bullet(text: str) -> str:
    """One bullet line: whitespace collapsed (no newline can start a new section), leading
    list markers dropped."""
    flat = " ".join(text.split())
    flat = flat.lstrip("-*").strip()
    if not flat:
        raise ValueError("memory text is empty")
    return f"- {flat}"


def insert_bullet(content: str, line: str) -> str:
    """``content`` with ``line`` appended to the end of the memories section (created at the
    end of the file when absent)."""
    lines = content.splitlines()
    try:
        start = next(i for i, x in enumerate(lines) if x.strip() == SECTION_HEADER)
    except StopIteration:
        prefix = content.rstrip("\n")
        sep = "\n\n" if prefix else ""
        return f"{prefix}{sep}{SECTION_HEADER}\n{line}\n"
    end = len(lines)
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("#") and not lines[i].startswith("###"):
            end = i
            break
    insert_at = end
    while insert_at > start + 1 and not lines[insert_at - 1].strip():
        insert_at -= 1
    new = lines[:insert_at] + [line] + lines[insert_at:]
    if end < len(lines) and insert_at == end:
        new.insert(insert_at + 1, "")
    return "\n".join(new) + "\n"


def add_memory(target: Path, text: str) -> Path:
    red = redact(text)
    COUNTERS.add("redacted_writes", len(red.findings))
    line = bullet(red.text)
    try:
        current = read_regular(target).decode("utf-8")
    except FileNotFoundError:
        current = ""
    atomic_write(target, insert_bullet(current, line))
    return target
