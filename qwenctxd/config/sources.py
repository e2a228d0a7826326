"""Where a setting came from: the highest-precedence global layer that sets a key.

``model_sources(store)`` answers it for the model endpoint keys (base URL, model, fast model,
API key), which ``model.probe`` reports so a user can see why the model is or is not used:
``environment (OPENAI_BASE_URL)``, the config.toml path, the settings.json path (``model.name``
and ``fastModel`` count for the model names), or None (the built-in default: unset).
"""

from __future__ import annotations

from qwenctxd.config.layers import ENV_VARS, Layer
from qwenctxd.config.loader import ConfigStore

#: endpoint key -> the layer keys that set it (first match wins within one layer)
_KEYS: dict[str, tuple[str, ...]] = {
    "base_url": ("model_endpoint.base_url",),
    "api_key": ("model_endpoint.api_key",),
    "model": ("model_endpoint.model", "model.name"),
    "fast_model": ("model_endpoint.fast_model", "fastModel"),
}


def _describe(layer: Layer, key: str) -> str:
    if layer.kind == "env":
        section, _, name = key.partition(".")
        for var, where in ENV_VARS.items():
            if where == (section, name):
                return f"environment ({var})"
        return "environment"
    shown = "[model] " + key.split(".", 1)[1] if key.startswith("model_endpoint.") else key
    return f"{layer.source} ({shown})"


def model_sources(store: ConfigStore) -> dict[str, str | None]:
    """For each endpoint key, the source that sets it (None: nobody does).

    A non-env key in a lower layer is overridden by any higher layer setting the same
    endpoint key; ``model.name`` / ``fastModel`` only count when no layer sets the endpoint's
    own key (as ``Settings.endpoint()`` fills them in)."""
    layers = store.global_layers()
    out: dict[str, str | None] = {}
    for name, keys in _KEYS.items():
        found: str | None = None
        for key in keys:  # the endpoint's own key first, then the settings.json fallback
            for layer in reversed(layers):  # highest precedence first
                if layer.has(key):
                    found = _describe(layer, key)
                    break
            if found:
                break
        out[name] = found
    return out
