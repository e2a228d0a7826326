"""Best-effort session recap ("where were we") and the Markdown project summary.

:func:`recap` shows the model only the recent *dialog*: user text and assistant prose from the
last 30 such messages, with tool calls, tool results, media and reasoning removed (a file dump
would drown the recap model; hidden reasoning would leak into a user-visible note), sliced to
start at a user message; ``<system-reminder>`` blocks embedded in user text are dropped too, and
the prompt asks for the conversation's own language. It never raises: any problem yields ``status="unavailable"`` with a
reason. :func:`project_summary` asks for the ``# Project Summary`` Markdown document and raises
``ModelUnavailable`` on failure so the caller can map it to its protocol error; its output is
judged before anyone writes it (:func:`project_summary_problem`: reason ``unusable_output``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
import structlog

from qwenctxd.compaction.prompts import project_summary_prompt, recap_prompt
from qwenctxd.compaction.summary import side_query_messages, slim_for_compaction, summary_problem
from qwenctxd.model.results import reason_of, unavailable
from qwenctxd.protocol.errors import ModelUnavailable

if TYPE_CHECKING:
    from qwenctxd.model.client import ModelClient

__all__ = [
    "RECAP_MAX_TOKENS",
    "RECAP_WINDOW",
    "RecapResult",
    "dialog_messages",
    "parse_recap",
    "project_summary",
    "project_summary_problem",
    "recap",
]

log = structlog.get_logger(__name__)

RECAP_WINDOW: Final = 30
RECAP_MAX_TOKENS: Final = 300
RECAP_TEMPERATURE: Final = 0.3
PROJECT_SUMMARY_MAX_TOKENS: Final = 8_000

_RECAP_REQUEST = "Write the recap of the conversation above now, inside <recap> tags."
_SUMMARY_REQUEST = "Write the project summary for the conversation above now."
_RECAP_TAG = re.compile(r"<recap>(.*?)(?:</recap>|\Z)", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_SYSTEM_REMINDER = re.compile(r"<system-reminder>.*?(?:</system-reminder>|\Z)", re.DOTALL)
_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f]+(?=\s|$)|[\u3002\uff01\uff1f]")
_MAX_SENTENCES: Final = 3


class RecapResult(msgspec.Struct, kw_only=True):
    """``text`` is the recap when ``status == "ok"``; ``reason`` explains the other statuses."""

    text: str | None = None
    status: Literal["ok", "unavailable", "empty"] = "ok"
    reason: str | None = None


def _without_reminders(text: str) -> str:
    """``text`` without its ``<system-reminder>`` blocks (injected context, not the dialog)."""
    return _SYSTEM_REMINDER.sub("", text) if "<system-reminder>" in text else text


def _dialog_text(content: Any) -> str:
    if isinstance(content, str):
        return _without_reminders(content).strip()
    if isinstance(content, list):
        texts = [
            _without_reminders(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        return "\n".join(t.strip() for t in texts if t.strip()).strip()
    return ""


def dialog_messages(
    history: Sequence[Mapping[str, Any]], window: int = RECAP_WINDOW
) -> list[dict[str, str]]:
    """The last ``window`` dialog messages as ``{"role", "content"}``, starting at a user turn.

    Tool results and system messages are left out, assistant messages keep only their prose
    (a tool-call-only message disappears), media and reasoning are dropped, and neighbours of
    the same role (left adjacent by the removals) are merged. ``<system-reminder>`` blocks
    inside user text (rules, skills, memories, the environment) are not dialog and go too.
    """
    dialog: list[dict[str, str]] = []
    for msg in history:
        role = msg.get("role")
        if role not in ("user", "assistant"):
            continue
        text = _dialog_text(msg.get("content"))
        if text:
            dialog.append({"role": str(role), "content": text})
    recent = dialog[-window:] if window > 0 else []
    while recent and recent[0]["role"] != "user":
        recent.pop(0)
    merged: list[dict[str, str]] = []
    for msg in recent:
        if merged and merged[-1]["role"] == msg["role"]:
            merged[-1]["content"] += "\n\n" + msg["content"]
        else:
            merged.append(dict(msg))
    return merged


def _sentences(text: str) -> int:
    ends = len(_SENTENCE_END.findall(text))
    tail = _SENTENCE_END.split(text)[-1].strip()
    return ends + (1 if tail else 0)


def parse_recap(text: str) -> str | None:
    """The recap inside ``<recap>`` (whitespace collapsed), or untagged text of ≤ 3 sentences."""
    text = _THINK.sub("", text or "")
    match = _RECAP_TAG.search(text)
    closed = match is not None and re.search(r"</recap>", match.group(0), re.IGNORECASE)
    body = match.group(1) if match else text
    body = " ".join(body.split())
    if not body:
        return None
    if not closed and _sentences(body) > _MAX_SENTENCES:
        return None
    return body


async def recap(
    model_client: ModelClient | None,
    history: Sequence[Mapping[str, Any]],
    *,
    fast: bool = True,
    timeout_s: float | None = None,
) -> RecapResult:
    """A 1–3 sentence "where were we" note for ``history``; never raises.

    ``empty`` when there is no dialog to recap or the reply holds no usable recap;
    ``unavailable`` (with the ``ModelUnavailable`` reason) when no model is configured or the
    call failed.
    """
    if model_client is None or not model_client.configured:
        return RecapResult(status="unavailable", reason="not_configured")
    dialog = dialog_messages(history)
    if not dialog:
        return RecapResult(status="empty", reason="no_dialog")
    messages = [
        {"role": "system", "content": recap_prompt()},
        *side_query_messages(dialog, _RECAP_REQUEST),
    ]
    try:
        done = await model_client.complete(
            messages,
            fast=fast,
            max_tokens=RECAP_MAX_TOKENS,
            temperature=RECAP_TEMPERATURE,
            timeout_s=timeout_s,
            feature="recap",
        )
    except ModelUnavailable as exc:
        return RecapResult(status="unavailable", reason=reason_of(exc))
    except Exception as exc:  # best effort: a recap must never break the caller
        log.warning("recap_failed", error_type=type(exc).__name__)
        return RecapResult(status="unavailable", reason="error")
    text = parse_recap(done.text)
    if text is None:
        return RecapResult(status="empty", reason="no_recap_in_reply")
    return RecapResult(text=text, status="ok")


def _clean_summary(text: str) -> str:
    """Drop a leading ``<think>`` block, preamble before the title and a wrapping fence."""
    text = _THINK.sub("", text).strip()
    start = text.find("# Project Summary")
    if start > 0:
        text = text[start:]
    lines = text.splitlines()
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    fences = sum(1 for line in lines if line.strip().startswith("```"))
    if lines and fences % 2 == 1 and lines[-1].strip() == "```":
        lines = lines[:-1]
    return "\n".join(lines).strip()


async def project_summary(
    model_client: ModelClient,
    history: Sequence[Mapping[str, Any]],
    *,
    timeout_s: float | None = None,
) -> str:
    """The ``# Project Summary`` Markdown for ``history`` (main model, streamed, thinking off).

    Raises ``ModelUnavailable`` when the model is not configured, fails, or answers nothing.
    """
    messages = [
        {"role": "system", "content": project_summary_prompt()},
        *side_query_messages(slim_for_compaction(history), _SUMMARY_REQUEST),
    ]
    done = await model_client.stream(
        messages,
        max_tokens=PROJECT_SUMMARY_MAX_TOKENS,
        timeout_s=timeout_s,
        feature="project_summary",
    )
    text = _clean_summary(done.text or "")
    problem = project_summary_problem(text)
    if problem is not None:
        log.info("project_summary_rejected", problem=problem, chars=len(text))
        raise unavailable("empty" if not text else "unusable_output", detail=problem)
    return text


def project_summary_problem(text: str) -> str | None:
    """Why ``text`` is not a project summary worth writing (None when it is).

    The same test as a compression summary (:func:`~qwenctxd.compaction.summary.summary_problem`):
    too short or shaped like a tool call; and it must carry a Markdown heading.
    """
    problem = summary_problem(text, marker=None)
    if problem is not None:
        return problem
    if not re.search(r"^#{1,3} \S", text, re.MULTILINE):
        return "no_heading"
    return None
