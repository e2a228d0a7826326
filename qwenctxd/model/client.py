"""The model client: every side query the daemon sends to the OpenAI-compatible endpoint.

:class:`ModelClient` wraps ``openai.AsyncOpenAI`` for the chat-completions calls the daemon
makes (summaries, extraction, ranking): plain completions, streamed completions and structured
JSON output. It owns the policy around those calls:

* ``openai`` is imported lazily, in a worker thread, on the first call (it costs about a second
  and the daemon's start-up budget forbids importing it eagerly);
* one attempt per call (SDK retries off), with the SDK timeout *and* a hard ``anyio.fail_after``
  deadline, so no call outlives its timeout even when the server drips bytes;
* every failure becomes :class:`~qwenctxd.protocol.errors.ModelUnavailable` with
  ``data["reason"]`` one of ``not_configured``, ``timeout``, ``connection``, ``http_<status>``,
  ``invalid_json``, ``stream_cut``, ``empty`` or ``api_error``; messages never carry the API key
  or reply contents, and failures are logged at warning level without message contents;
* every payload is built by :func:`qwenctxd.model.request.build_payload` (no null content,
  ``tool_choice`` with tools, ``max_tokens`` sized to the context window and the feature's cap,
  provider knobs by endpoint profile); each call names its ``feature``, whose deadline is
  ``model.deadlines.<feature>_s`` or the feature's own budget capped by ``model.timeout_s``;
* ``complete_json`` walks the structured-output ladder: ``json_schema`` → ``json_object`` with
  the schema in the system prompt → plain text with the schema in the prompt, parsed. A rung the
  endpoint rejects (HTTP 400/422/500) is learned once per base URL as a *quirk*
  (``json_schema_rejected``, ``json_object_rejected``) and skipped from then on; quirks are in
  ``status()`` (``daemon.status`` → ``model.quirks``, ``qwenctl status``).

One ``AsyncOpenAI`` (and its connection pool) is kept per (base_url, api_key); ``update()``
swaps the endpoint on config reload and retires the old client once its calls finish. A
``ModelClient`` belongs to one event loop; call ``aclose()`` when done.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import anyio
import structlog

from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model.calls import (
    DeltaCallback,
    Request,
    map_error,
    one_shot,
    stream_once,
)
from qwenctxd.model.request import (
    DEFAULT_CONTEXT_WINDOW,
    PROFILE_QUIRKS,
    PromptTooLong,
    build_payload,
    feature_deadline,
)
from qwenctxd.model.results import (
    Completion,
    Message,
    parse_json_reply,
    reason_of,
    safe_url,
    unavailable,
    url_problem,
    with_schema_instruction,
    without_response_format,
)
from qwenctxd.model.scheduler import BACKGROUND_FEATURES, EndpointScheduler, Preempted
from qwenctxd.protocol.errors import ModelUnavailable

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["Completion", "DeltaCallback", "Message", "ModelClient", "parse_json_reply"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

_SCHEMA_REJECTED = frozenset({"http_400", "http_422", "http_500"})
#: endpoint profiles whose servers keep generating a non-streamed answer the client abandoned;
#: their background side queries go streamed (model/scheduler.py preempts them)
STREAMED_PROFILES = frozenset({"llamacpp", "ollama"})
_STATUS_FEATURES = ("compress", "project_summary", "recap", "recall", "forget", "extract",
                    "dream", "skill_review", "speculation")


def _new_client(oa: ModuleType, ep: ModelEndpoint) -> AsyncOpenAI:
    client = oa.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key or "none",
                            max_retries=0, timeout=ep.timeout_s)
    client.chat.completions  # noqa: B018  # imports the chat resources here, not on the loop
    return client


@dataclass(slots=True)
class _Slot:
    """An ``AsyncOpenAI`` for one (base_url, api_key) and the calls using it."""

    client: AsyncOpenAI
    key: tuple[str | None, str | None]
    inflight: int = 0
    retired: bool = False


@dataclass(slots=True)
class _Call:
    """Per-call bookkeeping for logs and counters."""

    op: str
    model: str | None = None
    error_type: str | None = None
    started: float = field(default_factory=time.monotonic)


class ModelClient:
    """Chat-completions client for side queries; see the module docstring for the policy."""

    def __init__(self, endpoint: ModelEndpoint,
                 scheduler: EndpointScheduler | None = None) -> None:
        self._endpoint = endpoint
        self._scheduler = scheduler
        self._openai: ModuleType | None = None
        self._slot: _Slot | None = None
        self._making = anyio.Lock()  # held while the HTTP client is made (see _acquire)
        self._retired: list[_Slot] = []
        self._quirks: dict[str, set[str]] = {}
        self._calls = 0
        self._failures = 0
        self._last_error: str | None = None

    # -- configuration and status ------------------------------------------------------------

    @property
    def endpoint(self) -> ModelEndpoint:
        return self._endpoint

    @property
    def configured(self) -> bool:
        return self._endpoint.configured

    @property
    def imported(self) -> bool:
        """Whether ``openai`` has been imported by this client."""
        return self._openai is not None

    def update(self, endpoint: ModelEndpoint) -> None:
        """Swap the endpoint (config reload). Calls in flight finish on the old connection."""
        self._endpoint = endpoint
        slot = self._slot
        if slot is not None and slot.key != (endpoint.base_url, endpoint.api_key):
            slot.retired = True
            self._slot = None
            if slot.inflight == 0:
                self._retired.append(slot)

    def status(self) -> dict[str, Any]:
        """Counters and settings for ``daemon.status`` (never the API key)."""
        ep = self._endpoint
        return {
            "configured": ep.configured,
            "imported": self.imported,
            "base_url": safe_url(ep.base_url),
            "model": ep.model,
            "fast_model": ep.fast_model,
            "timeout_s": ep.timeout_s,
            "calls": self._calls,
            "failures": self._failures,
            "last_error": self._last_error,
            "profile": ep.profile,
            "context_window": self.context_window,
            "deadlines": {f: self.deadline(f) for f in _STATUS_FEATURES},
            "quirks": sorted(self.quirks()),
            "json_schema_fallback": "json_schema_rejected" in self.quirks(),
            "scheduler": self._scheduler.status() if self._scheduler is not None else None,
        }

    @property
    def scheduler(self) -> EndpointScheduler | None:
        """Foreground-first admission of background side queries (model/scheduler.py)."""
        return self._scheduler

    @property
    def context_window(self) -> int:
        return self._endpoint.context_window or DEFAULT_CONTEXT_WINDOW

    def deadline(self, feature: str) -> float:
        """The whole budget of ``feature`` in seconds (see the module docstring)."""
        ep = self._endpoint
        return feature_deadline(feature, ep.timeout_s, ep.deadlines.as_dict())

    def quirks(self, base_url: str | None = None) -> set[str]:
        """What this daemon learned the endpoint at ``base_url`` (default: the current) rejects."""
        url = self._endpoint.base_url if base_url is None else base_url
        known = PROFILE_QUIRKS.get(self._endpoint.profile, frozenset())
        return set(self._quirks.get(url or "", ())) | known

    def _learn(self, quirk: str) -> None:
        url = self._endpoint.base_url or ""
        known = self._quirks.setdefault(url, set())
        if quirk not in known:
            known.add(quirk)
            log.info("model_endpoint_quirk_learned", quirk=quirk, endpoint=safe_url(url))

    async def warm_up(self) -> None:
        """Import ``openai`` now (in a worker thread) instead of on the first call, and with
        an endpoint configured make its HTTP client too (see :meth:`_acquire`)."""
        await self._import()
        ep = self._endpoint
        if ep.configured and self._slot is None and not url_problem(ep.base_url or ""):
            try:
                await self._release(await self._acquire())
            except Exception:  # the SDK refusing the configuration: the first call reports it
                log.debug("model_client_warm_up_failed", exc_info=True)

    async def aclose(self) -> None:
        """Close the HTTP clients this instance opened; later calls open a new one.

        A client with calls still in flight is closed when its last call finishes.
        """
        slots, current = self._retired, self._slot
        self._retired, self._slot = [], None
        if current is not None:
            current.retired = True
            if current.inflight == 0:
                slots.append(current)
        for slot in slots:
            await self._close_slot(slot)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _unlearn(self, quirks: Sequence[str]) -> None:
        known = self._quirks.get(self._endpoint.base_url or "", set())
        for quirk in quirks:
            known.discard(quirk)

    # -- public calls ------------------------------------------------------------------------

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        fast: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        feature: str = "other",
        thinking: bool | None = False,
    ) -> Completion:
        """One non-streamed chat completion."""
        with self._accounting("complete") as call:
            req = self._prepare(
                call, messages, model, fast, max_tokens, temperature, tools, tool_choice,
                timeout_s, extra_body, feature, thinking,
            )  # fmt: skip
            return await self._run(call, req, self._one_shot_call)

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        fast: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        on_delta: DeltaCallback | None = None,
        feature: str = "other",
        thinking: bool | None = False,
    ) -> Completion:
        """A streamed chat completion, accumulated; ``on_delta`` sees each text delta."""
        with self._accounting("stream") as call:
            req = self._prepare(
                call, messages, model, fast, max_tokens, temperature, tools, tool_choice,
                timeout_s, extra_body, feature, thinking,
            )  # fmt: skip

            async def body(client: AsyncOpenAI, r: Request) -> Completion:
                return await stream_once(self._oa(), client, r, on_delta)

            return await self._run(call, req, body)

    async def complete_json(
        self,
        messages: Sequence[Message],
        schema: Mapping[str, Any],
        *,
        name: str,
        model: str | None = None,
        fast: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout_s: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        feature: str = "other",
        thinking: bool | None = False,
    ) -> dict[str, Any]:
        """Structured output: a JSON object meant to follow ``schema`` (not validated here).

        The ladder: ``json_schema``; then ``json_object`` with the schema in the system prompt;
        then no ``response_format`` at all, the schema in the prompt and the JSON parsed out of
        the text. A rung answered with HTTP 400/422/500 is learned as a quirk of the endpoint and
        skipped by later calls. Every rung carries ``max_tokens``; all share one deadline.
        """
        with self._accounting("complete_json") as call:
            req = self._prepare(
                call, messages, model, fast, max_tokens, temperature, None, None, timeout_s,
                extra_body, feature, thinking,
            )  # fmt: skip
            deadline = req.deadline
            base = dict(req.kwargs)
            rungs = [
                ("json_schema_rejected", {"type": "json_schema", "json_schema": {
                    "name": name, "schema": dict(schema), "strict": True}}, False),
                ("json_object_rejected", {"type": "json_object"}, True),
                (None, None, True),
            ]  # fmt: skip
            quirks = self.quirks()
            last: ModelUnavailable | None = None
            pending: list[str] = []
            for quirk, fmt, in_prompt in rungs:
                if quirk is not None and quirk in quirks:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise unavailable("timeout", detail=f"{req.timeout:g}s")
                kwargs = without_response_format(base)
                if in_prompt:
                    kwargs["messages"] = with_schema_instruction(base["messages"], schema)
                if fmt is not None:
                    kwargs["response_format"] = fmt
                rung = Request(model=req.model, timeout=remaining, kwargs=kwargs,
                                feature=req.feature, stream=req.stream)
                try:
                    done = await self._run(call, rung, self._one_shot_call)
                except ModelUnavailable as exc:
                    reason = reason_of(exc)
                    if quirk is None or reason not in _SCHEMA_REJECTED:
                        raise
                    if last is not None and reason_of(last) == reason:
                        # the next rung failed the same way: the server is failing, not
                        # refusing a format; nothing is learned
                        self._unlearn(pending)
                        raise
                    self._learn(quirk)
                    pending.append(quirk)
                    last = exc
                    continue
                return parse_json_reply(done.text)
            assert last is not None
            raise last

    # -- internals ---------------------------------------------------------------------------

    @contextmanager
    def _accounting(self, op: str) -> Iterator[_Call]:
        self._calls += 1
        call = _Call(op)
        try:
            yield call
        except ModelUnavailable as exc:
            self._failures += 1
            reason = reason_of(exc)
            self._last_error = reason
            (log.debug if reason == "not_configured" else log.warning)(
                "model_call_failed",
                op=op,
                reason=reason,
                model=call.model,
                endpoint=safe_url(self._endpoint.base_url),
                error_type=call.error_type,
                elapsed_ms=round((time.monotonic() - call.started) * 1000),
            )
            raise

    def _prepare(
        self,
        call: _Call,
        messages: Sequence[Message],
        model: str | None,
        fast: bool,
        max_tokens: int | None,
        temperature: float | None,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
        timeout_s: float | None,
        extra_body: Mapping[str, Any] | None,
        feature: str,
        thinking: bool | None,
    ) -> Request:
        ep = self._endpoint
        if not ep.configured:
            raise unavailable("not_configured")
        problem = url_problem(ep.base_url or "")
        if problem:
            raise unavailable(
                "not_configured", message=f"Model endpoint is misconfigured: {problem}"
            )
        name = model or (ep.fast_model if fast and ep.fast_model else ep.model)
        assert name is not None  # configured implies a model
        call.model = name
        try:
            kwargs = build_payload(
                model=name, messages=messages, feature=feature, window=self.context_window,
                profile=ep.profile, max_tokens=max_tokens, temperature=temperature,
                tools=tools, tool_choice=tool_choice, thinking=thinking, extra_body=extra_body,
            )  # fmt: skip
        except PromptTooLong as exc:
            raise unavailable("prompt_too_long", detail=str(exc)) from None
        timeout = self.deadline(feature) if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError("timeout_s must be > 0")
        stream = feature in BACKGROUND_FEATURES and ep.profile in STREAMED_PROFILES
        return Request(model=name, timeout=timeout, kwargs=kwargs, feature=feature,
                        stream=stream)

    async def _import(self) -> ModuleType:
        if self._openai is None:
            started = time.monotonic()
            module = await anyio.to_thread.run_sync(importlib.import_module, "openai")
            if self._openai is None:
                self._openai = module
                log.debug("openai_imported", elapsed_ms=round((time.monotonic() - started) * 1000))
        return self._openai

    async def _acquire(self) -> _Slot:
        oa = await self._import()
        while self._retired:
            await self._close_slot(self._retired.pop())
        ep = self._endpoint
        slot = self._slot
        if slot is None:
            # made in a worker thread: the transport's SSL context (the CA bundle read and
            # parsed) and the SDK's lazily imported resources took ~40 ms of the event loop
            # on the first model call, a stall for every request in flight
            async with self._making:  # one at a time: concurrent first calls share it
                ep = self._endpoint
                if self._slot is None:
                    key = (ep.base_url, ep.api_key)
                    client = await anyio.to_thread.run_sync(_new_client, oa, ep)
                    slot = _Slot(client=client, key=key)
                    if (self._endpoint.base_url, self._endpoint.api_key) == key:
                        self._slot = slot
                    else:  # the endpoint changed meanwhile: not kept
                        slot.retired = True
                        self._retired.append(slot)
            return await self._acquire()
        slot.inflight += 1
        return slot

    async def _release(self, slot: _Slot) -> None:
        slot.inflight -= 1
        if slot.retired and slot.inflight == 0:
            await self._close_slot(slot)

    @staticmethod
    async def _close_slot(slot: _Slot) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await slot.client.close()
            except Exception:  # closing must never mask the call's own outcome
                log.debug("model_client_close_failed", exc_info=True)

    async def _run(
        self,
        call: _Call,
        req: Request,
        body: Callable[[AsyncOpenAI, Request], Awaitable[T]],
    ) -> T:
        """Run ``body`` under the hard deadline, mapping every failure to ModelUnavailable.

        A background feature's call first waits (at most its own budget, which the wait does
        not eat into) until the endpoint has no foreground request, and is preempted by one
        that begins while it runs (model/scheduler.py)."""
        sched = self._scheduler if req.feature in BACKGROUND_FEATURES else None
        url = self._endpoint.base_url
        if sched is not None:
            started = time.monotonic()
            if not await sched.wait_idle(url, req.deadline - started):
                call.error_type = "foreground_busy"
                raise unavailable("timeout", detail="the endpoint stayed busy with the user's "
                                  "own requests")
            req.deadline += time.monotonic() - started
        try:
            slot = await self._acquire()
        except Exception as exc:  # e.g. the SDK refusing its configuration
            mapped = map_error(self._openai, exc, req.timeout)
            if mapped is None:
                raise
            call.error_type = type(exc).__name__
            raise mapped from None
        try:
            remaining = req.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            req.timeout = remaining
            if sched is None:
                with anyio.fail_after(remaining):
                    return await body(slot.client, req)
            async with sched.background(url):
                with anyio.fail_after(remaining):
                    return await body(slot.client, req)
            raise AssertionError("unreachable")  # pragma: no cover
        except Preempted:
            call.error_type = "preempted"
            raise unavailable("preempted") from None
        except ModelUnavailable:
            raise
        except TimeoutError:
            call.error_type = "deadline"
            raise unavailable("timeout", detail=f"{req.timeout:g}s") from None
        except Exception as exc:
            mapped = map_error(self._openai, exc, req.timeout)
            if mapped is None:
                raise
            call.error_type = type(exc).__name__
            raise mapped from None
        finally:
            await self._release(slot)

    def _oa(self) -> ModuleType:
        assert self._openai is not None  # imported by _acquire before any body runs
        return self._openai

    async def _one_shot_call(self, client: AsyncOpenAI, req: Request) -> Completion:
        return await one_shot(self._oa(), client, req)
