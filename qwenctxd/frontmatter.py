"""YAML frontmatter (``---`` fenced, PyYAML safe_load) shared by rules, skills and memories.

Parsing never raises: a file with broken frontmatter yields an error message the caller shows
to users (``instructions.files``, ``skills.list``, ``memory.list``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

# libyaml's safe loader when PyYAML was built with it (3-4x faster), else the pure-Python one
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Frontmatter:
    data: dict[str, Any] = field(default_factory=dict)
    body: str = ""
    present: bool = False
    error: str | None = None


def parse(text: str) -> Frontmatter:
    """Split ``text`` into frontmatter data and body.

    No leading ``---`` line → no frontmatter (body is the whole text). An unclosed block, YAML
    that does not parse, or YAML that is not a mapping → ``error`` set and ``body`` the text
    after the block (or the whole text when unclosed).
    """
    src = text.removeprefix("\ufeff")
    lines = src.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n").rstrip() != "---":
        return Frontmatter(body=src)
    for i in range(1, len(lines)):
        if lines[i].rstrip("\r\n").rstrip() in ("---", "..."):
            raw = "".join(lines[1:i])
            body = "".join(lines[i + 1 :])
            try:
                data = yaml.load(raw, Loader=_LOADER) if raw.strip() else {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" at line {mark.line + 2}" if mark is not None else ""
                problem = getattr(exc, "problem", None) or type(exc).__name__
                return Frontmatter(body=body, present=True, error=f"invalid YAML{where}: {problem}")
            if data is None:
                data = {}
            if not isinstance(data, dict):
                return Frontmatter(body=body, present=True,
                                   error="frontmatter is not a mapping of keys to values")
            return Frontmatter(data=data, body=body, present=True)
    return Frontmatter(body=src, present=True, error="frontmatter block is not closed by ---")
