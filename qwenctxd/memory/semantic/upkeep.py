"""Keeping every project's vectors in step, and the daemon's view of the embedders.

One embedding worker per daemon, started on first use. Each project's
:class:`~qwenctxd.memory.semantic.tier.SemanticIndex` is synced by a background job (one per
project at a time, a newer request replacing a queued one) whenever its memory documents change
— the same re-sync that keeps the lexical index in step schedules it — so recall never embeds a
corpus inline: it waits a bounded time for a sync in flight, then ranks with the vectors there
are (a tier not ready says ``late``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.memory.semantic import embedders as embedder_set
from qwenctxd.memory.semantic.process import EmbedderProcess
from qwenctxd.memory.semantic.tier import Doc, SemanticIndex
from qwenctxd.memory.semantic.vectors import VectorCache
from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.memory.semantic")
BACKGROUND_RANK_S = 5.0  # the longest a background query's ranking may take
VECTORS_FILENAME = "recall-vectors.sqlite"


@dataclass
class _Slot:
    index: SemanticIndex
    config: Any
    opened: bool = False
    wanted: int = -1  # the newest generation a sync was asked for
    done: anyio.Event = field(default_factory=anyio.Event)  # set when ``wanted`` is synced


class SemanticUpkeep:
    def __init__(self, tasks: TaskRegistry, *, environ: Mapping[str, str] | None = None,
                 packaged: tuple[str, ...] = embedder_set.PACKAGED,
                 process: EmbedderProcess | None = None) -> None:
        self._tasks = tasks
        self._environ = environ
        self._packaged = packaged
        self.process = process or EmbedderProcess()
        self._slots: dict[Path, _Slot] = {}
        self._embedders: dict[Any, list[Any]] = {}
        self.syncs = 0
        self.last_sync_at: float | None = None

    def _embedders_for(self, config: Any) -> list[Any]:
        key = config  # an unhashable settings struct is keyed by its repr
        try:
            hash(key)
        except TypeError:
            key = repr(config)
        found = self._embedders.get(key)
        if found is None:
            found = self._embedders[key] = embedder_set.build(
                config, self.process, packaged=self._packaged, environ=self._environ)
        return found

    def slot(self, key: Path, db_dir: Path, config: Any) -> _Slot:
        s = self._slots.get(key)
        if s is None or s.config != config:
            cache = s.index.cache if s is not None else VectorCache(db_dir / VECTORS_FILENAME)
            s = self._slots[key] = _Slot(
                SemanticIndex(cache, self._embedders_for(config)), config,
                opened=s.opened if s is not None else False)
        return s

    def request_sync(self, key: Path, db_dir: Path, config: Any,
                     docs: Callable[[], tuple[Sequence[Doc], int]]) -> _Slot:
        """Schedule a sync of ``key``'s vectors to what ``docs()`` returns when the job runs."""
        s = self.slot(key, db_dir, config)
        _, generation = docs()
        if s.index.current(generation):
            return s
        if generation != s.wanted:
            s.wanted = generation
            if s.done.is_set():
                s.done = anyio.Event()
        if not self._tasks.accepting:
            return s

        async def job() -> None:
            current = self._slots.get(key)
            if current is None:
                return
            if not current.opened:
                await current.index.cache.open()
                current.opened = True
                if current.index.cache.set_aside is not None:
                    log.warning("vector cache was corrupt: rebuilding",
                                set_aside=str(current.index.cache.set_aside))
            texts, gen = docs()
            try:
                await current.index.sync(texts, gen)
            finally:
                self.syncs += 1
                self.last_sync_at = time.time()
                if current.wanted <= gen:
                    current.done.set()

        self._tasks.submit("memory-embed", job, key=f"memory-embed:{key}", project=str(key))
        return s

    async def rank(self, key: Path, query: str, *, generation: int, wait_s: float, limit: int,
                   exclude: set[str], related: dict[str, float] | None = None,
                   background: bool = False,
                   ) -> tuple[dict[str, list[tuple[str, float]]], str | None]:
        """Per embedder (path, cosine) lists, and why the tier is not (fully) there, if so;
        ``related``: see :meth:`SemanticIndex.rank`."""
        s = self._slots.get(key)
        if s is None:
            return {}, "not_built"
        if not s.index.current(generation):
            with anyio.move_on_after(wait_s):
                await s.done.wait()
        reason = None if s.index.current(generation) else "building"
        try:
            # a background query (a turn's prefetch) may wait its turn behind the work being
            # served: nobody waits for it, the next turn delivers it
            with anyio.fail_after(BACKGROUND_RANK_S if background else max(wait_s, 0.5)):
                ranked, failed = await s.index.rank(query, limit=limit, exclude=exclude,
                                                    related=related, background=background)
        except TimeoutError:
            return {}, "late"
        if failed:
            reason = "; ".join(f"{k} failed: {v}" for k, v in sorted(failed.items()))
        if not ranked:
            errors = [st.error for st in s.index.states.values() if st.error]
            return {}, (reason if failed else f"failed: {errors[0]}" if errors
                        else reason or "not_built")
        return ranked, reason

    def status(self) -> dict[str, Any]:
        """``daemon.status`` ``memory``: ``embedder`` (the one recall ranks with first: an
        endpoint or local model when configured, else the first packaged one), ``embedders``
        (each with its vectors over every project and its last build), ``worker``."""
        models: dict[str, dict[str, Any]] = {}
        for s in self._slots.values():
            for emb in s.index.embedders:
                st = s.index.states.get(emb.key)
                name = st.model if st is not None and st.model else emb.key
                entry = models.setdefault(name, {"model": name, "source": emb.source,
                                                 "vectors": 0, "built_at": None})
                if st is None:
                    continue
                entry["vectors"] += st.vectors
                if st.built_at is not None:
                    entry["built_at"] = max(entry["built_at"] or 0.0, st.built_at)
                if st.error:
                    entry["error"] = st.error
        listed = list(models.values()) or [
            {"model": name, "source": "packaged", "vectors": 0, "built_at": None}
            for name in self._packaged]
        primary = next((m for m in listed if m["source"] != "packaged" and not m.get("error")),
                       listed[0] if listed else None)
        return {"embedder": primary, "embedders": listed,
                "worker": {"pid": self.process.pid, "requests": self.process.requests,
                           "last_error": self.process.last_error},
                "syncs": self.syncs, "last_sync_at": self.last_sync_at}

    def has(self, key: Path) -> bool:
        return key in self._slots

    def forget(self, key: Path) -> None:
        self._slots.pop(key, None)

    async def aclose(self) -> None:
        for s in list(self._slots.values()):
            await s.index.cache.close()
        for found in self._embedders.values():
            for emb in found:
                endpoint = getattr(emb, "endpoint", None)
                if endpoint is not None:
                    await endpoint.aclose()
        await self.process.aclose()
