"""The compression side query: slim the history, ask for a state snapshot, judge the answer.

:func:`summarize` sends the whole (slimmed) history to the model once, streamed, with thinking
off and an output cap of at most 20 000 tokens (less when the context window leaves less: the
request builder sizes it), and classifies the outcome with the status names of Qwen Code's
``CompressionStatus`` in snake case. The answer is judged *after* removing the ``<analysis>``
draft (:func:`summary_problem`): a reply without a ``<state_snapshot>``, shorter than
:data:`MIN_SUMMARY_CHARS` or shaped like a tool call is ``failed_empty_summary`` and the
history is kept.

The side query must be a valid chat conversation even when the history is not (a trailing tool
call still waiting for its result, a result whose call was lost, two user turns in a row), so
:func:`side_query_messages` pairs every tool call with a result and merges same-role neighbours
for the request only; the history itself is never modified.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
import structlog

from qwenctxd.compaction.prompts import SUMMARY_REQUEST, compression_system_prompt
from qwenctxd.model.results import reason_of
from qwenctxd.protocol.errors import ModelUnavailable
from qwenctxd.tokens import estimate_tokens

if TYPE_CHECKING:
    from qwenctxd.model.client import ModelClient

__all__ = [
    "COMPACT_MAX_OUTPUT_TOKENS",
    "MAX_FOCUS_CHARS",
    "MAX_HOOK_INSTRUCTIONS_CHARS",
    "SummaryOutcome",
    "SummaryStatus",
    "Trigger",
    "join_content",
    "media_label",
    "side_query_messages",
    "slim_for_compaction",
    "strip_analysis",
    "summarize",
    "summary_problem",
]

log = structlog.get_logger(__name__)

COMPACT_MAX_OUTPUT_TOKENS: Final = 20_000
MIN_SUMMARY_CHARS: Final = 32
SNAPSHOT_MARKER: Final = "<state_snapshot>"
MAX_HOOK_INSTRUCTIONS_CHARS: Final = 4_000
MAX_FOCUS_CHARS: Final = 2_000

Trigger = Literal["manual", "auto"]
SummaryStatus = Literal[
    "compressed", "failed_empty_summary", "failed_output_truncated", "failed_model_error"
]

_ANALYSIS_CLOSED = re.compile(r"<analysis>.*?</analysis>\s*", re.DOTALL | re.IGNORECASE)
_ANALYSIS_OPEN = re.compile(r"<analysis>.*\Z", re.DOTALL | re.IGNORECASE)
_KEEP_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")
_MEDIA_KINDS = {
    "image_url": "image",
    "video_url": "video",
    "input_audio": "audio",
    "file": "document",
}
_MIME_BAD = re.compile(r"[\r\n\t]")
_DATA_URL = re.compile(r"^data:([^;,]*)[;,]", re.IGNORECASE)
_TOOL_CALL_SHAPE = re.compile(
    r"""^\s*(?:<tool_call>|<\|?tool_call|<function|<functioncall>|\[?\s*\{\s*"(?:name|function|tool|"""
    r"""tool_calls|arguments|type)"\s*:)""",
    re.IGNORECASE,
)
_PENDING_RESULT = "[This tool call was still running when the conversation was compacted.]"
_MISSING_RESULT = "[No result was recorded for this tool call.]"


class SummaryOutcome(msgspec.Struct, kw_only=True):
    """The result of one compression side query.

    ``summary_text`` is the reply with every ``<analysis>`` block removed (what goes into the
    new history); ``raw_text`` is the reply as received; ``error`` carries the
    ``ModelUnavailable`` reason for ``failed_model_error``.
    """

    status: str
    summary_text: str = ""
    raw_text: str = ""
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "compressed"


def summary_problem(text: str, *, marker: str | None = SNAPSHOT_MARKER) -> str | None:
    """Why ``text`` (analysis already removed) cannot stand in for a history, or None.

    ``too_short`` under :data:`MIN_SUMMARY_CHARS`, ``tool_call_shaped`` when it opens like a
    tool call (a tiny model answering with a fake call), ``no_state_snapshot`` when ``marker``
    is set and missing.
    """
    body = text.strip()
    if len(body) < MIN_SUMMARY_CHARS:
        return "too_short"
    if _TOOL_CALL_SHAPE.match(body):
        return "tool_call_shaped"
    if marker is not None and marker not in body.lower():
        return "no_state_snapshot"
    return None


def strip_analysis(text: str) -> str:
    """``text`` without ``<analysis>`` drafts: every closed block, then an unclosed tail."""
    text = _ANALYSIS_CLOSED.sub("", text)
    text = _ANALYSIS_OPEN.sub("", text)
    return text.strip()


def _sanitize_mime(mime: str) -> str:
    mime = _MIME_BAD.sub(" ", mime).replace("[", "").replace("]", "").strip()
    return mime[:128] or "unknown"


def media_label(part: Mapping[str, Any]) -> str | None:
    """``[image: image/png]``-style placeholder for a media part, None for other parts."""
    kind = part.get("type")
    noun = _MEDIA_KINDS.get(kind) if isinstance(kind, str) else None
    if noun is None:
        return None
    mime = "unknown"
    if kind == "input_audio":
        payload = part.get("input_audio")
        fmt = payload.get("format") if isinstance(payload, Mapping) else None
        mime = f"audio/{fmt}" if isinstance(fmt, str) and fmt else mime
    else:
        payload = part.get(kind)
        url = (
            payload.get("url") or payload.get("file_data") if isinstance(payload, Mapping) else None
        )
        url = payload if isinstance(payload, str) else url
        match = _DATA_URL.match(url) if isinstance(url, str) else None
        if match and match.group(1):
            mime = match.group(1)
    return f"[{noun}: {_sanitize_mime(mime)}]"


def _slim_content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    for part in content:
        label = media_label(part) if isinstance(part, Mapping) else None
        out.append({"type": "text", "text": label} if label is not None else part)
    return out


def slim_for_compaction(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` fit for a summary request.

    Media parts become text placeholders (``[image: <mime>]``; the originals stay in the caller's
    history for restoration), reasoning fields and any non-OpenAI keys are dropped, tool calls
    are kept. The input is never mutated.
    """
    slim: list[dict[str, Any]] = []
    for msg in messages:
        out = {k: msg[k] for k in _KEEP_KEYS if k in msg}
        if "content" in out:
            out["content"] = _slim_content(out["content"])
        if "tool_calls" in out:
            out["tool_calls"] = [
                dict(c) if isinstance(c, Mapping) else c for c in out["tool_calls"] or []
            ]
            if not out["tool_calls"]:
                del out["tool_calls"]
        slim.append(out)
    return slim


def _as_parts(content: Any) -> list[Any]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": json.dumps(content, ensure_ascii=False, default=str)}]


def join_content(first: Any, second: Any, sep: str = "\n\n") -> Any:
    """Concatenate two message contents (strings stay strings, otherwise a part list)."""
    if first is None or first == "":
        return second
    if second is None or second == "":
        return first
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}{sep}{second}"
    return [*_as_parts(first), *_as_parts(second)]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = [p.get("text", "") for p in _as_parts(content) if isinstance(p, Mapping)]
    return "\n".join(t for t in texts if isinstance(t, str))


def _call_ids(msg: Mapping[str, Any]) -> list[str]:
    ids = []
    for call in msg.get("tool_calls") or []:
        cid = call.get("id") if isinstance(call, Mapping) else None
        if isinstance(cid, str) and cid:
            ids.append(cid)
    return ids


def side_query_messages(
    messages: Sequence[Mapping[str, Any]], instruction: str | None = None
) -> list[dict[str, Any]]:
    """A valid chat conversation carrying ``messages`` (copies), ending with ``instruction``.

    Tool calls without a result get a placeholder result (the trailing one says it is still
    running); results without a call, and stray system messages, become user text; same-role
    neighbours are merged; assistant messages left without content or calls are dropped. The
    instruction is appended as a user turn, merged into a trailing user message if there is one.
    """
    out: list[dict[str, Any]] = []
    pending: list[str] = []

    def close_pending(note: str) -> None:
        for cid in pending:
            out.append({"role": "tool", "tool_call_id": cid, "content": note})
        pending.clear()

    def push(msg: dict[str, Any]) -> None:
        prev = out[-1] if out else None
        role = msg["role"]
        if prev is not None and prev["role"] == role and role in ("user", "assistant"):
            if role == "user" or not prev.get("tool_calls"):
                prev["content"] = join_content(prev.get("content"), msg.get("content"))
                if msg.get("tool_calls"):
                    prev["tool_calls"] = msg["tool_calls"]
                return
        out.append(msg)

    for src in messages:
        msg = dict(src)
        role = msg.get("role")
        if role == "tool":
            cid = msg.get("tool_call_id")
            if isinstance(cid, str) and cid in pending:
                pending.remove(cid)
                out.append(msg)
                continue
            close_pending(_MISSING_RESULT)
            text = _text_of(msg.get("content"))
            push({"role": "user", "content": f"[Tool result without a matching call]\n{text}"})
            continue
        close_pending(_MISSING_RESULT)
        if role == "assistant":
            ids = _call_ids(msg)
            if not ids:
                msg.pop("tool_calls", None)
                if msg.get("content") in (None, "", []):
                    continue
            push(msg)
            if ids:
                pending.extend(dict.fromkeys(ids))
        elif role == "user":
            msg["content"] = msg.get("content") if msg.get("content") not in (None, []) else ""
            push(msg)
        else:  # system or unknown roles: keep the text as user context
            push({"role": "user", "content": _text_of(msg.get("content"))})
    close_pending(_PENDING_RESULT)
    if instruction:
        push({"role": "user", "content": instruction})
    return out


def _clean_extra(text: str | None, cap: int) -> str:
    if not text:
        return ""
    text = "".join(ch for ch in text if ch in "\n\t" or ch.isprintable())
    return text.strip()[:cap]


def _system_text(focus: str | None, hook_instructions: str | None) -> str:
    extra = [
        t
        for t in (
            _clean_extra(focus, MAX_FOCUS_CHARS),
            _clean_extra(hook_instructions, MAX_HOOK_INSTRUCTIONS_CHARS),
        )
        if t
    ]
    system = compression_system_prompt()
    if extra:
        system += "\n\nAdditional instructions:\n" + "\n\n".join(extra)
    return system


async def summarize(
    model_client: ModelClient,
    history: Sequence[Mapping[str, Any]],
    *,
    trigger: Trigger,
    focus: str | None = None,
    hook_instructions: str | None = None,
    fast: bool = True,
    timeout_s: float | None = None,
) -> SummaryOutcome:
    """Run the compression side query over ``history``; never raises for model failures.

    One streamed attempt, thinking off, ``max_tokens`` at most 20 000 (sized to the window);
    ``timeout_s`` None → the ``compress`` feature deadline. ``focus`` (user text, capped at
    2 000 chars) and ``hook_instructions`` (PreCompact output, capped at 4 000) are appended to
    the system prompt under "Additional instructions". Statuses: ``compressed``,
    ``failed_empty_summary`` (nothing usable after removing ``<analysis>``: see
    :func:`summary_problem`; ``error`` names the problem),
    ``failed_output_truncated`` (``finish_reason == "length"`` or output at the cap) and
    ``failed_model_error`` (any ``ModelUnavailable``; ``error`` holds its reason).
    """
    messages = [
        {"role": "system", "content": _system_text(focus, hook_instructions)},
        *side_query_messages(slim_for_compaction(history), SUMMARY_REQUEST),
    ]
    try:
        done = await model_client.stream(
            messages,
            fast=fast,
            max_tokens=COMPACT_MAX_OUTPUT_TOKENS,
            timeout_s=timeout_s,
            feature="compress",
        )
    except ModelUnavailable as exc:
        reason = reason_of(exc)
        status = "failed_empty_summary" if reason == "empty" else "failed_model_error"
        log.info("compaction_summary_failed", trigger=trigger, status=status, reason=reason)
        return SummaryOutcome(status=status, error=reason)
    raw = done.text or ""
    usage = done.usage or {}
    completion = usage.get("completion_tokens")
    output_tokens = completion if isinstance(completion, int) else estimate_tokens(raw)
    summary = strip_analysis(raw)
    problem: str | None = None
    if done.finish_reason == "length" or output_tokens >= COMPACT_MAX_OUTPUT_TOKENS:
        status, problem = "failed_output_truncated", "finish_reason_length"
    elif (problem := summary_problem(summary)) is not None:
        status = "failed_empty_summary"
    else:
        status = "compressed"
    log.info(
        "compaction_summary",
        trigger=trigger,
        status=status,
        problem=problem,
        output_tokens=output_tokens,
        finish_reason=done.finish_reason,
    )
    return SummaryOutcome(
        status=status, summary_text=summary, raw_text=raw, output_tokens=output_tokens,
        error=problem,
    )  # fmt: skip
