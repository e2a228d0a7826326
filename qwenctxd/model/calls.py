"""The HTTP side of one side query: the prepared :class:`Request`, the plain and the streamed
chat-completions call, and the mapping of SDK failures to
:class:`~qwenctxd.protocol.errors.ModelUnavailable` reasons. :class:`~qwenctxd.model.client.
ModelClient` owns the policy (deadlines, the scheduler, quirks); this module only talks."""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio

from qwenctxd.model.results import (
    Completion,
    ToolCallAccumulator,
    dump_model,
    unavailable,
    usage_dict,
)
from qwenctxd.protocol.errors import ModelUnavailable

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["DeltaCallback", "Request", "complete_once", "map_error", "one_shot", "sdk_kwargs", "stream_once"]

DeltaCallback = Callable[[str], Awaitable[None] | None]


@dataclass(slots=True)
class Request:
    """One prepared call: payload, deadline, feature and how it is sent."""
    model: str
    timeout: float
    kwargs: dict[str, Any]
    feature: str = "other"
    #: a background side query sent streamed, so that closing it stops the server generating
    #: (llama.cpp-family servers finish a non-streamed request the client has given up on)
    stream: bool = False
    #: monotonic time by which the call must end (set when the request is prepared, so the
    #: lazy ``openai`` import and connection set-up count against the deadline too)
    deadline: float = 0.0

    def __post_init__(self) -> None:
        if not self.deadline:
            self.deadline = time.monotonic() + self.timeout



def map_error(oa: ModuleType | None, exc: Exception, timeout: float) -> ModelUnavailable | None:
    """``exc`` from the SDK (or the body it read) as ModelUnavailable; None: not ours."""
    if oa is None:
        return None
    if isinstance(exc, oa.APITimeoutError):
        return unavailable("timeout", detail=f"{timeout:g}s")
    if isinstance(exc, oa.APIConnectionError):
        return unavailable("connection")
    if isinstance(exc, oa.APIResponseValidationError):
        return unavailable("invalid_json")
    if isinstance(exc, oa.APIStatusError):
        return unavailable(f"http_{exc.status_code}", status=exc.status_code)
    if isinstance(exc, oa.OpenAIError):
        return unavailable("api_error")
    # openai 3.x lets the body's JSONDecodeError through for a 200 with a broken JSON body
    # (and for a broken SSE data line).
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return unavailable("invalid_json")
    return None

#: keyword arguments of ``chat.completions.create`` the SDK would walk recursively to
#: "transform" them (TypedDict-driven; nothing in them needs it: they are plain JSON already)
_PASSED_THROUGH = ("messages", "tools")


def sdk_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for ``chat.completions.create`` with the history and the tool schemas sent
    through ``extra_body`` (merged into the JSON body as given). The SDK's parameter
    transform walks every message and schema on the event loop: for an extraction over a
    long conversation that was a fifth of the daemon's busy time under the proxy bench, every
    turn of every session waiting behind it (issue 28). The request on the wire is the same."""
    out = dict(kwargs)
    extra = dict(out.get("extra_body") or {})
    for key in _PASSED_THROUGH:
        if key in out:
            extra[key] = out.pop(key)
    out["messages"] = []  # a required argument; the body's messages come from extra_body
    out["extra_body"] = extra
    return out


async def one_shot(oa: ModuleType, client: AsyncOpenAI, req: Request) -> Completion:
    """One whole answer: streamed and accumulated when ``req.stream``, else plain."""
    if req.stream:
        return await stream_once(oa, client, req, None)
    return await complete_once(client, req)

async def complete_once(client: AsyncOpenAI, req: Request) -> Completion:
    """One non-streamed completion."""
    resp: Any = await client.chat.completions.create(**sdk_kwargs(req.kwargs),
                                                     timeout=req.timeout)
    if isinstance(resp, str):  # a non-JSON content type: the SDK hands back the raw text
        raise unavailable("invalid_json")
    choices = getattr(resp, "choices", None)
    if not choices:
        raise unavailable("empty")
    choice = choices[0]
    message = getattr(choice, "message", None)
    text = getattr(message, "content", None) or ""
    calls = [dump_model(tc) for tc in (getattr(message, "tool_calls", None) or [])]
    if not text and not calls:
        raise unavailable("empty")
    return Completion(
        text=text,
        tool_calls=calls,
        finish_reason=getattr(choice, "finish_reason", None),
        usage=usage_dict(getattr(resp, "usage", None)),
        model=getattr(resp, "model", None) or req.model,
    )

async def stream_once(
    oa: ModuleType, client: AsyncOpenAI, req: Request, on_delta: DeltaCallback | None
) -> Completion:
    """One streamed completion, accumulated; ``on_delta`` sees each text delta."""
    stream: Any = await client.chat.completions.create(
        **sdk_kwargs(req.kwargs),
        stream=True,
        stream_options={"include_usage": True},
        timeout=req.timeout,
    )
    parts: list[str] = []
    tools = ToolCallAccumulator()
    finish: str | None = None
    usage: dict[str, int] | None = None
    model = req.model
    try:
        async for chunk in stream:
            model = getattr(chunk, "model", None) or model
            usage = usage_dict(getattr(chunk, "usage", None)) or usage
            for choice in getattr(chunk, "choices", None) or []:
                delta = getattr(choice, "delta", None)
                if delta is not None and delta.content:
                    parts.append(delta.content)
                    if on_delta is not None:
                        result = on_delta(delta.content)
                        if inspect.isawaitable(result):
                            await result
                for tc in (delta.tool_calls if delta is not None else None) or []:
                    tools.feed(tc)
                finish = getattr(choice, "finish_reason", None) or finish
    except oa.APITimeoutError:
        raise
    except oa.APIConnectionError:
        raise unavailable("stream_cut") from None
    finally:
        with anyio.CancelScope(shield=True):
            await stream.close()
    if finish is None:
        raise unavailable("stream_cut")
    text, calls = "".join(parts), tools.result()
    if not text and not calls:
        raise unavailable("empty")
    return Completion(
        text=text, tool_calls=calls, finish_reason=finish, usage=usage, model=model
    )
