"""Skill data types shared by parsing, discovery, activation and listing.

A skill is a directory holding a ``SKILL.md`` file (YAML frontmatter + markdown body). Levels
rank where a skill came from: project > user > extension > bundled; the first skill seen under
a name wins and the others are kept as ``shadowed`` so ``skills.list`` can show them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Level = Literal["project", "user", "extension", "bundled"]

#: Precedence order, most important first.
LEVELS: tuple[Level, ...] = ("project", "user", "extension", "bundled")


@dataclass(frozen=True)
class Skill:
    """One parsed SKILL.md.

    ``paths`` holds the globs as declared in the frontmatter (string entries only); ``matcher``
    is compiled from the valid ones. A skill that declared ``paths:`` is conditional even when
    every pattern was invalid: its author meant it to be gated, so it stays hidden (and the bad
    patterns are reported) instead of leaking into every listing.
    """

    name: str
    description: str
    level: Level
    path: Path
    base_dir: Path
    body: str
    paths: tuple[str, ...] = ()
    allowed_tools: tuple[str, ...] = ()
    model: str | None = None
    argument_hint: str | None = None
    when_to_use: str | None = None
    disable_model_invocation: bool = False
    user_invocable: bool = True
    priority: float | None = None
    matcher: Any = field(default=None, compare=False, hash=False, repr=False)

    @property
    def conditional(self) -> bool:
        """True when the skill is hidden until a touched path matches one of its globs."""
        return bool(self.paths)

    def matches(self, rel_path: str) -> bool:
        """Does a project-relative forward-slash path match one of the valid globs?"""
        if self.matcher is None:
            return False
        return bool(self.matcher.match(rel_path))


@dataclass
class SkillError:
    """A problem found while discovering or parsing skills; shown to users, never raised.

    ``path`` is the SKILL.md (or base directory) path, or ``"{SKILL.md}#paths[{pattern}]"``
    for a glob that did not compile.
    """

    path: str
    message: str


@dataclass
class BaseDir:
    """A directory scanned for ``<name>/SKILL.md`` (``exists``: it was a directory when listed)."""

    level: Level
    path: Path
    exists: bool


@dataclass
class SkillSet:
    """The outcome of one discovery pass.

    ``skills`` maps name → winning skill (inserted in name order, so iteration is sorted);
    ``shadowed`` holds same-named skills that lost to a higher-precedence one; ``disabled``
    holds winners removed by ``skills.disabled`` / ``skills.defaultDisabled``.
    """

    skills: dict[str, Skill] = field(default_factory=dict)
    errors: list[SkillError] = field(default_factory=list)
    bases: list[BaseDir] = field(default_factory=list)
    shadowed: list[Skill] = field(default_factory=list)
    disabled: list[Skill] = field(default_factory=list)
