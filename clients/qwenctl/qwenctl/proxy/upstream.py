"""Fit every forwarded request to the upstream: its learned context window, its strictness.

* **The window**, learned once per upstream model and cached: llama.cpp's ``GET /props``
  (``default_generation_settings.n_ctx``), vLLM's ``GET /v1/models`` (``max_model_len``),
  Ollama's ``POST /api/show`` (``num_ctx`` in its parameters, else the model's
  ``*.context_length``); else ``[model] context_window`` from the user's config; else unknown
  (nothing is capped — the upstream decides).
* **Tool declarations** strict servers reject are normalised: a function without
  ``parameters`` (Qwen Code declares two) gets the empty object schema, which means the same
  and which llama.cpp's chat templates need (they answer HTTP 500 without it).
* **Fitting**: the request's size is estimated with the daemon's token estimator (scaled up by
  :data:`ESTIMATE_FACTOR`, as the daemon's request builder does); ``max_tokens`` (and
  ``max_completion_tokens``) are capped to what the window leaves; a history the daemon has
  not compacted far enough yet loses its oldest whole turns for this request only; a request
  whose system prompt and tools alone leave no room for an answer is refused with HTTP 400
  ``context_window_exceeded`` naming the sizes, instead of the upstream's HTTP 500.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import structlog

from qwenctl.proxy.upstream_http import UpstreamError, UpstreamTimeout
from qwenctxd.tokens import estimate_tokens

__all__ = ["ESTIMATE_FACTOR", "MIN_ANSWER_TOKENS", "DoesNotFit", "Fitted", "UpstreamWindow",
           "fit_request", "normalize_tools", "tokens_of"]

log = structlog.get_logger("qwenctl.proxy")

#: real tokenizers split code, JSON and chat-template markup finer than chars / 4
ESTIMATE_FACTOR: Final = 1.25
#: a request that leaves less than this for the answer does not fit
MIN_ANSWER_TOKENS: Final = 256
#: per message: role markers and separators of the chat template
MESSAGE_OVERHEAD_TOKENS: Final = 8
EMPTY_SCHEMA: Final = {"type": "object", "properties": {}}
#: each probe for the window (``/props``, ``/v1/models``, ``/api/show``) gives up after 5 s
LEARN_TIMEOUT: Final = aiohttp.ClientTimeout(total=5.0)


class DoesNotFit(Exception):
    """Even with no history the request leaves no room for an answer."""

    def __init__(self, window: int, system_tokens: int, tools_tokens: int,
                 prompt_tokens: int) -> None:
        super().__init__(
            f"the request does not fit the upstream's context window of {window} tokens: the "
            f"system prompt takes about {system_tokens}, the tool declarations about "
            f"{tools_tokens}, the current turn about {prompt_tokens - system_tokens - tools_tokens}"
            f", and the answer needs at least {MIN_ANSWER_TOKENS}; raise the server's context "
            "size (llama.cpp: --ctx-size / n_ctx) or send fewer tools")
        self.window, self.system_tokens, self.tools_tokens = window, system_tokens, tools_tokens
        self.prompt_tokens = prompt_tokens

    def body(self) -> dict[str, Any]:
        return {"error": {"type": "context_window_exceeded", "message": str(self),
                          "code": "context_window_exceeded", "param": "messages",
                          "window": self.window, "system_tokens": self.system_tokens,
                          "tools_tokens": self.tools_tokens,
                          "prompt_tokens": self.prompt_tokens}}


@dataclass
class Fitted:
    prompt_tokens: int | None  # None: no window to fit to, so not counted
    max_tokens: int | None
    dropped_messages: int = 0


def tokens_of(obj: Any) -> int:
    """The estimate for ``obj`` as sent (JSON text for structures)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    if len(text) > _LONG_TEXT:  # a system prompt or a tools list: the same every request
        return _long_text_tokens(text)
    return math.ceil(estimate_tokens(text) * ESTIMATE_FACTOR)


_LONG_TEXT = 4096


@functools.lru_cache(maxsize=64)
def _long_text_tokens(text: str) -> int:
    return math.ceil(estimate_tokens(text) * ESTIMATE_FACTOR)


def message_tokens(msg: Mapping[str, Any]) -> int:
    content = msg.get("content")
    n = tokens_of(content) if isinstance(content, str) else tokens_of(content or "")
    if msg.get("tool_calls"):
        n += tokens_of(msg["tool_calls"])
    return n + MESSAGE_OVERHEAD_TOKENS


def normalize_tools(tools: Any) -> Any:
    """``tools`` with every function declaration given ``parameters`` (a copy where changed)."""
    if not isinstance(tools, list):
        return tools
    out: list[Any] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("parameters"), dict):
            tool = {**tool, "function": {**fn, "parameters": dict(EMPTY_SCHEMA)}}
        out.append(tool)
    return out


def _turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    """Indexes where a user turn begins (a place to cut without splitting a tool exchange)."""
    return [i for i, m in enumerate(messages) if m.get("role") == "user"]


def fit_request(out: dict[str, Any], window: int | None, cap: int | None = None) -> Fitted:
    """Fit ``out`` (the body to forward; changed in place) to ``window`` tokens; ``cap``
    (``qwenctl proxy --max-tokens``) bounds every answer budget besides."""
    if window is None:  # nothing to fit to: the whole history is not even counted
        if cap is not None:
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(out.get(key), int) and out[key] > cap:
                    out[key] = cap
            out.setdefault("max_tokens", cap)
        return Fitted(prompt_tokens=None, max_tokens=cap)
    messages: list[dict[str, Any]] = out.get("messages") or []
    tools = out.get("tools")
    tools_tokens = tokens_of(tools) if tools else 0
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    system_tokens = sum(message_tokens(m) for m in system)
    sizes = [message_tokens(m) for m in rest]
    total = system_tokens + tools_tokens + sum(sizes)
    dropped = 0
    if total + MIN_ANSWER_TOKENS > window:
        starts = _turn_starts(rest)
        cut = 0
        for start in starts[1:]:  # never the last user turn
            if total - sum(sizes[:start]) + MIN_ANSWER_TOKENS <= window:
                cut = start
                break
            cut = start
        if cut:
            total -= sum(sizes[:cut])
            dropped, rest = cut, rest[cut:]
            out["messages"] = system + rest
        if total + MIN_ANSWER_TOKENS > window:
            raise DoesNotFit(window, system_tokens, tools_tokens, total)
    room = window - total if cap is None else min(window - total, cap)
    capped = None
    for key in ("max_tokens", "max_completion_tokens"):
        asked = out.get(key)
        if isinstance(asked, int) and asked > room:
            out[key] = room
            capped = room
        elif isinstance(asked, int):
            capped = asked
    if capped is None:
        out["max_tokens"] = capped = room
    return Fitted(prompt_tokens=total, max_tokens=capped, dropped_messages=dropped)


def _root(base_url: str) -> str:
    """``http://host:port`` of an OpenAI base URL (``…/v1`` dropped)."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class UpstreamWindow:
    """The upstream's context window per model, learned on first use (see the module doc)."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str,
                 headers: Callable[[], dict[str, str]], configured: int | None = None) -> None:
        self._http, self._base, self._headers = http, base_url.rstrip("/"), headers
        self._configured = configured
        self._known: dict[str, tuple[int | None, str]] = {}

    async def window(self, model: str) -> tuple[int | None, str]:
        """(window tokens or None, where it came from: props|models|ollama|config|unknown)."""
        hit = self._known.get(model)
        if hit is None:
            hit = self._known[model] = await self._learn(model)
            log.info("proxy upstream window", model=model, window=hit[0], source=hit[1])
        return hit

    async def _get_json(self, method: str, url: str, body: Any = None) -> Any:
        try:
            async with self._http.request(method, url, headers=self._headers(), json=body,
                                          timeout=LEARN_TIMEOUT) as r:
                if r.status != 200:
                    return None
                raw = await r.read()
        except (UpstreamError, UpstreamTimeout):
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    async def _learn(self, model: str) -> tuple[int | None, str]:
        root = _root(self._base)
        props = await self._get_json("GET", root + "/props")
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            n = settings.get("n_ctx") if isinstance(settings, dict) else None
            n = n if isinstance(n, int) else props.get("n_ctx")
            if isinstance(n, int) and n > 0:
                return n, "props"
        models = await self._get_json("GET", self._base + "/models")
        rows = models.get("data") if isinstance(models, dict) else None
        if isinstance(rows, list):
            mine = [r for r in rows if isinstance(r, dict) and r.get("id") == model] or [
                r for r in rows if isinstance(r, dict)]
            for row in mine:
                n = row.get("max_model_len")
                if isinstance(n, int) and n > 0:
                    return n, "models"
        show = await self._get_json("POST", root + "/api/show", {"model": model})
        if isinstance(show, dict):
            for line in str(show.get("parameters") or "").splitlines():
                key, _, value = line.partition(" ")
                if key == "num_ctx" and value.strip().isdigit():
                    return int(value.strip()), "ollama"
            info = show.get("model_info")
            if isinstance(info, dict):
                for key, value in info.items():
                    if key.endswith(".context_length") and isinstance(value, int):
                        return value, "ollama"
        if self._configured:
            return self._configured, "config"
        return None, "unknown"
