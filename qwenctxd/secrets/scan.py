"""The one secret scanner: findings with spans in the original text, and redaction.

:func:`scan` runs every rule of :mod:`qwenctxd.secrets.rules` over the normalised views of a
text (:mod:`qwenctxd.secrets.normalise`), decodes base64 runs and scans what they hold (two
levels deep), looks for an AWS secret access key (40 base64 characters of high entropy) next
to an AWS access key id, and returns :class:`Finding` s — rule id and the span *of the text as
written* — with overlaps merged (the more specific rule names the merged span). A finding
inside a base64 run covers the whole run, so neither the key nor its encoded form survives.

:func:`redact` replaces each finding by ``[redacted: <rule id>]`` and counts them per rule;
redacting redacted text finds nothing more (the marker is never taken for a value).

No matched text is logged or stored here: findings carry offsets and rule ids only.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from qwenctxd.secrets.normalise import View, base64_runs, decode_base64, views
from qwenctxd.secrets.rules import RULES, entropy

__all__ = ["Finding", "Redaction", "marker", "redact", "scan"]

MAX_DEPTH = 2
AWS_CONTEXT_CHARS = 256
JOIN_WINDOW = 1100  # > the longest bounded token a join can complete (PEMs: the base view)
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_PRIORITY = {rule.id: i for i, rule in enumerate(RULES)}
_PRIORITY["aws-secret-access-key"] = _PRIORITY["aws-access-token"]
_PRIORITY["generic-password"] = _PRIORITY["generic-api-key"]
_FALLBACK = frozenset({"generic-api-key", "generic-password", "bearer-token"})


@dataclass(frozen=True, order=True)
class Finding:
    """A secret at ``text[start:end]`` (original offsets) found by rule ``rule``; ``also``
    names the other rules whose findings were merged into this span."""

    start: int
    end: int
    rule: str
    also: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[str, ...]:
        return (self.rule, *self.also)


@dataclass(frozen=True)
class Redaction:
    """The redacted text, what was found, and the count per rule (in first-seen order)."""

    text: str
    findings: tuple[Finding, ...]

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(f.rule for f in self.findings))

    @property
    def changed(self) -> bool:
        return bool(self.findings)

    def summary(self) -> list[dict[str, object]]:
        """``[{rule, count}]`` — the shape results and the audit log carry."""
        return [{"rule": r, "count": n} for r, n in self.counts.items()]


def marker(rule: str) -> str:
    return f"[redacted: {rule}]"


def _aws_secret(text: str, start: int, end: int) -> list[tuple[int, int]]:
    lo, hi = max(0, start - AWS_CONTEXT_CHARS), min(len(text), end + AWS_CONTEXT_CHARS)
    out = []
    for m in _AWS_SECRET.finditer(text, lo, hi):
        v = m.group()
        if entropy(v) >= 4.0 and any(c.isupper() for c in v) and any(c.islower() for c in v) \
                and any(c.isdigit() for c in v):
            out.append(m.span())
    return out


def _windows(view: View) -> list[tuple[int, int]]:
    """Where the joined view differs from the base view: around each join, merged."""
    out: list[tuple[int, int]] = []
    for p in view.out:
        lo, hi = max(0, p - JOIN_WINDOW), min(len(view.text), p + JOIN_WINDOW)
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _scan_view(view: View, depth: int, out: list[Finding],
               windows: list[tuple[int, int]] | None = None) -> None:
    text = view.text
    spans = windows if windows is not None else [(0, len(text))]
    low = text.lower() if windows is None else " ".join(text[a:b].lower() for a, b in spans)
    for rule in RULES:
        if rule.needle is not None and rule.needle not in low:
            continue
        for m in (m for a, b in spans for m in rule.pattern.finditer(text, a, b)):
            rule_id = rule.id
            if rule.check is not None:
                verdict = rule.check(m)
                if not verdict:
                    continue
                if isinstance(verdict, str):
                    rule_id = verdict
            s, e = m.span(rule.group)
            if s == e:
                continue
            os_, oe = view.span(s, e)
            out.append(Finding(os_, oe, rule_id))
            if rule_id == "aws-access-token":
                for s2, e2 in _aws_secret(text, s, e):
                    a, b = view.span(s2, e2)
                    out.append(Finding(a, b, "aws-secret-access-key"))
    if depth >= MAX_DEPTH:
        return
    for s, e in (r for a, b in spans for r in base64_runs(text, a, b)):
        decoded = decode_base64(text[s:e])
        if decoded is None:
            continue
        inner = _scan_text(decoded, depth + 1)
        if inner:
            a, b = view.span(s, e)
            best = min(inner, key=lambda f: _PRIORITY.get(f.rule, 99))
            out.append(Finding(a, b, best.rule))


def _scan_text(text: str, depth: int) -> list[Finding]:
    found: list[Finding] = []
    base, *joined = views(text)
    _scan_view(base, depth, found)
    for view in joined:  # the same text except near each join: scan only there
        _scan_view(view, depth, found, _windows(view))
    return _merge(found)


def _merge(found: list[Finding]) -> list[Finding]:
    if not found:
        return []
    found.sort(key=lambda f: (f.start, -f.end))
    merged: list[Finding] = []
    for f in found:
        if merged and f.start < merged[-1].end:
            last = merged[-1]
            rules = sorted({*last.rules, f.rule}, key=lambda r: _PRIORITY.get(r, 99))
            specific = [r for r in rules if r not in _FALLBACK]
            rules = specific or rules  # a generic assignment adds nothing to a known format
            merged[-1] = Finding(last.start, max(last.end, f.end), rules[0], tuple(rules[1:]))
        else:
            merged.append(f)
    return merged


def scan(text: str) -> list[Finding]:
    """Every secret in ``text``, by original offsets, sorted and non-overlapping."""
    if not text:
        return []
    return _scan_text(text, 0)


def redact(text: str) -> Redaction:
    """``text`` with every finding replaced by its ``[redacted: <rule id>]`` marker."""
    findings = scan(text)
    if not findings:
        return Redaction(text, ())
    parts = []
    pos = 0
    for f in findings:
        parts.append(text[pos:f.start])
        parts.append(marker(f.rule))
        pos = f.end
    parts.append(text[pos:])
    return Redaction("".join(parts), tuple(findings))
