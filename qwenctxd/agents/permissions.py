"""Permission scope of a background agent: what it may write and run, decided before any tool
runs, and reported back to the model as the tool result when refused.

Writes are allowed only inside the project or user memory roots, judged on the realpath of
the nearest existing parent (so ``memory/../..`` and a symlinked parent cannot escape), and a
symlink leaf whose target does not exist yet is refused (it could point anywhere). Team memory
is never auto-allowed (it is shared with the repository). Shell commands run only when the
tree-sitter AST proves them read-only. Several rule sources merge with priority
deny > ask > allow > default; for a background agent "ask" and "default" both mean no.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qwenctxd.memory.paths import MEMORY_TYPES


class Decision(enum.IntEnum):
    DEFAULT = 1
    ALLOW = 2
    ASK = 3
    DENY = 4


def merge(*decisions: Decision) -> Decision:
    """deny > ask > allow > default."""
    return max(decisions, default=Decision.DEFAULT)


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.ALLOW


def _nearest_existing_realpath(path: Path) -> Path:
    """realpath of ``path`` resolved through its nearest existing ancestor."""
    probe = path
    tail: list[str] = []
    while not os.path.lexists(probe):
        if probe.parent == probe:
            break
        tail.append(probe.name)
        probe = probe.parent
    base = Path(os.path.realpath(probe))
    for part in reversed(tail):
        base = base / part
    return Path(os.path.normpath(base))


def _inside(path: Path, root: Path) -> bool:
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return False
    return rel != ".." and not rel.startswith(".." + os.sep) and not os.path.isabs(rel)


@dataclass
class MemoryWriteScope:
    """Where a memory agent may write: project and/or user memory roots, never team."""

    writable_roots: Sequence[Path]
    team_root: Path | None = None
    denied_roots: Sequence[Path] = field(default_factory=list)

    def check_write(self, raw: str | Path) -> Verdict:
        path = Path(raw)
        if not path.is_absolute():
            return Verdict(Decision.DENY, f"write refused: {raw} is not an absolute path")
        norm = Path(os.path.normpath(path))
        if os.path.islink(norm) and not os.path.exists(norm):
            return Verdict(Decision.DENY, f"write refused: {raw} is a symlink to a missing target")
        real = _nearest_existing_realpath(norm)
        team = self.team_root
        if team is not None and (_inside(real, _nearest_existing_realpath(team))
                                 or _inside(norm, team)):
            return Verdict(Decision.DENY, "write refused: team memory is never written by a "
                                          "background agent")
        for root in self.denied_roots:
            if _inside(real, _nearest_existing_realpath(root)):
                return Verdict(Decision.DENY, f"write refused: {raw} is in a protected directory")
        for root in self.writable_roots:
            root_real = _nearest_existing_realpath(root)
            if _inside(real, root_real) and real != root_real:
                return Verdict(Decision.ALLOW, "inside a memory root")
        roots = " or ".join(str(r) for r in self.writable_roots) or "(none)"
        return Verdict(Decision.DENY, f"write refused: only files within {roots} may be written")

    def touched_topic(self, raw: str | Path) -> str | None:
        """The memory type a written path belongs to: the first segment under a root, which
        must be followed by ``/`` (``/`` normalised) and be one of the four types."""
        p = str(raw).replace("\\", "/")
        for root in self.writable_roots:
            r = str(root).replace("\\", "/").rstrip("/")
            if p.startswith(r) and len(p) > len(r) and p[len(r)] == "/":
                first = p[len(r) + 1:].split("/", 1)
                if len(first) == 2 and first[0] in MEMORY_TYPES:
                    return first[0]
        return None


def shell_verdict(command: str) -> Verdict:
    from qwenctxd.agents.shell_readonly import classify

    v = classify(command)
    if v.read_only:
        return Verdict(Decision.ALLOW, "read-only command")
    return Verdict(Decision.DENY, f"run_shell_command refused: only read-only commands may run "
                                  f"({v.reason})")
