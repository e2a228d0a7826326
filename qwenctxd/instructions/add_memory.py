"""``/memory add``: append a bullet under ``## Qwen Added Memories`` in the right QWEN.md.

Scope ``global`` writes ``~/.qwen/<first context filename>``; ``project`` writes the file of
that name at the project root (the cwd when there is no root). The file and the section are
created when missing; the write is atomic (temp file + rename) so an editor or a crash never
sees half a file. A secret in the text is replaced by ``[redacted: <rule id>]`` first
(:func:`qwenctxd.secrets.redact`): the QWEN.md memories ride in every system prompt.
"""

from __future__ import annotations

from pathlib import Path

from qwenctxd.fsutil import atomic_write, read_regular
from qwenctxd.secrets import COUNTERS, redact

SECTION_HEADER = "## Qwen Added Memories"


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
