"""Permission scope of a background agent: what it may write and run, decided before any tool
runs, and reported back to the model as the tool result when refused.

Writes are allowed only inside the project or user memory roots, judged by the agents' one
containment rule (:func:`~qwenctxd.agents.containment.contained_key`: realpath of the nearest
existing ancestor, so ``memory/../..`` and a symlinked parent cannot escape), and a
symlink leaf whose target does not exist yet is refused (it could point anywhere). Team memory
is never auto-allowed (it is shared with the repository). Shell commands run only when the
tree-sitter AST proves them read-only. Several rule sources merge with priority
deny > ask > allow > default; for a background agent "ask" and "default" both mean no.

Reads are confined too (:class:`ReadScope`): a read must land, by the same containment rule,
inside one of the run's read roots (the project root and the memory roots; the dream adds its
project's transcripts), and never on a credential path
(:mod:`qwenctxd.agents.credentials`), wherever it is.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qwenctxd.agents.containment import contained_key, is_within
from qwenctxd.agents.credentials import credential_reason
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


def _inside(path: Path, root: Path) -> bool:
    """Lexically: normalised absolute ``path`` is ``root`` or below it."""
    return is_within(str(path), os.path.normpath(os.path.abspath(root)))


@dataclass
class MemoryWriteScope:
    """Where a memory agent may write: project and/or user memory roots, never team."""

    writable_roots: Sequence[Path]
    team_root: Path | None = None
    denied_roots: Sequence[Path] = field(default_factory=list)
    file_mode: int = 0o644  # a file the agent creates (memory scopes: 0600, see memory())
    dir_mode: int | None = None  # a folder the agent creates (memory scopes: 0700)

    @classmethod
    def memory(cls, writable_roots: Sequence[Path], team_root: Path | None = None
               ) -> MemoryWriteScope:
        """A scope over memory roots: what the agent creates there is private to the user
        (files 0600, folders 0700); existing files keep their modes."""
        return cls(writable_roots=writable_roots, team_root=team_root, file_mode=0o600,
                   dir_mode=0o700)

    def check_write(self, raw: str | Path) -> Verdict:
        path = Path(raw)
        if not path.is_absolute():
            return Verdict(Decision.DENY, f"write refused: {raw} is not an absolute path")
        norm = Path(os.path.normpath(path))
        if os.path.islink(norm) and not os.path.exists(norm):
            return Verdict(Decision.DENY, f"write refused: {raw} is a symlink to a missing target")
        team = self.team_root
        if team is not None and (contained_key(norm, team) is not None or _inside(norm, team)):
            return Verdict(Decision.DENY, "write refused: team memory is never written by a "
                                          "background agent")
        for root in self.denied_roots:
            if contained_key(norm, root) is not None:
                return Verdict(Decision.DENY, f"write refused: {raw} is in a protected directory")
        for root in self.writable_roots:
            if contained_key(norm, root) not in (None, ""):
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


@dataclass
class ReadScope:
    """Where an agent may read: inside ``roots`` (judged where a path really lands), and
    never a credential path. ``refusal`` is the sentence the model reads, or None."""

    roots: Sequence[Path]

    @classmethod
    def of(cls, *roots: Path | str | None) -> ReadScope:
        """The scope of the given roots (None and duplicates dropped, order kept)."""
        seen = dict.fromkeys(Path(os.path.normpath(os.path.abspath(r)))
                             for r in roots if r is not None)
        return cls(list(seen))

    def refusal(self, raw: str | Path) -> str | None:
        path = Path(os.path.normpath(os.path.abspath(raw)))
        why = credential_reason(path)
        if why is not None:
            return (f"read refused: {raw} is {why}; background agents never read credential "
                    "files")
        if not any(contained_key(path, root) is not None for root in self.roots):
            roots = ", ".join(str(r) for r in self.roots) or "(none)"
            return (f"read refused: {raw} is outside the directories this agent may read "
                    f"({roots})")
        return None

    def allows(self, raw: str | Path) -> bool:
        return self.refusal(raw) is None


def shell_verdict(command: str) -> Verdict:
    from qwenctxd.agents.shell_readonly import classify

    v = classify(command)
    if v.read_only:
        return Verdict(Decision.ALLOW, "read-only command")
    return Verdict(Decision.DENY, f"run_shell_command refused: only read-only commands may run "
                                  f"({v.reason})")
