"""An OpenAI-compatible ``/v1/embeddings`` endpoint as an embedder (``[memory] embeddings``).

Through the ``openai`` SDK's embeddings call, so DashScope, vLLM, Ollama, llama.cpp
(``--embedding``) and OpenAI itself all work. The quirks the side-query client meets are met
here too: ``encoding_format`` is sent as ``float`` (servers that do not speak base64), rows are
put back in ``index`` order, a batch the server finds too large is split in half and retried
(DashScope takes 10 inputs, llama.cpp what fits its batch), an answer of the wrong size or
shape is a failure, and every failure is :class:`EmbedderUnavailable` with a reason. After a
failure the endpoint rests for ``REST_S`` (the packaged embedder answers meanwhile) instead of
costing every recall a timeout.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Mapping
from typing import Any

import anyio
import structlog

from qwenctxd.memory.semantic.blas import numpy_module
from qwenctxd.memory.semantic.process import EmbedderUnavailable
from qwenctxd.model.calls import map_error
from qwenctxd.model.results import reason_of, safe_url

log = structlog.get_logger("qwenctxd.memory.embedder")
REST_S = 30.0
TOO_LARGE = (400, 413, 422)


class EndpointEmbedder:
    source = "endpoint"

    def __init__(self, *, base_url: str, model: str, api_key_env: str | None = None,
                 timeout_s: float = 10.0, batch: int = 16, query_prefix: str = "",
                 passage_prefix: str = "", environ: Mapping[str, str] | None = None) -> None:
        self.base_url = base_url
        self.model = model
        self.id = f"endpoint:{model}@{safe_url(base_url)}"
        self._key_env = api_key_env
        self._environ = environ if environ is not None else os.environ
        self._timeout = timeout_s
        self._batch = max(1, batch)
        self._query_prefix = query_prefix
        self._passage_prefix = passage_prefix
        self._client: Any = None
        self._oa: Any = None
        self._resting_until = 0.0
        self.dim: int | None = None
        self.last_error: str | None = None
        self.calls = 0

    @property
    def resting(self) -> bool:
        return time.monotonic() < self._resting_until

    async def embed(self, texts: list[str], *, query: bool) -> Any:
        """An (n, dim) float32 array of L2-normalised rows."""
        np = numpy_module()

        if self.resting:
            raise EmbedderUnavailable(f"resting after a failure: {self.last_error}", "down")
        prefix = self._query_prefix if query else self._passage_prefix
        inputs = [prefix + t if prefix else t for t in texts]
        try:
            rows = await self._embed_all(inputs)
        except EmbedderUnavailable as exc:
            self.last_error = str(exc)
            self._resting_until = time.monotonic() + REST_S
            log.warning("embeddings endpoint failed", url=safe_url(self.base_url),
                        model=self.model, error=str(exc))
            raise
        arr = np.asarray(rows, dtype=np.float32)
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return np.ascontiguousarray(arr / norms)

    async def _embed_all(self, inputs: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        start = 0
        while start < len(inputs):
            chunk = inputs[start:start + self._batch]
            try:
                out.extend(await self._call(chunk))
            except _TooLarge:
                if self._batch == 1:
                    raise EmbedderUnavailable("the endpoint refused a single input",
                                              "failed") from None
                self._batch = max(1, self._batch // 2)
                log.info("embeddings batch too large; halving", batch=self._batch)
                continue
            start += len(chunk)
        return out

    async def _call(self, chunk: list[str]) -> list[list[float]]:
        client = await self._ensure_client()
        try:
            with anyio.fail_after(self._timeout):
                resp = await client.embeddings.create(model=self.model, input=chunk,
                                                      encoding_format="float")
        except TimeoutError:
            raise EmbedderUnavailable(f"no answer within {self._timeout:g} s", "down") from None
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            if status in TOO_LARGE and len(chunk) > 1:
                raise _TooLarge from None
            mapped = map_error(self._oa, exc, self._timeout)
            if mapped is None:
                raise
            raise EmbedderUnavailable(f"embeddings call failed: {reason_of(mapped)}",
                                      "down") from None
        self.calls += 1
        data = sorted(getattr(resp, "data", None) or [], key=lambda d: getattr(d, "index", 0))
        rows = [getattr(d, "embedding", None) for d in data]
        if len(rows) != len(chunk) or not all(isinstance(r, list) and r for r in rows):
            raise EmbedderUnavailable(
                f"the endpoint answered {len(rows)} vectors for {len(chunk)} inputs", "failed")
        dims = {len(r) for r in rows}  # type: ignore[arg-type]
        if len(dims) != 1 or (self.dim is not None and dims != {self.dim}):
            raise EmbedderUnavailable(f"vectors of varying size {sorted(dims)}", "failed")
        self.dim = dims.pop()
        return rows  # type: ignore[return-value]

    async def _ensure_client(self) -> Any:
        if self._client is None:
            self._oa = await anyio.to_thread.run_sync(importlib.import_module, "openai")
            key = self._environ.get(self._key_env, "") if self._key_env else ""
            self._client = self._oa.AsyncOpenAI(base_url=self.base_url, api_key=key or "none",
                                                max_retries=0, timeout=self._timeout)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await client.close()
                except Exception:
                    log.debug("embeddings client close failed", exc_info=True)


class _TooLarge(Exception):
    pass
