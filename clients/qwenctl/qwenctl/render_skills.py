"""Human output of ``qwenctl skills``: the skills list and one skill's detail
(generic helpers live in :mod:`qwenctl.render`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from qwenctl.render import (
    _last_column_width,
    _line,
    first_line,
    short_path,
    table_to,
    truncate,
)

if TYPE_CHECKING:
    from qwenctxd.protocol.skills import ListResult, LoadResult, SkillInfo


def skill_applies(s: SkillInfo) -> str:
    """``"always"`` for an unconditional skill, else its globs."""
    if not s.conditional:
        return "always"
    return ", ".join(s.paths) or "(no valid globs)"


def skills_report(res: ListResult, *, cwd: str, home: str | None,
                  stream: TextIO | None = None) -> None:
    """The ``skills.list`` result: skills (first description line, cut to fit), the skills
    they shadow, and load errors."""
    out = stream or sys.stdout
    _line(out, f"skills for {short_path(cwd, None, home)}")
    skills = res.skills
    if skills:
        headers = ("name", "level", "applies to", "model-invocable", "description")
        rows = [(s.name, s.level, skill_applies(s), "yes" if s.model_invocable else "no",
                 first_line(s.description or "")) for s in skills]
        room = _last_column_width(out, rows, headers)
        rows = [(*r[:-1], truncate(r[-1], room)) for r in rows]
        table_to(out, f"skills ({len(skills)})", rows, headers, nowrap=(0, 4))
    else:
        _line(out, "skills: none")
    shadowed = res.shadowed
    if shadowed:
        table_to(out, "shadowed (a higher level has a skill of the same name)",
                 [(s.name, s.level, short_path(s.path, cwd, home)) for s in shadowed],
                 ("name", "level", "path"), nowrap=(0, 2))
    else:
        _line(out, "shadowed: none")
    errors = res.errors
    if errors:
        table_to(out, "errors",
                 [(short_path(e.path, cwd, home), e.message) for e in errors],
                 ("path", "message"), nowrap=(0,))
    else:
        _line(out, "errors: none")


def skill_detail(info: SkillInfo | None, loaded: LoadResult,
                 shadowed: list[SkillInfo], *, cwd: str, home: str | None,
                 stream: TextIO | None = None) -> None:
    """One skill: its ``skills.list`` metadata, what it shadows, then the full text
    ``skills.load`` returns (verbatim, after a blank line)."""
    out = stream or sys.stdout
    rows: list[tuple[str, ...]] = [("name", loaded.name)]
    if info is not None:
        rows += [
            ("level", info.level),
            ("path", short_path(info.path, cwd, home)),
        ]
    rows.append(("base dir", short_path(loaded.base_dir, cwd, home)))
    if info is not None:
        rows += [
            ("applies to", skill_applies(info)),
            ("model-invocable", "yes" if info.model_invocable else "no"),
        ]
        desc = [ln.strip() for ln in (info.description or "").splitlines() if ln.strip()]
        rows += [("description" if i == 0 else "", ln) for i, ln in enumerate(desc or ["-"])]
    lw = max((len(s.level) for s in shadowed), default=0)
    for i, s in enumerate(shadowed):
        rows.append(("shadows" if i == 0 else "",
                     f"{s.level.ljust(lw)}  {short_path(s.path, cwd, home)}"))
    table_to(out, f"skill {loaded.name}", rows, nowrap=(0,))
    content = loaded.content
    out.write("\n" + content + ("" if content.endswith("\n") else "\n"))
