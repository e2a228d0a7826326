"""The request builder: the one place a chat-completions payload is shaped for a real server.

Every model-backed feature (compression summary, project summary, recap, the extraction, dream,
skill-review and speculation agent turns, the recall selector, forget) sends its request through
:class:`~qwenctxd.model.client.ModelClient`, which calls :func:`build_payload`. The rules come
from what real servers reject (reference/real-endpoints.md):

* no ``content: null`` — an assistant message that only carries tool calls gets ``""``
  (llama.cpp answers HTTP 500 to null, its chat template crashes when the key is missing);
* content part lists made only of text become one plain string (llama.cpp's template turns a
  list into a Python repr);
* ``tool_choice: "auto"`` whenever tools are sent (llama.cpp hides tools without it), and every
  function declared with ``parameters`` (llama.cpp's chat templates answer HTTP 500 without);
* ``max_tokens`` always set, sized to the model's context: the configured window minus the
  prompt estimate and a safety margin, capped by the feature's own output limit (vLLM refuses
  prompt + max_tokens over the context with HTTP 400);
* provider knobs only by endpoint profile: thinking off is ``chat_template_kwargs.enable_thinking``
  for vLLM, a top-level ``enable_thinking`` (the SDK's ``extra_body``) for DashScope, nothing for
  the others (they ignore or reject unknown fields).

:data:`FEATURES` names each feature's own time budget and output cap; ``model.timeout_s`` caps
the budget unless ``model.deadlines.<feature>_s`` sets it (:func:`feature_deadline`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from qwenctxd.tokens import estimate_tokens

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "FEATURES",
    "FEATURE_HEADER",
    "MIN_OUTPUT_TOKENS",
    "Feature",
    "PROFILE_QUIRKS",
    "PromptTooLong",
    "build_payload",
    "feature_deadline",
    "normalize_messages",
    "output_budget",
    "prompt_estimate",
    "thinking_knobs",
]

FEATURE_HEADER: Final = "X-Qwenctxd-Feature"
"""Names the feature on every request (logs, proxies and the scripted server's strict mode)."""
DEFAULT_CONTEXT_WINDOW: Final = 131_072
"""The window assumed when neither ``[model] context_window`` nor
``model.generationConfig.contextWindowSize`` is set."""
MIN_OUTPUT_TOKENS: Final = 64
#: the prompt estimate (chars / 4) is scaled up by this: real tokenizers split code and JSON finer
PROMPT_ESTIMATE_FACTOR: Final = 1.25


@dataclass(frozen=True, slots=True)
class Feature:
    """A model-backed feature: its own time budget (seconds) and its output cap (tokens)."""

    name: str
    budget_s: float
    max_output_tokens: int


FEATURES: Final[dict[str, Feature]] = {
    f.name: f
    for f in (
        Feature("compress", 120.0, 20_000),
        Feature("project_summary", 60.0, 8_000),
        Feature("recap", 30.0, 300),
        Feature("recall", 30.0, 256),  # a short JSON list of paths
        Feature("forget", 8.0, 384),  # ids and one sentence of reasoning
        Feature("extract", 120.0, 4_096),
        Feature("dream", 300.0, 4_096),
        Feature("skill_review", 300.0, 4_096),
        Feature("speculation", 300.0, 4_096),
        Feature("other", 60.0, 4_096),
    )
}


#: what each endpoint profile is known to reject, before anything is learned at run time
PROFILE_QUIRKS: Final[dict[str, frozenset[str]]] = {
    "llamacpp": frozenset({"json_schema_rejected"}),  # HTTP 500 (reference/real-endpoints.md)
    "ollama": frozenset(),
    "vllm": frozenset(),
    "dashscope": frozenset(),
    "openai": frozenset(),
}


def with_parameters(tools: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``tools`` with each function that declares no ``parameters`` given the empty object
    schema (the same meaning, and what strict servers need)."""
    out: list[Any] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and not isinstance(fn.get("parameters"), Mapping):
            tool = {**tool, "function": {**fn, "parameters": {"type": "object",
                                                              "properties": {}}}}
        out.append(tool)
    return out


class PromptTooLong(ValueError):
    """The prompt leaves less than :data:`MIN_OUTPUT_TOKENS` of the window for the answer."""


def feature_deadline(feature: str, timeout_s: float, deadlines: Mapping[str, float | None]) -> float:
    """The feature's budget: ``deadlines[<feature>_s]`` when set, else its own budget capped by
    ``timeout_s`` (``model.timeout_s``)."""
    explicit = deadlines.get(f"{feature}_s")
    if explicit is not None:
        return float(explicit)
    own = FEATURES.get(feature, FEATURES["other"]).budget_s
    return min(own, timeout_s)


def _plain_text(content: Any) -> Any:
    """A list of text parts joined into one string; any other content unchanged."""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            return content
        text = part.get("text")
        if not isinstance(text, str):
            return content
        texts.append(text)
    return "\n\n".join(t for t in texts if t)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` every real server accepts (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for src in messages:
        msg = dict(src)
        content = _plain_text(msg.get("content"))
        if content is None:
            content = ""
        elif not isinstance(content, (str, list)):
            content = json.dumps(content, ensure_ascii=False, default=str)
        msg["content"] = content
        if msg.get("role") == "assistant" and "tool_calls" in msg and not msg["tool_calls"]:
            del msg["tool_calls"]
        out.append(msg)
    return out


def prompt_estimate(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> int:
    """A deliberately high estimate of the prompt's tokens (JSON of messages and tools)."""
    text = json.dumps(list(messages), ensure_ascii=False, default=str)
    if tools:
        text += json.dumps(list(tools), ensure_ascii=False, default=str)
    return math.ceil(estimate_tokens(text) * PROMPT_ESTIMATE_FACTOR)


def output_budget(prompt_tokens: int, window: int, cap: int) -> int:
    """``max_tokens``: the window minus the prompt and a margin, at most ``cap``.

    Raises :class:`PromptTooLong` when fewer than :data:`MIN_OUTPUT_TOKENS` are left.
    """
    margin = max(64, window // 32)
    room = window - prompt_tokens - margin
    if room < MIN_OUTPUT_TOKENS:
        raise PromptTooLong(f"prompt ~{prompt_tokens} tokens leaves no room in a {window} window")
    return max(MIN_OUTPUT_TOKENS, min(cap, room))


def thinking_knobs(profile: str, thinking: bool | None) -> dict[str, Any]:
    """The provider fields that switch thinking on or off for ``profile`` (may be empty)."""
    if thinking is None:
        return {}
    if profile == "vllm":
        return {"chat_template_kwargs": {"enable_thinking": thinking}}
    if profile == "dashscope":
        return {"enable_thinking": thinking}
    return {}


def build_payload(
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    feature: str,
    window: int,
    profile: str,
    max_tokens: int | None = None,
    temperature: float | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    thinking: bool | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create`` (``extra_body`` included when needed).

    ``max_tokens`` (a caller's own cap) lowers the feature's cap; the result never exceeds what
    the window leaves after the prompt.
    """
    msgs = normalize_messages(messages)
    cap = FEATURES.get(feature, FEATURES["other"]).max_output_tokens
    if max_tokens is not None:
        cap = min(cap, max_tokens)
    budget = output_budget(prompt_estimate(msgs, tools), window, cap)
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": msgs,
        "max_tokens": budget,
        "extra_headers": {FEATURE_HEADER: feature},
    }
    if temperature is not None:
        kwargs["temperature"] = temperature
    if tools:
        kwargs["tools"] = with_parameters(tools)
        kwargs["tool_choice"] = tool_choice if tool_choice is not None else "auto"
    body = thinking_knobs(profile, thinking)
    if extra_body:
        body.update(extra_body)
    if body:
        kwargs["extra_body"] = body
    return kwargs
