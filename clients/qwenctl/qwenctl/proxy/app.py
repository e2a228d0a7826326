"""The proxy's ASGI app (Starlette on uvicorn): routes, auth, body limits, the daemon
mapping and the upstream call.

``POST [/p/<base64url(dir)>]/v1/chat/completions`` and ``GET [...]/v1/models``; every request
needs ``Authorization: Bearer <key>`` (else 401, nothing forwarded). A chat request is
mapped onto a daemon session (``mapping``), its ``messages`` replaced by the client's system
prompt plus the project's sections and the daemon's history, everything else forwarded
unchanged over the pooled upstream session (``upstream_http``); the upstream's status, content type and body bytes come back
unchanged (SSE chunk by chunk) and the reply is recorded. A client that disconnects
mid-stream cancels the upstream call; what arrived is recorded as a cut reply. A stream read
to its end is complete even when the client closes right after (curl does); an upstream that
breaks off, or sends nothing for ``upstream_read_s`` (``model.timeout_s``),
is recorded with that cause and the client's stream ends with an SSE error event.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import msgspec
import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from qwenctl.proxy import keys
from qwenctl.proxy.conversation import BadRequest
from qwenctl.proxy.mapping import SessionMap, system_text
from qwenctl.proxy.reply import (
    StreamAccumulator,
    finish_reason_of,
    message_of_completion,
    usage_of,
)
from qwenctl.proxy.request_reader import RequestReader
from qwenctl.proxy.upstream import (
    MIN_ANSWER_TOKENS,
    DoesNotFit,
    UpstreamWindow,
    fit_request,
    normalize_tools,
    tokens_of,
)
from qwenctl.proxy.upstream_http import UpstreamError, UpstreamTimeout, open_session
from qwenctxd.client import ClientError, RemoteError
from qwenctxd.idle_gc import IdleCollector

_decode = msgspec.json.Decoder().decode
#: the body that goes up is the one thing built from the whole history per request: encoded by
#: msgspec (UTF-8 as is, several times faster than json.dumps on a long conversation)
_encode = msgspec.json.Encoder().encode

log = structlog.get_logger("qwenctl.proxy")
MAX_BODY_BYTES = 32 * 1024 * 1024
SESSION_HEADER = "x-qwenctx-session"


@dataclass
class ProxyConfig:
    key: str
    upstream: str  # base URL, e.g. http://127.0.0.1:8080/v1
    upstream_key: str | None
    default_cwd: str
    socket: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    #: the longest the upstream may go without sending a byte (``model.timeout_s``)
    upstream_read_s: float = 60.0
    #: ``[model] context_window``: the window when the upstream does not say (proxy/upstream.py)
    context_window: int | None = None
    #: start the daemon again when it stopped (qwenctl's ``--no-autostart`` turns it off)
    autostart: bool = True
    #: ``--max-tokens``: the largest answer budget forwarded (a small local model asked for
    #: Qwen Code's 32 000 rambles on); None: only the window caps it
    max_tokens: int | None = None


def error(status: int, message: str, err_type: str = "invalid_request_error",
          param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class Proxy:
    def __init__(self, cfg: ProxyConfig, daemon: Any, http: aiohttp.ClientSession) -> None:
        self.cfg, self.daemon, self.http = cfg, daemon, http
        self.sessions = SessionMap(daemon)
        self.reader = RequestReader()
        self.started = self.active = 0  # chat requests so far and now (for idle_gc)
        self.windows = UpstreamWindow(http, cfg.upstream, self.upstream_headers,
                                      cfg.context_window)

    # -- request checks ------------------------------------------------------------------------
    def project(self, request: Request) -> str:
        token = request.path_params.get("project")
        if token is None:
            return self.cfg.default_cwd
        path = keys.decode_project(token)
        if path is None or not os.path.isdir(path):
            raise BadRequest(f"/p/{token[:60]} names no directory (base64url of an absolute "
                             "path)", None, 404)
        return path

    def upstream_headers(self) -> dict[str, str]:
        h = {"content-type": "application/json", "accept-encoding": "identity"}
        if self.cfg.upstream_key:
            h["authorization"] = f"Bearer {self.cfg.upstream_key}"
        return h

    async def read_body(self, request: Request) -> bytes:
        cap = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cap:
            raise BadRequest(f"request body over {cap} bytes", None, 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise BadRequest(f"request body over {cap} bytes", None, 413)
            chunks.append(chunk)
        return b"".join(chunks)

    # -- routes --------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        if not keys.bearer_ok(request.headers.get("authorization"), self.cfg.key):
            return unauthorized()
        try:
            async with self.http.get(self.cfg.upstream.rstrip("/") + "/models",
                                     headers=self.upstream_headers()) as r:
                raw = await r.read()
        except (UpstreamError, UpstreamTimeout) as exc:
            return error(502, f"upstream unreachable: {type(exc).__name__}", "upstream_error")
        return Response(raw, status_code=r.status,
                        media_type=r.headers.get("content-type", "application/json"))

    async def chat(self, request: Request) -> Response:
        if not keys.bearer_ok(request.headers.get("authorization"), self.cfg.key):
            return unauthorized()
        try:
            cwd = self.project(request)
            # the messages the conversation sent before are not read again (request_reader)
            body, conv = self.reader.read(await self.read_body(request))
            model = body.get("model")
            if not isinstance(model, str) or not model:
                raise BadRequest("model must be a non-empty string", "model")
            tools = body.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise BadRequest("tools must be a list", "tools")
            if not isinstance(body.get("stream", False), bool):
                raise BadRequest("stream must be a boolean", "stream")
        except BadRequest as exc:
            return error(exc.status, exc.message, param=exc.param)
        except ClientDisconnect:
            return Response(status_code=499)
        header = request.headers.get(SESSION_HEADER)
        key = session_key(header) if header else conv.conversation_id(cwd)
        return ChatExchange(self, key, cwd, model, body, conv, normalize_tools(tools))


class _NoSession:
    """The state of a side query's exchange: no daemon session, nothing recorded."""

    session_id = None


NO_SESSION = _NoSession()


def is_side_query(body: dict[str, Any], conv: Any) -> bool:
    """An agent's one-shot side query rather than a turn of its conversation: a single user
    message that asks for structured output — a ``tool_choice`` forcing one function (Qwen
    Code's ``respond_in_schema``) or a JSON ``response_format`` with no tools. A chat that
    merely starts with one message (tools offered, the model free to answer) is a
    conversation."""
    if conv.roles != ["user"]:
        return False
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        return True
    tools = body.get("tools") or []
    if choice == "required" and len(tools) == 1:
        return True
    fmt = body.get("response_format")
    return not tools and isinstance(fmt, dict) and fmt.get("type") in ("json_schema",
                                                                        "json_object")


def session_key(header: str) -> str:
    import uuid

    try:
        return str(uuid.UUID(header))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, "qwenctx-session:" + header))


def unauthorized() -> JSONResponse:
    return error(401, "missing or wrong bearer key (see `qwenctl proxy key`)",
                 code="invalid_api_key", headers={"www-authenticate": "Bearer"})


class ChatExchange(Response):
    """One chat request from mapping to recording; an ASGI response so that it holds the
    conversation's lock for the whole exchange and sees the client disconnect."""

    def __init__(self, proxy: Proxy, key: str, cwd: str, model: str, body: dict[str, Any],
                 conv: Any, tools: list[dict[str, Any]] | None) -> None:
        self.proxy, self.key, self.cwd, self.model = proxy, key, cwd, model
        self.body, self.conv, self.tools = body, conv, tools
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sm = self.proxy.sessions
        window, _source = await self.proxy.windows.window(self.model)
        if is_side_query(self.body, self.conv):
            await self._side_query(window, scope, receive, send)
            return
        st = sm.state(self.key)
        async with st.lock:
            try:
                sm.open_params = self._open_params(window)
                prompt = await self._map(st)
                appended = await sm.appended_text(self.cwd, self.model,
                                                  prompt.get("prefix_hash", ""))
            except RemoteError as exc:
                sm.forget(st)
                status = 400 if exc.code == -32602 else 503 if exc.code == -32005 else 502
                field = exc.data.get("field") if isinstance(exc.data, dict) else None
                await error(status, f"qwenctxd refused the request: {exc.message}",
                            "invalid_request_error" if status == 400 else "daemon_error",
                            param=field)(scope, receive, send)
                return
            except (ClientError, OSError) as exc:
                sm.forget(st)
                await error(503, f"qwenctxd unreachable: {exc}", "daemon_error")(
                    scope, receive, send)
                return
            out = dict(self.body)
            system = system_text(self.conv.system, appended)
            out["messages"] = ([{"role": "system", "content": system}] if system else []) + \
                list(prompt["messages"])
            if self.tools is not None:
                out["tools"] = self.tools
            try:
                fitted = fit_request(out, window, self.proxy.cfg.max_tokens)
            except DoesNotFit as exc:
                log.info("proxy request does not fit", session=st.session_id, window=exc.window,
                         system_tokens=exc.system_tokens, tools_tokens=exc.tools_tokens)
                await JSONResponse(exc.body(), status_code=400)(scope, receive, send)
                return
            if fitted.dropped_messages:
                log.info("proxy trimmed history to fit", session=st.session_id,
                         dropped=fitted.dropped_messages, window=window)
            await self._forward(st, out, scope, receive, send)

    async def _side_query(self, window: int | None, scope: Scope, receive: Receive,
                          send: Send) -> None:
        """An agent's own one-shot side query (see :func:`is_side_query`): fitted and
        forwarded as it is, recorded in no session, so it does not clutter ``sessions``."""
        out = dict(self.body)
        out["messages"] = [_decode(m) for m in out["messages"]]  # read as raw JSON
        if self.tools is not None:
            out["tools"] = self.tools
        try:
            fit_request(out, window, self.proxy.cfg.max_tokens)
        except DoesNotFit as exc:
            await JSONResponse(exc.body(), status_code=400)(scope, receive, send)
            return
        await self._forward(NO_SESSION, out, scope, receive, send)

    def _open_params(self, window: int | None) -> dict[str, Any]:
        """What every ``session.open`` of this exchange adds: the upstream (the daemon's side
        queries yield to this session's requests there) and, when known, the window left for
        the conversation once the client's own system prompt is in."""
        params: dict[str, Any] = {"model_base_url": self.proxy.cfg.upstream}
        if window:
            left = window - tokens_of(self.conv.system) - MIN_ANSWER_TOKENS
            params["window_tokens"] = max(1024, left)
            params["window_source"] = "upstream"
        return params

    async def _map(self, st: Any) -> dict[str, Any]:
        sm = self.proxy.sessions
        try:
            return await sm.map(st, cwd=self.cwd, model=self.model, conv=self.conv,
                                tools=self.tools)
        except RemoteError as exc:
            if exc.code != -32001:
                raise
            sm.forget(st)  # the daemon restarted and forgot the session: reopen once
            return await sm.map(st, cwd=self.cwd, model=self.model, conv=self.conv,
                                tools=self.tools)

    async def _forward(self, st: Any, out: dict[str, Any], scope: Scope, receive: Receive,
                       send: Send) -> None:
        p = self.proxy
        sid_header = [(b"x-qwenctx-session", (st.session_id or "").encode())]
        try:
            resp = await p.http.post(p.cfg.upstream.rstrip("/") + "/chat/completions",
                                     data=_encode(out), headers=p.upstream_headers())
        except UpstreamTimeout as exc:  # first: aiohttp's timeouts are ClientErrors too
            await error(504, f"upstream timed out after {p.cfg.upstream_read_s:g} s: "
                             f"{type(exc).__name__}", "upstream_error")(scope, receive, send)
            return
        except UpstreamError as exc:
            await error(502, f"upstream unreachable: {type(exc).__name__}: {exc}",
                        "upstream_error")(scope, receive, send)
            return
        headers = [(b"content-type", resp.headers.get("content-type", "application/json")
                    .encode()), *sid_header]
        if resp.headers.get("cache-control"):
            headers.append((b"cache-control", resp.headers["cache-control"].encode()))
        try:
            if resp.status != 200 or not self.body.get("stream"):
                await self._whole(st, resp, headers, send)
            else:
                await self._stream(st, resp, headers, receive, send)
        finally:
            resp.release()  # back to the pool when read to its end, else the connection closes

    async def _whole(self, st: Any, resp: aiohttp.ClientResponse,
                     headers: list[tuple[bytes, bytes]], send: Send) -> None:
        try:
            raw = await resp.read()
        except (UpstreamError, UpstreamTimeout) as exc:
            await send_error_raw(send, 502, f"upstream reply cut: {type(exc).__name__}")
            return
        if resp.status == 200:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            msg = message_of_completion(parsed)
            if msg is not None:
                await self._record(st, msg, usage_of(parsed), finish_reason_of(parsed))
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [*headers, (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})

    async def _stream(self, st: Any, resp: aiohttp.ClientResponse,
                      headers: list[tuple[bytes, bytes]], receive: Receive, send: Send) -> None:
        """Pass the SSE stream through and record the reply with how it ended (see
        :class:`StreamEnd`): complete once the upstream's last byte is on its way to the client
        (a client that closes right after ``[DONE]`` changes nothing), else the first cause of
        the cut; an upstream that breaks off or stalls past the read deadline ends the client's
        stream with an SSE error event instead of a clean end."""
        acc = StreamAccumulator()
        end = StreamEnd()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        if end.cause("the client disconnected"):
                            tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_disconnect)
            try:
                # whatever has arrived, in one write: a burst of SSE events is one send
                async for chunk in resp.content.iter_any():
                    acc.feed(chunk)
                    if acc.done:
                        end.finish()  # the stream is whole: set before its last send
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if acc.complete:
                    end.finish()
                else:
                    end.cause("the upstream stream ended early")
                    await send_sse_error(send, end.reason or "", more=True)
                await send({"type": "http.response.body", "body": b""})
            except UpstreamTimeout:
                if end.cause(f"the upstream sent nothing for {self.proxy.cfg.upstream_read_s:g} s"):
                    await _quietly(send_sse_error(send, end.reason or ""))
            except UpstreamError:
                if end.cause("the upstream stream broke off"):
                    await _quietly(send_sse_error(send, end.reason or ""))
            except OSError:
                end.cause("the client disconnected")
            tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._record(st, acc.message(end.reason), usage_of({"usage": acc.usage}),
                               acc.finish_reason)
        if end.reason:
            log.info("proxy reply cut", session=st.session_id, reason=end.reason,
                     bytes=acc.bytes)

    async def _record(self, st: Any, msg: dict[str, Any], usage: dict[str, int] | None,
                      finish_reason: str | None) -> None:
        if st is NO_SESSION:
            return
        try:
            await self.proxy.sessions.record(st, msg, usage, finish_reason)
        except (ClientError, OSError) as exc:
            log.warning("proxy could not record the reply", session=st.session_id,
                        error=str(exc))
            self.proxy.sessions.forget(st)


class StreamEnd:
    """How a streamed exchange ended: complete, or cut with the first cause that happened
    (a client disconnect noticed after the upstream broke off does not relabel the cut)."""

    def __init__(self) -> None:
        self.done = False
        self.reason: str | None = None

    def finish(self) -> None:
        if self.reason is None:
            self.done = True

    def cause(self, why: str) -> bool:
        """Record ``why`` as the cut's cause unless the stream is already complete or cut;
        True when it is now the cause."""
        if self.done or self.reason is not None:
            return False
        self.reason = why
        return True


def sse_error_event(message: str) -> bytes:
    """An OpenAI-style SSE error event: what the SDKs raise on in a stream."""
    body = {"error": {"message": f"upstream error: {message}", "type": "upstream_error",
                      "param": None, "code": "upstream_stream_error"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def send_sse_error(send: Send, message: str, *, more: bool = False) -> None:
    """End (or, with ``more``, continue) the client's stream with an SSE error event."""
    await send({"type": "http.response.body", "body": sse_error_event(message),
                "more_body": more})


async def _quietly(step: Any) -> None:
    try:
        await step
    except OSError:  # the client is gone too
        pass


async def send_error_raw(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "upstream_error", "param": None,
                                 "code": None}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def build_app(cfg: ProxyConfig) -> ChatFastPath:
    from contextlib import asynccontextmanager

    from qwenctl.proxy.daemon_link import DaemonLink

    holder: dict[str, Proxy] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        daemon = DaemonLink(cfg.socket, autostart=cfg.autostart)
        async with anyio.create_task_group() as tg, open_session(cfg.upstream_read_s, cfg.upstream) as http:
            await tg.start(daemon.run)
            holder["proxy"] = proxy = Proxy(cfg, daemon, http)
            # start-up objects are permanent: a full collection would rescan ~55 000 of them
            # (15-20 ms of a request's latency), as the daemon also freezes its start-up
            gc.collect()
            gc.freeze()
            # and full collections wait for a moment without requests (qwenctxd.idle_gc)
            tg.start_soon(IdleCollector(lambda: proxy.started, lambda: proxy.active).run)
            yield
            tg.cancel_scope.cancel()

    async def chat(request: Request) -> Response:
        return await holder["proxy"].chat(request)

    async def models(request: Request) -> Response:
        return await holder["proxy"].models(request)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/p/{project}/v1/chat/completions", chat, methods=["POST"]),
        Route("/p/{project}/v1/models", models, methods=["GET"]),
    ]
    return ChatFastPath(Starlette(routes=routes, lifespan=lifespan), holder)


CHAT_PATH = "/v1/chat/completions"


def chat_project(path: str) -> str | None:
    """The ``/p/<token>`` of a chat path ("" without one); None when ``path`` is no chat path
    (the same paths the chat routes match)."""
    if path == CHAT_PATH:
        return ""
    if path.startswith("/p/") and path.endswith(CHAT_PATH):
        token = path[3:-len(CHAT_PATH)]
        if token and "/" not in token:
            return token
    return None


class ChatFastPath:
    """``POST`` to a chat path goes straight to :meth:`Proxy.chat`, without Starlette's router
    and its middleware layers: each wraps every SSE chunk's ``send`` in two more coroutine
    calls, a few percent of the proxy's CPU under 32 streamed conversations (issue 28).
    Everything else (``/models``, a wrong method or path, the lifespan) is the Starlette
    app's. An exception escaping a chat exchange is uvicorn's 500, as it would be Starlette's."""

    def __init__(self, app: Starlette, holder: dict[str, Proxy]) -> None:
        self.app, self._holder = app, holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            project = chat_project(scope["path"])
            if project is not None:
                if project:
                    scope = {**scope, "path_params": {"project": project}}
                proxy = self._holder["proxy"]
                proxy.started += 1
                proxy.active += 1
                try:
                    response = await proxy.chat(Request(scope, receive))
                    await response(scope, receive, send)
                finally:
                    proxy.active -= 1
                return
        await self.app(scope, receive, send)
