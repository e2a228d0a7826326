"""Results and errors of model calls: the ``Completion`` struct, reply parsing, error factory.

Pure helpers for :mod:`qwenctxd.model.client`: build ``ModelUnavailable`` errors with fixed,
secret-free messages and a ``data["reason"]``; decode JSON-object replies (tolerating a leading
``<think>`` block and Markdown fences); put a JSON Schema into the system prompt for endpoints
without ``json_schema`` support; join streamed tool-call deltas; redact URLs for logs.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec

from qwenctxd.protocol.errors import ModelUnavailable

__all__ = [
    "Completion",
    "Message",
    "ToolCallAccumulator",
    "dump_model",
    "parse_json_reply",
    "reason_of",
    "safe_url",
    "unavailable",
    "url_problem",
    "usage_dict",
    "with_schema_instruction",
    "without_response_format",
]

Message = Mapping[str, Any]

_MESSAGES: dict[str, str] = {
    "not_configured": "Model endpoint is not configured (base_url and model are required)",
    "timeout": "Model endpoint did not answer in time",
    "connection": "Could not reach the model endpoint",
    "invalid_json": "Model endpoint returned a reply that is not valid JSON",
    "stream_cut": "Model endpoint closed the stream before it finished",
    "empty": "Model endpoint returned an empty reply",
    "prompt_too_long": "The prompt leaves no room for an answer in the model's context window",
    "api_error": "Model endpoint reported an error",
}
_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)
_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)


class Completion(msgspec.Struct, kw_only=True):
    """One model answer: text, tool calls (OpenAI shape), finish reason, token usage."""

    text: str
    tool_calls: list[dict[str, Any]] = msgspec.field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    model: str = ""


def unavailable(
    reason: str,
    *,
    status: int | None = None,
    detail: str | None = None,
    message: str | None = None,
) -> ModelUnavailable:
    """A ``ModelUnavailable`` with a fixed, secret-free message for ``reason``.

    ``detail`` is appended in parentheses; ``message`` replaces the fixed text (callers must
    keep it free of secrets and model output).
    """
    if message is None:
        if status is not None:
            message = f"Model endpoint answered HTTP {status}"
        else:
            message = _MESSAGES.get(reason, "Model unavailable")
    if detail:
        message = f"{message} ({detail})"
    data: dict[str, Any] = {"reason": reason}
    if status is not None:
        data["status"] = status
    return ModelUnavailable(message, data=data)


def reason_of(exc: ModelUnavailable) -> str:
    data = exc.data
    return str(data.get("reason", "unknown")) if isinstance(data, dict) else "unknown"


def parse_json_reply(text: str) -> dict[str, Any]:
    """Decode a JSON-object reply, tolerating a leading ``<think>`` block and ``` fences."""
    body = _THINK.sub("", text, count=1).strip()
    if not body.startswith("{"):
        fenced = _FENCE.search(body)
        if fenced:
            body = fenced.group(1).strip()
    try:
        value = msgspec.json.decode(body.encode())
    except msgspec.DecodeError:
        raise unavailable("invalid_json") from None
    if not isinstance(value, dict):
        raise unavailable("invalid_json", detail="expected a JSON object")
    return value


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a base URL (not http(s), no host, bad port), or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for an out-of-range or non-numeric port
    except ValueError:
        return "base_url is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "base_url must be an http:// or https:// URL"
    return None


def safe_url(url: str | None) -> str | None:
    """``scheme://host:port/path`` without userinfo, query or fragment (safe to log)."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def with_schema_instruction(
    messages: Sequence[Message], schema: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Copy of ``messages`` with the schema appended to the last system message (or a new one)."""
    note = (
        "Respond with a single JSON object only (no prose, no code fences) that conforms to "
        "this JSON Schema:\n" + json.dumps(schema, ensure_ascii=False)
    )
    out = [dict(m) for m in messages]
    for msg in reversed(out):
        if msg.get("role") == "system":
            content = msg.get("content")
            if isinstance(content, list):
                msg["content"] = [*content, {"type": "text", "text": note}]
            else:
                msg["content"] = f"{content}\n\n{note}" if content else note
            return out
    return [{"role": "system", "content": note}, *out]


def without_response_format(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of request ``kwargs`` without ``response_format``."""
    return {k: v for k, v in kwargs.items() if k != "response_format"}


def dump_model(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else {}


def usage_dict(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    out = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key) if isinstance(usage, dict) else getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out or None


class ToolCallAccumulator:
    """Joins streamed tool-call deltas (keyed by ``index``) into full OpenAI-shape calls."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, delta: Any) -> None:
        index = getattr(delta, "index", None)
        index = index if isinstance(index, int) else len(self._calls)
        call = self._calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if getattr(delta, "id", None):
            call["id"] = delta.id
        if getattr(delta, "type", None):
            call["type"] = delta.type
        fn = getattr(delta, "function", None)
        if fn is not None:
            if fn.name:
                call["function"]["name"] += fn.name
            if fn.arguments:
                call["function"]["arguments"] += fn.arguments

    def result(self) -> list[dict[str, Any]]:
        calls = [self._calls[i] for i in sorted(self._calls)]
        for call in calls:
            call["id"] = call["id"] or f"call_{uuid.uuid4().hex[:24]}"
        return calls
