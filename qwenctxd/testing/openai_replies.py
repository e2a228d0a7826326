"""Scripted replies for the OpenAI stub and their wire shapes (pure functions, no I/O).

:class:`Reply` is one line of a ``ScriptedOpenAI`` script: the text and tool calls to answer
with, or a fault to inject. :func:`completion_body` renders a ``chat.completion`` object and
:func:`stream_events` the ``chat.completion.chunk`` sequence of a streamed answer (role
delta, content deltas, tool-call deltas, the finish chunk, and a usage chunk when the request
set ``stream_options.include_usage``), in the shapes OpenAI and llama.cpp/vLLM servers use.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "SLOW_DEFAULT_S",
    "Fault",
    "Reply",
    "completion_body",
    "error_body",
    "stream_events",
    "uses_json_schema",
]

Fault = Literal[
    "http_500", "http_400", "slow", "cut_stream", "interrupted", "invalid_json", "drop",
    "reject_json_schema",
]
FAULTS: frozenset[str] = frozenset(get_args(Fault))
SLOW_DEFAULT_S = 30.0
"""How long a ``fault="slow"`` reply waits when it sets no ``delay_s`` of its own."""

NextId = Callable[[], int]


@dataclass(slots=True)
class Reply:
    """One scripted answer to a chat-completions request.

    ``finish_reason`` defaults to ``"tool_calls"`` when ``tool_calls`` is given, else ``"stop"``.
    Tool calls use the OpenAI shape; a missing ``id``/``type`` is filled in and dict
    ``arguments`` are JSON-encoded. ``delay_s`` is waited before the first byte; ``fault="slow"``
    waits ``delay_s`` (or ``SLOW_DEFAULT_S``) and then answers normally. Streamed content and
    arguments are split into ``chunk_chars``-sized deltas, ``chunk_delay_s`` apart.

    Faults: ``http_500``/``http_400`` answer that status with an OpenAI error body; ``slow``
    delays; ``cut_stream`` sends part of the reply then closes the socket (streamed: some SSE
    chunks, no ``[DONE]``; not streamed: half the declared body); ``interrupted`` (streamed)
    sends part of the reply then ``[DONE]`` with no finish reason, as llama-cpp-python's server
    ends a stream it interrupts for another request; ``invalid_json`` sends a 200
    whose body (or SSE data) is not JSON; ``drop`` closes the connection without a response;
    ``reject_json_schema`` answers HTTP 500 to ``response_format.type == "json_schema"``
    requests and normally to others.
    """

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    delay_s: float = 0.0
    fault: Fault | None = None
    chunk_chars: int = 8
    chunk_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {sorted(FAULTS)}")
        if self.chunk_chars < 1:
            raise ValueError("chunk_chars must be >= 1")
        if self.delay_s < 0 or self.chunk_delay_s < 0:
            raise ValueError("delays must be >= 0")

    @property
    def effective_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    @property
    def effective_delay_s(self) -> float:
        if self.fault == "slow" and self.delay_s == 0:
            return SLOW_DEFAULT_S
        return self.delay_s


def uses_json_schema(body: dict[str, Any]) -> bool:
    """Whether the request asks for ``response_format.type == "json_schema"``."""
    rf = body.get("response_format")
    return isinstance(rf, dict) and rf.get("type") == "json_schema"


def error_body(message: str, err_type: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def _model(body: dict[str, Any], fallback: str) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else fallback


def tool_calls_of(reply: Reply, next_id: NextId) -> list[dict[str, Any]]:
    """The reply's tool calls in full OpenAI shape (ids, type and string arguments filled)."""
    calls: list[dict[str, Any]] = []
    for call in reply.tool_calls or []:
        fn = dict(call.get("function") or {})
        args = fn.get("arguments", "")
        fn["arguments"] = args if isinstance(args, str) else json.dumps(args)
        fn.setdefault("name", "")
        calls.append(
            {
                "id": call.get("id") or f"call_{next_id():06d}",
                "type": call.get("type", "function"),
                "function": fn,
            }
        )
    return calls


def usage_of(body: dict[str, Any], reply: Reply, calls: list[dict[str, Any]]) -> dict[str, int]:
    """``reply.usage`` completed with totals, or a rough chars/4 estimate."""
    if reply.usage is not None:
        usage = dict(reply.usage)
    else:
        prompt = max(1, len(json.dumps(body.get("messages", []))) // 4)
        out = len(reply.content or "") + (len(json.dumps(calls)) if calls else 0)
        usage = {"prompt_tokens": prompt, "completion_tokens": max(1, out // 4)}
    usage.setdefault("prompt_tokens", 0)
    usage.setdefault("completion_tokens", 0)
    usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
    return usage


def completion_body(
    body: dict[str, Any], reply: Reply, next_id: NextId, default_model: str
) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` answer."""
    calls = tool_calls_of(reply, next_id)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": reply.effective_finish_reason,
    }
    return {
        "id": f"chatcmpl-{next_id()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": _model(body, default_model),
        "choices": [choice],
        "usage": usage_of(body, reply, calls),
    }


def stream_events(
    body: dict[str, Any], reply: Reply, next_id: NextId, default_model: str
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer (without ``[DONE]``)."""
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    base = {
        "id": f"chatcmpl-{next_id()}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": _model(body, default_model),
    }
    extra: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice], **extra}

    yield chunk({"role": "assistant", "content": ""})
    text, step = reply.content or "", reply.chunk_chars
    for i in range(0, len(text), step):
        yield chunk({"content": text[i : i + step]})
    calls = tool_calls_of(reply, next_id)
    for idx, call in enumerate(calls):
        fn = call["function"]
        head = {
            "index": idx,
            "id": call["id"],
            "type": call["type"],
            "function": {"name": fn["name"], "arguments": ""},
        }
        yield chunk({"tool_calls": [head]})
        args = fn["arguments"]
        for i in range(0, len(args), step):
            piece = {"index": idx, "function": {"arguments": args[i : i + step]}}
            yield chunk({"tool_calls": [piece]})
    yield chunk({}, reply.effective_finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": usage_of(body, reply, calls)}
