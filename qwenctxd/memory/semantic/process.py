"""The daemon's side of the embedding worker (:mod:`qwenctxd.memory.semantic.worker`).

One child process, started on first use and kept; one request on the pipe at a time, in order.
A caller cancelled while its reply is on the way (a recall past its deadline) does not desync
the pipe: the reply is owed, and the next request reads and drops it first. A worker that dies
is restarted on the next request; one that dies again within ``RESTART_WINDOW_S`` is given up
on for that long (the lexical tier answers meanwhile), and :attr:`status` says why.

Queries that arrive while the worker is busy wait as one batch (:meth:`embed`): the first of
them waits for the pipe, the later ones join it until it is sent, and one request embeds them
all. Under many concurrent turns (a proxy's 32 conversations) each recall's query otherwise
queued behind every other's, one worker round trip each.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from qwenctxd.memory.semantic.blas import numpy_module
from qwenctxd.paths import state_dir

log = structlog.get_logger("qwenctxd.memory.embedder")
HEADER = struct.Struct(">I")
RESTART_WINDOW_S = 60.0
START_TIMEOUT_S = 30.0


class EmbedderUnavailable(Exception):
    """No vectors from this embedder now; ``kind`` is ``missing`` (not installed),
    ``failed`` (it answered with an error), ``down`` (the worker died or would not start)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


MAX_QUERY_BATCH = 64


class _QueryBatch:
    """Queries waiting for the pipe together; ``vectors`` once embedded, ``error`` if not
    (None with no vectors: the one sending it was cancelled first — the others try again)."""

    def __init__(self, text: str) -> None:
        self.texts = [text]
        self.done = anyio.Event()
        self.vectors: Any = None
        self.error: EmbedderUnavailable | None = None


class EmbedderProcess:
    def __init__(self, *, command: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self._command = command or [sys.executable, "-m", "qwenctxd.memory.semantic.worker"]
        self._env = env
        self._proc: anyio.abc.Process | None = None
        self._reader: BufferedByteReceiveStream | None = None
        self._lock = anyio.Lock()
        self._owed = 0
        #: per (model, background): queries not yet sent
        self._waiting: dict[tuple[str, bool], _QueryBatch] = {}
        self._deaths: list[float] = []
        self._closed = False
        self.started_at: float | None = None
        self.requests = 0
        self.last_error: str | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    async def embed(self, model: str, texts: list[str], *, query: bool,
                    background: bool = False) -> Any:
        """An (n, dim) float32 array of L2-normalised rows (one query: batched with the
        queries that wait beside it, see the module docstring). A ``background`` query (a
        turn's recall prefetch, which nobody waits for) is embedded at the worker's build
        priority, so under a CPU contest the turns being served go first."""
        if query and len(texts) == 1:
            return await self._query(model, texts[0], background)
        return self._vectors(await self.request(
            {"op": "embed", "model": model, "query": query, "texts": texts}), len(texts))

    @staticmethod
    def _vectors(reply: dict[str, Any], n: int) -> Any:
        np = numpy_module()
        return np.frombuffer(reply["data"], dtype=np.float32).reshape(n, int(reply["dim"]))

    async def _query(self, model: str, text: str, background: bool = False) -> Any:
        key = (model, background)
        while True:
            batch = self._waiting.get(key)
            if batch is not None and len(batch.texts) < MAX_QUERY_BATCH:
                i = len(batch.texts)
                batch.texts.append(text)
                await batch.done.wait()
                if batch.error is not None:
                    raise batch.error
                if batch.vectors is not None:
                    return batch.vectors[i:i + 1]
                continue  # its sender was cancelled before it went: try again
            batch = self._waiting[key] = _QueryBatch(text)
            try:
                async with self._lock:
                    if self._waiting.get(key) is batch:
                        del self._waiting[key]  # closed: later queries start the next one
                    texts = list(batch.texts)
                    reply = await self._exchange({"op": "embed", "model": model, "query": True,
                                                  "background": background, "texts": texts})
                batch.vectors = self._vectors(self._checked(reply), len(texts))
            except EmbedderUnavailable as exc:
                batch.error = exc
                raise
            finally:
                if self._waiting.get(key) is batch:
                    del self._waiting[key]
                batch.done.set()
            return batch.vectors[0:1]

    async def info(self, model: str) -> dict[str, Any]:
        return await self.request({"op": "info", "model": model})

    async def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            reply = await self._exchange(payload)
        return self._checked(reply)

    def _checked(self, reply: dict[str, Any]) -> dict[str, Any]:
        if not reply.get("ok"):
            self.last_error = str(reply.get("error"))
            raise EmbedderUnavailable(self.last_error, str(reply.get("kind") or "failed"))
        return reply

    async def _exchange(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply (the caller holds the lock)."""
        if self._closed:
            raise EmbedderUnavailable("the embedder is closed", "down")
        with anyio.CancelScope(shield=True):
            await self._ensure_started()
            assert self._proc is not None and self._proc.stdin is not None
            try:
                while self._owed:
                    await self._read()
                    self._owed -= 1
                body = msgspec.msgpack.encode(payload)
                await self._proc.stdin.send(HEADER.pack(len(body)) + body)
            except (anyio.BrokenResourceError, anyio.EndOfStream, anyio.ClosedResourceError,
                    anyio.IncompleteRead, OSError) as exc:
                await self._died(exc)
        self._owed += 1  # until its reply is read, by us or by the next request
        try:
            reply = await self._read()
        except (anyio.BrokenResourceError, anyio.EndOfStream, anyio.ClosedResourceError,
                anyio.IncompleteRead, OSError) as exc:
            with anyio.CancelScope(shield=True):
                await self._died(exc)
        self._owed -= 1
        self.requests += 1
        return reply

    async def _read(self) -> dict[str, Any]:
        assert self._reader is not None
        (size,) = HEADER.unpack(await self._reader.receive_exactly(HEADER.size))
        return msgspec.msgpack.decode(await self._reader.receive_exactly(size))

    async def _ensure_started(self) -> None:
        if self.running:
            return
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S]
        if len(self._deaths) >= 2:
            raise EmbedderUnavailable(
                f"the embedding worker died twice within {RESTART_WINDOW_S:.0f} s "
                f"({self.last_error}); retrying later", "down")
        env = dict(os.environ if self._env is None else self._env)
        env.setdefault("QWENCTXD_MODEL_CACHE", str(state_dir() / "models"))
        try:
            self._proc = await anyio.open_process(self._command, env=env,
                                                  stderr=None)
        except OSError as exc:
            self.last_error = f"could not start the embedding worker: {exc}"
            self._deaths.append(now)
            raise EmbedderUnavailable(self.last_error, "down") from None
        assert self._proc.stdout is not None
        self._reader = BufferedByteReceiveStream(self._proc.stdout)
        self._owed = 0
        self.started_at = time.time()
        log.info("embedding worker started", pid=self._proc.pid)

    async def _died(self, exc: BaseException) -> None:
        code = None
        if self._proc is not None:
            with anyio.move_on_after(1.0):
                code = await self._proc.wait()
            if code is None:
                self._proc.kill()
                with anyio.move_on_after(2.0):
                    await self._proc.wait()
        self._proc, self._reader, self._owed = None, None, 0
        self._deaths.append(time.monotonic())
        self.last_error = f"the embedding worker exited (code {code}): {type(exc).__name__}"
        log.warning("embedding worker died", code=code, error=type(exc).__name__)
        raise EmbedderUnavailable(self.last_error, "down") from None

    async def aclose(self) -> None:
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            if proc.stdin is not None:
                with anyio.move_on_after(1.0):
                    await proc.stdin.aclose()  # the worker leaves at end of input
            with anyio.move_on_after(2.0):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                with anyio.move_on_after(2.0):
                    await proc.wait()
