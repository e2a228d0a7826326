"""``session.context``: where one session's context window goes, part by part.

A pure function over a :class:`~qwenctxd.sessions.state.Session`, the
:class:`~qwenctxd.instructions.service.SystemPrompt` the next turn would use and the session's
tool declarations. The parts, in order:

``system_base``
    the base sections of the system prompt (identity … final reminder, or a custom system.md);
``instructions``
    the QWEN.md / AGENTS.md files and rules (the ``instructions`` section);
``memory``
    the auto-memory section of the system prompt;
``system_other``
    the append text and the git status section;
``tools``
    the tool declarations (the client's and the daemon's `skill` tool);
``skills``
    skill-listing reminders (snapshot and deltas) delivered inside history messages;
``reminders``
    every other ``<system-reminder>`` text part in the history (rules, recalled memories);
``history_user`` / ``history_assistant`` / ``history_tool_results``
    the rest of the history's tokens by role (``tool`` messages are tool results; any other
    role counts as user).

The parts add up exactly to the figure the next assembled prompt reports as
``usage.prompt_tokens`` for the same state (:meth:`Session.estimate`):

* the system sections are split on cumulative estimates of the prompt text (the estimate of
  ``text[:end of section]`` minus that of the section before), so they sum to the estimate of
  the whole text, as ``system_tokens`` counts it;
* history parts come from the per-message estimates (``History.tokens``), reminder parts
  carved out of their messages with the same estimator;
* when the count is API-anchored, the messages the API figure covers are scaled
  proportionally so that they sum to the anchored figure less the system and tools estimate
  at anchor time; messages after the anchor stay estimated. Rounding uses largest remainders,
  so integer parts still sum exactly. (Should that anchored share come out negative — an API
  count smaller than our estimate of the system prompt — every part is scaled to the total.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from qwenctxd.compaction.thresholds import Thresholds, compute_thresholds, level
from qwenctxd.protocol import session as wire
from qwenctxd.sessions.state import Session
from qwenctxd.skills import listing
from qwenctxd.tokens import content_tokens, estimate_tokens

PARTS = (
    "system_base",
    "instructions",
    "memory",
    "system_other",
    "tools",
    "skills",
    "reminders",
    "history_user",
    "history_assistant",
    "history_tool_results",
)
SYSTEM_PARTS = PARTS[:4]
HISTORY_PARTS = PARTS[5:]
_SECTION_PART = {"instructions": "instructions", "memory": "memory",
                 "append": "system_other", "git_status": "system_other"}
_REMINDER_OPEN = "<system-reminder>"
_SKILL_MARKERS = ("<available_skills>", listing._EMPTY, listing._REMOVED_INTRO)  # noqa: SLF001


class SystemPromptLike(Protocol):
    text: str
    sections: list[tuple[str, int, int]]  # name, chars, est_tokens


@dataclass(frozen=True)
class ContextPart:
    name: str
    tokens: int
    pct: float  # of the window, 0–100


@dataclass(frozen=True)
class ContextReport:
    session_id: str
    window_tokens: int
    prompt_tokens: int
    anchored: bool
    thresholds: Thresholds
    level: str
    parts: list[ContextPart]
    free_tokens: int
    free_pct: float
    window_source: str = "default"


def pct_of(tokens: int, window: int) -> float:
    """``tokens`` as a percentage (0–100, two decimals) of ``window``; 0.0 for no window."""
    return round(tokens * 100.0 / window, 2) if window > 0 else 0.0


def section_part(name: str) -> str:
    """The part a system-prompt section belongs to (unknown names count as base)."""
    return _SECTION_PART.get(name, "system_base")


def is_skill_reminder(text: str) -> bool:
    return any(m in text for m in _SKILL_MARKERS)


def system_parts(text: str, sections: Iterable[tuple[str, int, int]]) -> dict[str, int]:
    """Tokens per system part; sums exactly to ``estimate_tokens(text)``."""
    out = dict.fromkeys(SYSTEM_PARTS, 0)
    end = 0
    before = 0
    for name, chars, _est in sections:
        end += chars
        upto = estimate_tokens(text[:end])
        out[section_part(name)] += upto - before
        before = upto
    # text not covered by a section (none today) counts as base
    out["system_base"] += estimate_tokens(text) - before
    return out


def tools_tokens(tools: Sequence[dict[str, Any]]) -> int:
    """Tokens of the tool declarations, counted as ``system_tokens`` counts them."""
    return estimate_tokens(msgspec.json.encode(tools).decode()) if tools else 0


def message_parts(msg: dict[str, Any], total: int, *, image_tokens: int) -> dict[str, int]:
    """Split one message's estimate ``total`` into history parts (sums to ``total``)."""
    out = dict.fromkeys(HISTORY_PARTS, 0)
    role = msg.get("role")
    rest = total
    content = msg.get("content")
    if role == "user" and isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                continue
            text = part.get("text")
            if not isinstance(text, str) or not text.lstrip().startswith(_REMINDER_OPEN):
                continue
            tok = min(rest, content_tokens([part], image_tokens=image_tokens))
            out["skills" if is_skill_reminder(text) else "reminders"] += tok
            rest -= tok
    key = {"assistant": "history_assistant", "tool": "history_tool_results"}.get(
        role if isinstance(role, str) else "", "history_user")
    out[key] += rest
    return out


def scale_to(values: dict[str, int], target: int) -> dict[str, int]:
    """``values`` scaled proportionally to sum to ``target`` (largest remainders; ≥ 0)."""
    target = max(0, target)
    total = sum(values.values())
    if total == target:
        return dict(values)
    if total <= 0:
        out = dict.fromkeys(values, 0)
        if values and target:
            out[next(iter(values))] = target
        return out
    exact = {k: v * target / total for k, v in values.items()}
    out = {k: math.floor(x) for k, x in exact.items()}
    short = target - sum(out.values())
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:short]:
        out[k] += 1
    return out


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] += v


def context_report(s: Session, system: SystemPromptLike, tools: Sequence[dict[str, Any]]
                   ) -> ContextReport:
    """The window picture of ``s`` as the next assembly would count it."""
    sys_parts = system_parts(system.text, system.sections)
    tool_tok = tools_tokens(tools)
    sys_tok = sum(sys_parts.values()) + tool_tok
    total, anchored = s.estimate(sys_tok)

    split = 0
    a = s.usage.anchor
    if anchored and a is not None:
        split = a.index
    head = dict.fromkeys(HISTORY_PARTS, 0)  # messages the API figure covers
    tail = dict.fromkeys(HISTORY_PARTS, 0)  # estimated messages after it
    for i, (msg, tok) in enumerate(zip(s.history.messages, s.history.tokens, strict=True)):
        _add(head if i < split else tail,
             message_parts(msg, tok, image_tokens=s.history.image_tokens))

    parts: dict[str, int] = {**sys_parts, "tools": tool_tok}
    if anchored and a is not None:
        covered = a.total - a.system_tokens
        if covered >= 0:
            head = scale_to(head, covered)
        else:
            head = dict.fromkeys(HISTORY_PARTS, 0)
    history = dict.fromkeys(HISTORY_PARTS, 0)
    _add(history, head)
    _add(history, tail)
    parts.update(history)
    if sum(parts.values()) != total:  # only the negative-anchored-share case lands here
        parts = scale_to(parts, total)

    window = s.options.window_tokens
    th = compute_thresholds(window, s.options.auto_compact_threshold)
    free = max(0, window - total)
    return ContextReport(
        session_id=s.id, window_tokens=window, prompt_tokens=total, anchored=anchored,
        thresholds=th, level=level(total, th),
        parts=[ContextPart(name=n, tokens=parts[n], pct=pct_of(parts[n], window)) for n in PARTS],
        free_tokens=free, free_pct=pct_of(free, window), window_source=s.options.window_source,
    )


class SessionsForContext(Protocol):
    """What :func:`session_context` needs of the session manager."""

    def get(self, session_id: str) -> Session: ...

    async def system_prompt(self, s: Session) -> SystemPromptLike: ...


async def session_context(sessions: SessionsForContext, session_id: str) -> wire.ContextResult:
    """The ``session.context`` answer: the report of session ``session_id`` (under its lock,
    with the system prompt its next turn would use), as the wire result."""
    s = sessions.get(session_id)
    async with s.lock:
        sp = await sessions.system_prompt(s)
        r = context_report(s, sp, s.options.tools)
    return wire.ContextResult(
        session_id=r.session_id, window_tokens=r.window_tokens,
        prompt_tokens=r.prompt_tokens, anchored=r.anchored,
        thresholds=wire.Thresholds(warn=r.thresholds.warn, auto=r.thresholds.auto,
                                   hard=r.thresholds.hard),
        level=r.level,  # type: ignore[arg-type]
        parts=[wire.ContextPart(name=x.name, tokens=x.tokens, pct=x.pct) for x in r.parts],
        free_tokens=r.free_tokens, free_pct=r.free_pct, window_source=r.window_source)
