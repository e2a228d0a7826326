"""Secret scanner and team-memory write guard (reference §3.10, SPEC §S5).

A curated, gitleaks-derived rule set used to stop credentials from being written
into *team* memory, which is committed to the repository and therefore shared
with everyone who can read it.

Design constraints:

* **Linear time.**  Python's ``re`` is a backtracking engine, so every rule is
  written to do a bounded amount of work per candidate start position and to
  keep candidate starts from piling up on the same run of characters:

  - every quantifier has an explicit upper bound (``{20,}`` → ``{20,512}``);
  - where a required suffix shares characters with the run before it, the run
    is *tempered* (it cannot step over the suffix's first character when the
    suffix follows) and *possessive* (``{m,n}+``), so a failed attempt never
    backtracks; where the next character cannot belong to the run, the run is
    possessive for free;
  - the run before the OpenAI ``T3BlbkFJ`` marker also stops at the next
    ``sk-``, so attempts from successive ``sk-`` prefixes cover disjoint runs
    (``sk-sk-sk-…`` costs O(n), not O(n × 512));
  - the private-key header run excludes ``-`` and the body cannot contain
    ``--``, so a body attempt stops at the next ``-----`` marker and each
    character is examined by at most one attempt.

* **No secret values leave this module.**  :func:`scan` returns rule ids and
  labels only (one per fired rule, in :data:`RULES` order); nothing logs or
  stores the matched text.

All patterns use ``re.ASCII`` (``\\w``/``\\d``/``\\b`` and case folding are ASCII, as
in the JavaScript source) and are applied with ``Pattern.search``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "RULES",
    "GuardResult",
    "SecretHit",
    "SecretRule",
    "block_message",
    "check_write",
    "scan",
]

_A = re.ASCII
_AI = re.ASCII | re.IGNORECASE

# Upper bounds replacing the source's open-ended quantifiers.
_TOKEN_MAX = 512  # long API tokens (Anthropic, OpenAI project keys, HF, Slack)
_PEM_BODY_MAX = 16384  # chars between BEGIN and END lines (RSA-16384 PKCS#8 ~ 12.7 KB)
_PEM_LABEL_MAX = 100  # as in the source: text between BEGIN/END and PRIVATE KEY


@dataclass(frozen=True)
class SecretRule:
    """One detection rule: stable id, human-readable label, compiled pattern."""

    id: str
    label: str
    pattern: re.Pattern[str] = field(repr=False)


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


def _rule(rule_id: str, label: str, pattern: str, flags: int = _A) -> SecretRule:
    return SecretRule(rule_id, label, re.compile(pattern, flags))


_T = _TOKEN_MAX
_PEM_LABEL = rf"[ A-Z0-9_]{{0,{_PEM_LABEL_MAX}}}PRIVATE KEY(?: BLOCK)?-----"

RULES: tuple[SecretRule, ...] = (
    _rule(
        "aws-access-token",
        "AWS Access Token",
        r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b",
    ),
    _rule("alibaba-cloud-access-key", "Alibaba Cloud Access Key", r"\bLTAI[a-zA-Z0-9]{12,20}\b"),
    _rule("gcp-api-key", "GCP API Key", r"AIza[\w-]{35}"),
    _rule("digitalocean-pat", "DigitalOcean PAT", r"dop_v1_[a-f0-9]{64}"),
    _rule("anthropic-api-key", "Anthropic API Key", rf"sk-ant-[a-zA-Z0-9_-]{{20,{_T}}}"),
    _rule(
        "openai-api-key",
        "OpenAI API Key",
        # Three source alternatives behind one literal "sk-" prefix.  The middle
        # one's run is tempered (no "sk-", "T" only when not starting T3BlbkFJ)
        # and possessive: it ends exactly at the first marker, so no backtracking.
        r"sk-(?:"
        rf"(?:proj|svcacct|admin)-[a-zA-Z0-9_-]{{20,{_T}}}"
        rf"|(?:[a-rt-zA-SU-Z0-9-]|s(?!k-)|T(?!3BlbkFJ)){{20,{_T}}}+"
        rf"T3BlbkFJ[a-zA-Z0-9-]{{20,{_T}}}"
        r"|[a-zA-Z0-9]{48})",
    ),
    _rule(
        "huggingface-access-token",
        "HuggingFace Access Token",
        rf"hf_[a-zA-Z0-9]{{34,{_T}}}",
    ),
    _rule("github-pat", "GitHub PAT", r"ghp_[0-9a-zA-Z]{36}"),
    _rule("github-fine-grained-pat", "GitHub Fine Grained PAT", r"github_pat_\w{82}"),
    _rule("github-app-token", "GitHub App Token", r"(?:ghu|ghs)_[0-9a-zA-Z]{36}"),
    _rule("github-oauth", "GitHub OAuth", r"gho_[0-9a-zA-Z]{36}"),
    _rule("gitlab-pat", "GitLab PAT", r"glpat-[\w-]{20}"),
    _rule(
        "slack-bot-token",
        "Slack Bot Token",
        rf"xoxb-[0-9]{{10,13}}-[0-9]{{10,13}}[a-zA-Z0-9-]{{0,{_T}}}",
    ),
    _rule(
        "slack-app-token",
        "Slack App Token",
        # Each run is followed by "-", which it cannot contain: possessive is exact.
        rf"xapp-[0-9]-[A-Z0-9]{{1,{_T}}}+-[0-9]{{1,{_T}}}+-[a-z0-9]{{1,{_T}}}",
        _AI,
    ),
    _rule("npm-access-token", "NPM Access Token", r"npm_[a-zA-Z0-9]{36}"),
    _rule(
        "stripe-access-token",
        "Stripe Access Token",
        r"(?:sk|rk)_(?:test|live|prod)_[a-zA-Z0-9]{10,99}",
    ),
    _rule(
        "private-key",
        "Private Key",
        # Body: any character, but never "--" (a "-" must not be followed by
        # another "-"), so the possessive run ends exactly at the next marker.
        rf"-----BEGIN{_PEM_LABEL}"
        rf"(?:[^-]|-(?!-)){{64,{_PEM_BODY_MAX}}}+"
        rf"-----END{_PEM_LABEL}",
        _AI,
    ),
)


def scan(text: str) -> list[SecretHit]:
    """Return one :class:`SecretHit` per rule that fires on ``text``, in RULES order.

    Never returns, logs or stores the matched text.
    """
    return [SecretHit(rule.id, rule.label) for rule in RULES if rule.pattern.search(text)]


def block_message(hits: list[SecretHit]) -> str:
    """The refusal shown to the model/user; names rule labels only."""
    labels = ", ".join(hit.label for hit in hits)
    return (
        f"Content contains potential secrets ({labels}) and cannot be written to team memory. "
        "Team memory is shared with everyone who can read the repository; "
        "remove the sensitive content and try again."
    )


def check_write(path: Path, content: str, *, is_team_path: Callable[[Path], bool]) -> GuardResult:
    """Guard one memory write.

    Only paths that ``is_team_path`` classifies as team memory are scanned (the
    predicate is responsible for symlink decoys and for classifying paths even
    when the team tier is disabled).  If the predicate cannot classify the path
    (``OSError``/``ValueError``), the write is treated as a team write: the
    guard fails closed.  Other paths are allowed without scanning.
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
