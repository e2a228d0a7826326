"""Wire types of ``model.probe`` (is the side-query model usable, and what does it accept?)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from qwenctxd.protocol.daemon import Params


class ProbeParams(Params):
    # per request shape; default: the endpoint's model.timeout_s (capped at 120 s)
    timeout_s: Annotated[float, Meta(gt=0, le=120)] | None = None


class ProbeShape(msgspec.Struct, kw_only=True):
    shape: str  # models | chat | stream | json_schema | json_object | tools
    status: str  # ok | failed | skipped
    reason: str | None = None
    ms: int | None = None


class ModelSources(msgspec.Struct, kw_only=True):
    """Which configuration source set each endpoint key (None: unset)."""

    base_url: str | None = None
    model: str | None = None
    fast_model: str | None = None
    api_key: str | None = None


class ProbeResult(msgspec.Struct, kw_only=True):
    configured: bool
    base_url: str | None
    model: str | None
    fast_model: str | None
    api_key_set: bool
    reachable: bool
    models: list[str] | None
    shapes: list[ProbeShape]
    sources: ModelSources
    config_files: list[str]
    config_error: str | None
