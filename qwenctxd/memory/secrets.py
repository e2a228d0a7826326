"""The memory write guard over the one scanner (:mod:`qwenctxd.secrets`; SPEC §S5, §S16).

Every memory write, in every scope and from every writer, is judged here:

* **team** memory (committed to the repository, read by every collaborator) keeps refusing a
  write that holds a secret (:func:`check_write` / :func:`vet_write` → ``refuse``);
* **project** and **user** memory get the write with each secret replaced by
  ``[redacted: <rule id>]`` (``redact``), so the file on disk never holds it;
* anything else is not a memory write and is allowed as it is.

:func:`scan` keeps the old shape (one :class:`SecretHit` per fired rule, in rule order, no
matched text) for the refusal message and ``memory.check_write``'s ``rules``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from qwenctxd import secrets as scanner
from qwenctxd.secrets.rules import RULES, Rule

__all__ = [
    "RULES",
    "GuardResult",
    "SecretHit",
    "SecretRule",
    "WriteVerdict",
    "block_message",
    "check_write",
    "scan",
    "vet_document",
    "vet_write",
]

SecretRule = Rule
_LABELS = {r.id: r.label for r in RULES} | {
    "aws-secret-access-key": "AWS Secret Access Key", "generic-password": "Password assignment"}
_ORDER = {r.id: i for i, r in enumerate(RULES)} | {
    "aws-secret-access-key": 0.5, "generic-password": len(RULES)}


@dataclass(frozen=True)
class SecretHit:
    """A fired rule. Deliberately carries no matched text, offset or context."""

    rule_id: str
    label: str


@dataclass(frozen=True)
class GuardResult:
    """Outcome of :func:`check_write`."""

    allowed: bool
    rules: list[SecretHit] = field(default_factory=list)
    message: str | None = None


@dataclass(frozen=True)
class WriteVerdict:
    """What a memory write becomes: ``allow`` (as is), ``redact`` (``text`` is the redacted
    content, ``redacted`` the ``[{rule, count}]`` summary) or ``refuse`` (team memory)."""

    action: Literal["allow", "redact", "refuse"]
    text: str
    rules: list[SecretHit] = field(default_factory=list)
    redacted: list[dict[str, object]] = field(default_factory=list)
    message: str | None = None


def hits_of(findings: tuple[scanner.Finding, ...] | list[scanner.Finding]) -> list[SecretHit]:
    ids = sorted({r for f in findings for r in f.rules}, key=lambda r: _ORDER.get(r, 99))
    return [SecretHit(r, _LABELS.get(r, r)) for r in ids]


def scan(text: str) -> list[SecretHit]:
    """One :class:`SecretHit` per rule that fires on ``text``, in rule order."""
    return hits_of(scanner.scan(text))


def block_message(hits: list[SecretHit]) -> str:
    """The refusal shown to the model/user; names rule labels only."""
    labels = ", ".join(hit.label for hit in hits)
    return (
        f"Content contains potential secrets ({labels}) and cannot be written to team memory. "
        "Team memory is shared with everyone who can read the repository; "
        "remove the sensitive content and try again."
    )


def vet_write(scope: str | None, text: str) -> WriteVerdict:
    """The verdict for writing ``text`` into memory ``scope`` (None: not a memory)."""
    if scope is None:
        return WriteVerdict("allow", text)
    red = scanner.redact(text)
    if not red.changed:
        return WriteVerdict("allow", text)
    hits = hits_of(red.findings)
    if scope == "team":
        return WriteVerdict("refuse", text, hits, message=block_message(hits))
    return WriteVerdict("redact", red.text, hits, red.summary())


def redaction_note(redacted: list[dict[str, object]]) -> str:
    """``2 secrets (github-pat ×1, generic-password ×1)`` for a tool result or a log line."""
    total = sum(int(str(r["count"])) for r in redacted)
    what = ", ".join(f"{r['rule']} ×{r['count']}" for r in redacted)
    return f"{total} secret{'s' if total != 1 else ''} ({what})"


def check_write(path: Path, content: str, *, is_team_path: Callable[[Path], bool]) -> GuardResult:
    """Guard one write against the team rule.

    Only paths that ``is_team_path`` classifies as team memory are scanned (the predicate is
    responsible for symlink decoys and for classifying paths even when the team tier is
    disabled). If it cannot classify the path (``OSError``/``ValueError``), the write is
    treated as a team write: the guard fails closed. Other paths are allowed here (project and
    user writes are redacted instead: :func:`vet_write`).
    """
    try:
        team = bool(is_team_path(path))
    except (OSError, ValueError):
        team = True
    if not team:
        return GuardResult(allowed=True)
    hits = scan(content)
    if not hits:
        return GuardResult(allowed=True)
    return GuardResult(allowed=False, rules=hits, message=block_message(hits))


_FM_LINE = re.compile(r"^(\s*[A-Za-z_][\w-]*:[ \t]+)(.*\[redacted: [a-z0-9-]+\].*)$")


def _quote_frontmatter(text: str) -> str:
    """Re-quote a frontmatter value a marker landed in: ``[redacted: x]`` in a plain YAML
    scalar (``description: key [redacted: x]``) would not parse."""
    if not text.startswith("---"):
        return text
    end = text.find("\n---", 3)
    if end < 0:
        return text
    head = text[:end].split("\n")
    for i, line in enumerate(head[1:], 1):
        m = _FM_LINE.match(line)
        if m and not m.group(2).lstrip().startswith(("\"", "'")):
            head[i] = m.group(1) + json.dumps(m.group(2).strip(), ensure_ascii=False)
    return "\n".join(head) + text[end:]


def vet_document(scope: str | None, text: str) -> WriteVerdict:
    """:func:`vet_write` for a whole memory file: a marker inside the frontmatter keeps the
    frontmatter valid YAML."""
    verdict = vet_write(scope, text)
    if verdict.action != "redact":
        return verdict
    return WriteVerdict("redact", _quote_frontmatter(verdict.text), verdict.rules,
                        verdict.redacted)
