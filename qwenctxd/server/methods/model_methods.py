"""Handler of ``model.probe``: the configured endpoint tried shape by shape, with where each
setting came from (``qwenctl doctor`` shows it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import methods
from qwenctxd.protocol import model as wire
from qwenctxd.server.dispatch import handler

if TYPE_CHECKING:
    from qwenctxd.config import ConfigStore
    from qwenctxd.model import ModelClient
    from qwenctxd.server.connection import Connection


class ModelHandlers:
    def __init__(self, *, model: ModelClient, config: ConfigStore) -> None:
        self.model = model
        self.config = config

    @handler(methods.MODEL_PROBE)
    async def probe(self, ctx: Connection, p: wire.ProbeParams) -> wire.ProbeResult:
        from qwenctxd.config.sources import model_sources
        from qwenctxd.model.probe import probe as run_probe

        ep = self.model.endpoint
        r = await run_probe(ep, timeout_s=p.timeout_s or min(ep.timeout_s, 120.0))
        return wire.ProbeResult(
            configured=r.configured, base_url=r.base_url, model=r.model,
            fast_model=r.fast_model, api_key_set=r.api_key_set, reachable=r.reachable,
            models=r.models,
            shapes=[wire.ProbeShape(shape=s.shape, status=s.status, reason=s.reason, ms=s.ms)
                    for s in r.shapes],
            sources=wire.ModelSources(**model_sources(self.config)),
            config_files=[str(f) for f in self.config.files],
            config_error=self.config.last_error)
