"""``model.probe``: is the model endpoint usable, and which request shapes does it accept?

One request per shape, each with a small output cap and its own deadline, on a fresh
:class:`ModelClient` for the configured endpoint (the daemon's own client keeps its counters
and its learned json_schema fallback untouched):

* ``models`` — ``GET /models`` (reachability; the model ids it lists);
* ``chat`` — a plain non-streamed completion;
* ``stream`` — the same, streamed;
* ``json_schema`` — ``response_format: {type: "json_schema"}`` (llama.cpp refuses it);
* ``json_object`` — ``response_format: {type: "json_object"}`` (the daemon's fallback);
* ``tools`` — a completion that declares one tool.

When ``chat`` fails for a connection, a timeout or ``not_configured``, the later shapes are
reported ``skipped``. Failure reasons are ModelUnavailable's (``connection``, ``timeout``,
``http_<status>``, …); nothing here carries the API key or reply contents.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model.client import ModelClient
from qwenctxd.model.results import reason_of, safe_url
from qwenctxd.protocol.errors import ModelUnavailable

SHAPES = ("models", "chat", "stream", "json_schema", "json_object", "tools")
_FATAL = frozenset({"connection", "timeout", "not_configured"})
_PING = [{"role": "user", "content": 'Reply with the single word "ok".'}]
_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
           "additionalProperties": False}
_JSON_PING = [{"role": "system", "content": 'Answer with the JSON object {"ok": true}.'},
              {"role": "user", "content": "Are you there?"}]
_TOOL = {"type": "function", "function": {
    "name": "noop", "description": "Does nothing.",
    "parameters": {"type": "object", "properties": {}}}}


@dataclass
class ShapeResult:
    shape: str
    status: str  # "ok" | "failed" | "skipped"
    reason: str | None = None
    ms: int | None = None


@dataclass
class ProbeReport:
    configured: bool
    base_url: str | None
    model: str | None
    fast_model: str | None
    api_key_set: bool
    reachable: bool
    models: list[str] | None = None
    shapes: list[ShapeResult] = field(default_factory=list)


async def _timed(shape: str, timeout_s: float, fn: Callable[[], Awaitable[Any]]
                 ) -> tuple[ShapeResult, Any]:
    started = time.monotonic()
    try:
        with anyio.fail_after(timeout_s):
            value = await fn()
    except ModelUnavailable as exc:
        return ShapeResult(shape, "failed", reason_of(exc),
                           round((time.monotonic() - started) * 1000)), None
    except TimeoutError:
        return ShapeResult(shape, "failed", "timeout", round(timeout_s * 1000)), None
    except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
        return ShapeResult(shape, "failed", type(exc).__name__,
                           round((time.monotonic() - started) * 1000)), None
    return ShapeResult(shape, "ok", None, round((time.monotonic() - started) * 1000)), value


async def _list_models(client: ModelClient, ep: ModelEndpoint, timeout_s: float) -> list[str]:
    import openai

    oa = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key or "none", max_retries=0,
                            timeout=timeout_s)
    try:
        page = await oa.models.list()
        return [m.id for m in page.data]
    except openai.APIConnectionError:
        raise ModelUnavailable("model endpoint unreachable", data={"reason": "connection"}
                               ) from None
    except openai.APIStatusError as exc:
        raise ModelUnavailable(f"HTTP {exc.status_code}",
                               data={"reason": f"http_{exc.status_code}"}) from None
    finally:
        await oa.close()


async def probe(ep: ModelEndpoint, *, timeout_s: float = 10.0) -> ProbeReport:
    """Try every shape in :data:`SHAPES` against ``ep``; see the module docstring."""
    report = ProbeReport(configured=ep.configured, base_url=safe_url(ep.base_url),
                         model=ep.model, fast_model=ep.fast_model,
                         api_key_set=bool(ep.api_key), reachable=False)
    if not ep.configured:
        report.shapes = [ShapeResult(s, "skipped", "not_configured") for s in SHAPES]
        return report
    per_call = min(timeout_s, ep.timeout_s)
    async with ModelClient(ep) as client:
        await client.warm_up()
        res, ids = await _timed("models", per_call,
                                lambda: _list_models(client, ep, per_call))
        report.shapes.append(res)
        report.models = ids
        calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("chat", lambda: client.complete(_PING, max_tokens=16, timeout_s=per_call)),
            ("stream", lambda: client.stream(_PING, max_tokens=16, timeout_s=per_call)),
            ("json_schema", lambda: client.complete(
                _JSON_PING, max_tokens=32, timeout_s=per_call, extra_body={"response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "probe", "schema": _SCHEMA, "strict": True}}})),
            ("json_object", lambda: client.complete(
                _JSON_PING, max_tokens=32, timeout_s=per_call,
                extra_body={"response_format": {"type": "json_object"}})),
            ("tools", lambda: client.complete(_PING, max_tokens=16, timeout_s=per_call,
                                              tools=[_TOOL])),
        ]
        fatal: str | None = None
        for shape, fn in calls:
            if fatal is not None:
                report.shapes.append(ShapeResult(shape, "skipped", fatal))
                continue
            res, _ = await _timed(shape, per_call + 1.0, fn)
            report.shapes.append(res)
            if shape == "chat":
                if res.status == "ok":
                    report.reachable = True
                elif res.reason in _FATAL:
                    fatal = res.reason
        if not report.reachable and report.shapes[0].status == "ok":
            report.reachable = True  # it answered /models, just not chat
    return report
