"""Project rules: ``<root>/.qwen/rules/*.md``.

A rule without ``paths:`` frontmatter is a baseline rule, appended to the instructions. A rule
with ``paths:`` (a glob or a list of globs, matched like conditional skills: wcmatch with
GLOBSTAR, BRACE and DOTGLOB against project-relative forward-slash paths) is conditional: it
stays out of the system prompt and is delivered as a reminder once a touched path matches. A
bad pattern drops only itself and is reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from wcmatch import glob

from qwenctxd import frontmatter
from qwenctxd.fsutil import read_regular

GLOB_FLAGS = glob.GLOBSTAR | glob.BRACE | glob.DOTGLOB | glob.FORCEUNIX
MAX_RULE_BYTES = 64 * 1024


@dataclass
class Rule:
    path: Path
    body: str
    patterns: list[str] = field(default_factory=list)
    _matcher: object | None = None

    @property
    def conditional(self) -> bool:
        return bool(self.patterns)

    def matches(self, rel_path: str) -> bool:
        if self._matcher is None:
            return False
        return bool(self._matcher.match(rel_path))  # type: ignore[attr-defined]


@dataclass
class RuleSet:
    directory: Path
    baseline: list[Rule] = field(default_factory=list)
    conditional: list[Rule] = field(default_factory=list)
    problems: list[tuple[Path, str]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def compile_patterns(patterns: list[str], where: str) -> tuple[object | None, list[str], list[str]]:
    """(matcher, good patterns, problems) — each bad pattern dropped on its own."""
    good: list[str] = []
    problems: list[str] = []
    for pat in patterns:
        if not isinstance(pat, str) or not pat.strip():
            problems.append(f"{where}#paths[{pat!r}]: not a non-empty string")
            continue
        try:
            glob.compile([pat], flags=GLOB_FLAGS)
        except Exception as exc:  # wcmatch raises several types for bad patterns
            problems.append(f"{where}#paths[{pat}]: {exc}")
            continue
        good.append(pat)
    matcher = glob.compile(good, flags=GLOB_FLAGS) if good else None
    return matcher, good, problems


def relative_to_root(path: str | Path, root: Path) -> str | None:
    """Project-relative forward-slash form of ``path``; None if it is outside ``root``."""
    p = Path(path)
    absolute = p if p.is_absolute() else root / p
    rel = os.path.relpath(os.path.normpath(absolute), root)
    if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
        return None
    return rel.replace(os.sep, "/")


def load_rules(root: Path) -> RuleSet:
    directory = root / ".qwen" / "rules"
    rs = RuleSet(directory=directory)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".md"))
    except FileNotFoundError:
        return rs
    except OSError as exc:
        rs.problems.append((directory, f"unreadable rules directory: {exc.strerror}"))
        return rs
    for name in names:
        path = directory / name
        try:
            raw = read_regular(path)
        except OSError as exc:
            rs.problems.append((path, f"unreadable: {exc.strerror}"))
            continue
        if not os.path.isfile(path):
            continue
        rs.files.append(path)
        text = raw[:MAX_RULE_BYTES].decode("utf-8", errors="replace")
        if len(raw) > MAX_RULE_BYTES:
            rs.problems.append((path, f"truncated: {len(raw)} bytes, over {MAX_RULE_BYTES}"))
        fm = frontmatter.parse(text)
        if fm.error:
            rs.problems.append((path, fm.error))
        body = fm.body.strip()
        if not body:
            continue
        raw_paths = fm.data.get("paths")
        if raw_paths is None:
            rs.baseline.append(Rule(path=path, body=body))
            continue
        pats = [raw_paths] if isinstance(raw_paths, str) else raw_paths
        if not isinstance(pats, list):
            rs.problems.append((path, "paths: must be a glob or a list of globs"))
            continue
        matcher, good, problems = compile_patterns(pats, str(path))
        rs.problems.extend((path, p) for p in problems)
        if good:
            rs.conditional.append(Rule(path=path, body=body, patterns=good, _matcher=matcher))
    return rs


def rule_reminder(path: Path, root: Path, body: str) -> str:
    """The system-reminder text that delivers a conditional rule once it applies."""
    rel = relative_to_root(path, root) or str(path)
    return (
        "<system-reminder>\n"
        f"The project rule {rel} applies to files you are working on now:\n\n"
        f"{body.strip()}\n"
        "</system-reminder>"
    )
