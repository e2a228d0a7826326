"""A scripted OpenAI-compatible HTTP server on loopback, for tests and benchmarks.

``ScriptedOpenAI`` serves ``POST /v1/chat/completions`` and ``GET /v1/models`` over real
HTTP/1.1 on ``127.0.0.1`` (ephemeral port, background thread), so tests exercise the real
``openai`` client and its HTTP stack instead of monkeypatching it. Replies come from a script:
a FIFO queue of :class:`Reply` objects, then an optional handler callable, then an optional
default reply; with none of those the server answers HTTP 500 "script exhausted" so a missing
script line shows up as a test failure. Each ``Reply`` can inject a fault (HTTP errors, a slow
answer, a cut stream, a non-JSON body, a dropped connection, a json_schema rejection).

Every request is recorded (``server.requests``). With ``strict_chat=True`` chat bodies are
checked by :func:`validate_chat_body` and rejected with HTTP 400 when malformed. By default
(``strict_payload=None``) the server also rejects, for every request the daemon's model client
sent (it names its feature in the ``X-Qwenctxd-Feature`` header; ``True``: every request,
``False``: none), with HTTP 400, what real servers reject about
a payload (:func:`~qwenctxd.testing.chat_validation.validate_payload`: null content, tools
without ``tool_choice``, a missing ``max_tokens`` or one that does not fit ``context_window``),
so a regression in the daemon's request builder fails the fast suite; ``rejected`` lists them.

Non-streamed replies use ``Content-Length`` and keep the connection alive; streamed replies
use chunked transfer encoding (SSE) and keep it alive too unless the stream is cut.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast

import structlog

from qwenctxd.testing.chat_validation import (
    DEFAULT_STUB_CONTEXT,
    validate_chat_body,
    validate_payload,
)
from qwenctxd.testing.openai_replies import (
    SLOW_DEFAULT_S,
    Fault,
    Reply,
    completion_body,
    error_body,
    stream_events,
    uses_json_schema,
)

__all__ = [
    "SLOW_DEFAULT_S",
    "Fault",
    "RecordedRequest",
    "Reply",
    "ReplyHandler",
    "ScriptedOpenAI",
    "refused_base_url",
    "validate_chat_body",
]

log = structlog.get_logger(__name__)

ReplyHandler = Callable[[dict[str, Any]], Reply]
"""``fn(request_body) -> Reply``: answers requests when the scripted queue is empty."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request as the server received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float = field(default_factory=time.monotonic)

    @property
    def response_format_type(self) -> str | None:
        rf = self.body.get("response_format")
        return rf.get("type") if isinstance(rf, dict) else None


def refused_base_url() -> str:
    """A loopback base URL where nothing listens (a port that was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class _Reject:
    """Marker: the head-of-queue reply refuses this json_schema request without being consumed."""


_REJECT = _Reject()


class ScriptedOpenAI:
    """A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (see module docs).

    Use as a context manager or call ``start()``/``stop()``. Scripting: ``push``/``push_many``
    queue replies (consumed in order); ``handler`` is called when the queue is empty;
    ``default`` answers when neither gives a reply. ``reject_json_schema=True`` makes every
    ``response_format.type == "json_schema"`` request fail with HTTP 500 without consuming the
    script, like llama.cpp's server. A queued ``Reply(fault="reject_json_schema")`` rejects
    json_schema requests while staying at the head of the queue and is consumed by the first
    request it answers.
    """

    def __init__(
        self,
        *,
        models: Iterable[str] = ("stub-model", "stub-fast"),
        default: Reply | None = None,
        handler: ReplyHandler | None = None,
        strict_chat: bool = False,
        reject_json_schema: bool = False,
        strict_payload: bool | None = None,
        context_window: int = DEFAULT_STUB_CONTEXT,
        props: bool = False,
    ) -> None:
        self.models: tuple[str, ...] = tuple(models)
        self.default = default
        self.handler = handler
        self.strict_chat = strict_chat
        self.reject_json_schema = reject_json_schema
        self.strict_payload = strict_payload
        self.context_window = context_window
        #: answer ``GET /props`` with ``default_generation_settings.n_ctx`` as llama.cpp does
        self.props = props
        #: ``POST /v1/embeddings``: texts -> vectors (None: the route answers 404, as a chat-only
        #: server does); ``max_inputs`` rejects larger batches with HTTP 400 as DashScope does;
        #: ``embeddings_down`` answers 503 (an outage)
        self.embed: Callable[[list[str]], list[list[float]]] | None = None
        self.max_inputs: int | None = None
        self.embeddings_down = False
        self._rejected: list[tuple[dict[str, Any], list[str]]] = []
        self._script: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind an ephemeral loopback port and serve in a daemon thread."""
        with self._cond:
            if self._started:
                raise RuntimeError("ScriptedOpenAI can only be started once")
            self._started = True
            server = _Server(("127.0.0.1", 0), _Handler, self)
            self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"ScriptedOpenAI:{server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        log.debug("openai_stub_started", base_url=self.base_url)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, cut open connections and join the threads (bounded by ``timeout``)."""
        with self._cond:
            server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        deadline = time.monotonic() + timeout
        server.shutdown()
        server.close_all_connections()
        server.server_close()
        for thread in [self._thread, *server.handler_threads()]:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        log.debug("openai_stub_stopped", requests=len(self._requests))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        server = self._server
        if server is None:
            raise RuntimeError("ScriptedOpenAI is not running")
        return int(server.server_address[1])

    @property
    def base_url(self) -> str:
        """E.g. ``http://127.0.0.1:PORT/v1`` (what ``AsyncOpenAI(base_url=...)`` wants)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- script ------------------------------------------------------------------------------

    def push(self, reply: Reply) -> None:
        with self._cond:
            self._script.append(reply)

    def push_many(self, replies: Iterable[Reply]) -> None:
        with self._cond:
            self._script.extend(replies)

    @property
    def pending(self) -> int:
        """Queued replies not yet consumed."""
        with self._cond:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, in arrival order."""
        with self._cond:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """Only the chat-completions requests."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests arrived; raise ``TimeoutError`` otherwise.

        This blocks the calling thread: from async code, run it via ``anyio.to_thread``.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests, got {len(self._requests)}")
            return list(self._requests)

    @property
    def rejected(self) -> list[tuple[dict[str, Any], list[str]]]:
        """``(body, problems)`` of every request refused by the strict payload check."""
        with self._cond:
            return list(self._rejected)

    def _reject_payload(self, body: dict[str, Any], problems: list[str]) -> None:
        with self._cond:
            self._rejected.append((body, problems))

    def clear_requests(self) -> None:
        with self._cond:
            self._requests.clear()

    def next_id(self) -> int:
        """A server-unique counter for completion and tool-call ids."""
        with self._cond:
            return next(self._ids)

    def _record(self, req: RecordedRequest) -> None:
        with self._cond:
            self._requests.append(req)
            self._cond.notify_all()

    def _take_reply(self, body: dict[str, Any]) -> Reply | _Reject | None:
        schema = uses_json_schema(body)
        with self._cond:
            if self._script:
                head = self._script[0]
                if head.fault == "reject_json_schema" and schema:
                    return _REJECT
                return self._script.popleft()
            handler, default = self.handler, self.default
        reply = handler(body) if handler is not None else default
        if reply is not None and reply.fault == "reject_json_schema" and schema:
            return _REJECT
        return reply

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; True when it is stopping."""
        return self._stopping.wait(seconds) if seconds > 0 else self._stopping.is_set()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() joins handler threads itself, with a deadline
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], handler: type[_Handler], stub: ScriptedOpenAI):
        self.stub = stub
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._handler_threads: list[threading.Thread] = []
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        with self._lock:
            self._handler_threads = [t for t in self._handler_threads if t.is_alive()]
            self._handler_threads.append(thread)
            self._conns.add(request)
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handler_threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._handler_threads)

    def close_all_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("openai_stub_handler_error", client=str(client_address), exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ScriptedOpenAI/1.0"
    # TCP_NODELAY, as real servers (uvicorn, llama.cpp) set it: without it a streamed chunk
    # written right after the headers waits for the client's delayed ACK (~40 ms)
    disable_nagle_algorithm = True

    @property
    def stub(self) -> ScriptedOpenAI:
        return cast(_Server, self.server).stub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """No access log: every request is in ``stub.requests``; a failing test's output stays
        readable instead of carrying one line per model call."""

    # -- routing -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        self._record({})
        if path in ("/v1/models", "/models"):
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "stub"}
                for m in self.stub.models
            ]
            self._send_json(200, {"object": "list", "data": data})
        elif path == "/props" and self.stub.props:
            self._send_json(200, {"default_generation_settings": {
                "n_ctx": self.stub.context_window}, "total_slots": 1})
        else:
            self._send_json(404, error_body(f"no route for GET {path}", "invalid_request_error"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        raw = self._read_body()
        if raw is None:
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self._record(body if isinstance(body, dict) else {})
        if path in ("/v1/embeddings", "/embeddings") and self.stub.embed is not None:
            self._answer_embeddings(body)
            return
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, error_body(f"no route for POST {path}", "invalid_request_error"))
            return
        if not isinstance(body, dict):
            self._send_json(
                400, error_body("request body is not a JSON object", "invalid_request_error")
            )
            return
        try:
            self._answer_chat(body)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            log.debug("openai_stub_client_gone", path=path)
            self.close_connection = True

    def _read_body(self) -> bytes | None:
        length = self.headers.get("Content-Length")
        if length is None:
            self._send_json(411, error_body("Content-Length required", "invalid_request_error"))
            self.close_connection = True
            return None
        return self.rfile.read(int(length))

    def _record(self, body: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.stub._record(RecordedRequest(self.command, self.path, headers, body))

    # -- embeddings --------------------------------------------------------------------------

    def _answer_embeddings(self, body: Any) -> None:
        """What real servers check: a JSON object, a model, ``input`` a non-empty string or
        list of non-empty strings, a known ``encoding_format``, the batch size."""
        stub = self.stub
        assert stub.embed is not None
        if stub.embeddings_down:
            self._send_json(503, error_body("embeddings backend unavailable", "server_error"))
            return
        problems: list[str] = []
        if not isinstance(body, dict):
            self._send_json(400, error_body("request body is not a JSON object",
                                            "invalid_request_error"))
            return
        if not isinstance(body.get("model"), str) or not body["model"]:
            problems.append("model is required")
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(
                isinstance(t, str) and t for t in inputs):
            problems.append("input must be a non-empty string or a list of non-empty strings")
        if body.get("encoding_format", "float") not in ("float", "base64"):
            problems.append("encoding_format must be float or base64")
        if not problems and stub.max_inputs is not None and len(inputs) > stub.max_inputs:
            problems.append(f"batch size {len(inputs)} exceeds the limit of {stub.max_inputs}")
        if problems:
            self._send_json(400, error_body("; ".join(problems), "invalid_request_error"))
            return
        vectors = stub.embed(list(inputs))
        data = [{"object": "embedding", "index": i, "embedding": v}
                for i, v in enumerate(vectors)]
        self._send_json(200, {"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    # -- chat --------------------------------------------------------------------------------

    def _answer_chat(self, body: dict[str, Any]) -> None:
        stub = self.stub
        if stub.strict_chat:
            problems = validate_chat_body(body)
            if problems:
                msg = "invalid chat request: " + "; ".join(problems)
                self._send_json(400, error_body(msg, "invalid_request_error"))
                return
        strict = stub.strict_payload
        if strict is None:
            strict = "x-qwenctxd-feature" in {k.lower() for k in self.headers}
        if strict:
            problems = validate_payload(body, context_window=stub.context_window)
            if problems:
                stub._reject_payload(body, problems)
                log.warning("openai_stub_payload_rejected", problems=problems)
                msg = "request rejected as a real server would: " + "; ".join(problems)
                self._send_json(400, error_body(msg, "invalid_request_error"))
                return
        if stub.reject_json_schema and uses_json_schema(body):
            self._send_json(500, error_body("json_schema is not supported", "server_error"))
            return
        try:
            reply = stub._take_reply(body)
        except Exception as exc:  # a test's handler callable failed: make it visible
            log.warning("openai_stub_handler_raised", error_type=type(exc).__name__)
            msg = f"scripted handler raised {type(exc).__name__}: {exc}"
            self._send_json(500, error_body(msg, "server_error"))
            return
        if reply is None:
            self._send_json(500, error_body("script exhausted: no reply scripted", "server_error"))
            return
        if isinstance(reply, _Reject):
            self._send_json(500, error_body("json_schema is not supported", "server_error"))
            return
        if stub._sleep(reply.effective_delay_s):
            self._abort()
            return
        stream = bool(body.get("stream"))
        fault = reply.fault
        if fault == "http_500":
            self._send_json(500, error_body("scripted internal server error", "server_error"))
        elif fault == "http_400":
            self._send_json(400, error_body("scripted bad request", "invalid_request_error"))
        elif fault == "drop":
            self._abort()
        elif fault == "invalid_json" and not stream:
            self._send_raw(200, "application/json", b'{"id": "chatcmpl-broken", "choices": [<<<')
        elif stream:
            self._send_stream(body, reply)
        elif fault == "cut_stream":
            payload = json.dumps(self._completion(body, reply)).encode()
            self._send_raw(200, "application/json", payload, cut_at=len(payload) // 2)
        else:
            self._send_json(200, self._completion(body, reply))

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return completion_body(body, reply, self.stub.next_id, self.stub.models[0])

    # -- wire --------------------------------------------------------------------------------

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        self._send_raw(status, "application/json", json.dumps(payload).encode())

    def _send_raw(
        self, status: int, ctype: str, payload: bytes, *, cut_at: int | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if cut_at is None:
            self.wfile.write(payload)
        else:
            self.wfile.write(payload[:cut_at])
            self._abort()

    def _send_stream(self, body: dict[str, Any], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = list(stream_events(body, reply, self.stub.next_id, self.stub.models[0]))
        if reply.fault in ("cut_stream", "interrupted"):
            events = events[: max(2, len(events) // 2)]
        for n, event in enumerate(events):
            if n and self.stub._sleep(reply.chunk_delay_s):
                self._abort()
                return
            data = "{not json" if reply.fault == "invalid_json" else json.dumps(event)
            self._write_chunk(f"data: {data}\n\n".encode())
        if reply.fault == "cut_stream":
            self._abort()  # no [DONE], no terminating chunk: the client sees a truncated body
            return
        self.wfile.write(self._chunk_bytes(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    @staticmethod
    def _chunk_bytes(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(self._chunk_bytes(data))

    def _abort(self) -> None:
        """Close the connection at once, whatever was (not) sent."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
