"""Which context window a session is sized for, and where that number came from.

One precedence, used by ``session.open`` (fresh and resumed alike):

1. ``client``   — the client's own ``window_tokens`` (an agent that knows its model; the proxy
   sends the window it learned from its upstream, with ``window_source: "upstream"``);
2. the window recorded in the session file, when a client chose it the last time (a resumed
   session keeps what its client asked for; a recorded *default* does not pin the window, so
   a later config change sizes the resumed session);
3. ``settings`` — Qwen Code's ``model.generationConfig.contextWindowSize`` (settings.json, the
   user's or the project's): Qwen Code's own word for the agent model's window;
4. ``config``   — ``[model] context_window`` in config.toml (the daemon's model endpoint; the
   one setting a llama.cpp user sets, README "A local model");
5. ``default``  — 131 072 tokens.

The source is recorded beside the window (``windowSource`` in the options record), answered by
``session.open`` and ``session.context``, and shown by ``qwenctl context``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from qwenctxd.config.schema import Settings

__all__ = ["DEFAULT_WINDOW", "WINDOW_SOURCES", "WindowSource", "session_window"]

DEFAULT_WINDOW: Final = 131_072
WindowSource = Literal["client", "upstream", "config", "settings", "default"]
WINDOW_SOURCES: Final = ("client", "upstream", "settings", "config", "default")
#: sources a client chose; a resumed session keeps a window that came from one of these
_CHOSEN: Final = frozenset({"client", "upstream"})


def session_window(window_tokens: int | None, window_source: str | None,
                   saved: Mapping[str, Any], settings: Settings) -> tuple[int, WindowSource]:
    """The window for a session being opened and where it came from (see the module doc).

    ``window_tokens``/``window_source`` are the client's ``session.open`` params, ``saved`` the
    options recorded in the session file (empty for a new session).
    """
    if window_tokens:
        return window_tokens, "upstream" if window_source == "upstream" else "client"
    recorded = saved.get("windowTokens")
    recorded_source = saved.get("windowSource")
    # files written before the source was recorded: the window was the client's or a default;
    # only a non-default value is taken as the client's choice
    if recorded_source is None and isinstance(recorded, int) and recorded != DEFAULT_WINDOW:
        recorded_source = "client"
    if isinstance(recorded, int) and recorded >= 256 and recorded_source in _CHOSEN:
        return recorded, recorded_source
    qwen = settings.model.generation_config.context_window_size
    if qwen and qwen >= 256:
        return qwen, "settings"
    configured = settings.model_endpoint.context_window
    if configured:
        return configured, "config"
    return DEFAULT_WINDOW, "default"
