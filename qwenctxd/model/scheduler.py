"""Foreground first: who may use a model endpoint right now.

A model server a user runs on a laptop (llama.cpp, Ollama) often has one slot: while it answers
one of the daemon's own side queries (a recall selector, an extraction agent's turn), the
user's agent waits behind it. One :class:`EndpointScheduler` per daemon keeps the daemon out of
the user's way on every endpoint it knows by base URL:

* **Foreground** is a request of the user's agent that the daemon knows about: a session that
  declared the server its agent talks to (``session.open`` ``model_base_url``; the proxy always
  does, naming its upstream) is *foreground* on that endpoint from the moment ``session.turn``
  hands it a prompt until ``session.record_model`` records the answer (or the session closes,
  or a time-to-live passes, for a client that never reports back).
* **Background** is every side query of a background feature (:data:`BACKGROUND_FEATURES`:
  extraction, dream, skill review, speculation, the recall selector, the project summary
  written at session end). It waits until its endpoint has no foreground request; when a foreground
  request begins, the background calls in flight on that endpoint are cancelled at once — their
  HTTP request is closed (a streamed side query makes the server stop generating) — and the
  caller gets :class:`~qwenctxd.protocol.errors.ModelUnavailable` with reason ``preempted``,
  which it handles as any other failure (an agent run rolls back; the next trigger runs it).
* Everything else (a compression the turn is waiting for, ``memory.recall`` asked by a person)
  neither waits nor is preempted.

Endpoints are compared by :func:`endpoint_key`: scheme, host (``localhost``, ``127.0.0.1``,
``::1`` and ``0.0.0.0`` are one host), port and path without a trailing slash.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import anyio
import structlog

__all__ = ["BACKGROUND_FEATURES", "EndpointScheduler", "Preempted", "endpoint_key",
           "is_loopback", "shares_local_server"]

log = structlog.get_logger(__name__)

#: features whose side queries yield to the user's own requests on the same endpoint
BACKGROUND_FEATURES: Final = frozenset({
    "extract", "dream", "skill_review", "speculation", "recall", "project_summary",
})
#: a foreground mark that is never ended (a client that crashed mid-request) lapses after this
DEFAULT_FOREGROUND_TTL_S: Final = 600.0
_LOOPBACK: Final = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "[::1]"})


def endpoint_key(base_url: str | None) -> str:
    """A comparable name for the server at ``base_url`` ("" for none)."""
    if not base_url:
        return ""
    return _endpoint_key(base_url)


@functools.lru_cache(maxsize=256)
def _endpoint_key(base_url: str) -> str:
    """(asked several times a turn of the same few URLs: parsed once each)"""
    try:
        parts = urlsplit(base_url.strip())
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return base_url.strip().rstrip("/").lower()
    if host in _LOOPBACK:
        host = "loopback"
    scheme = (parts.scheme or "http").lower()
    if port is None:
        port = 443 if scheme == "https" else 80
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def is_loopback(base_url: str | None) -> bool:
    """Whether ``base_url`` names a server on this machine."""
    return endpoint_key(base_url).split("://", 1)[-1].startswith("loopback:")


def shares_local_server(agent_base_url: str | None, side_base_url: str | None) -> bool:
    """Whether a session's agent and the daemon's side queries use one model server on this
    machine: a local server, often of one slot, where each side query waits behind the user's
    requests and evicts their cached prompt (the next request reads it all again)."""
    return bool(agent_base_url) and endpoint_key(agent_base_url) == endpoint_key(
        side_base_url) and is_loopback(side_base_url)


class Preempted(Exception):
    """A background call was cancelled because a foreground request began on its endpoint."""


@dataclass
class _Endpoint:
    #: foreground owners (a session id, a request) and the monotonic time each mark lapses
    owners: dict[Hashable, float] = field(default_factory=dict)
    #: set, then replaced, whenever the foreground set shrinks
    changed: anyio.Event | None = None
    running: set[_Background] = field(default_factory=set)


@dataclass(eq=False)
class _Background:
    scope: anyio.CancelScope
    preempted: bool = False


class EndpointScheduler:
    """Foreground marks and background admission per endpoint (see the module docstring)."""

    def __init__(self, *, foreground_ttl_s: float = DEFAULT_FOREGROUND_TTL_S) -> None:
        self._ttl = foreground_ttl_s
        self._endpoints: dict[str, _Endpoint] = {}
        self.preempted = 0
        self.waits = 0
        self.waited_s = 0.0

    # -- foreground ---------------------------------------------------------------------------
    def begin_foreground(self, base_url: str | None, owner: Hashable,
                         ttl_s: float | None = None) -> None:
        """Mark ``owner`` as a foreground request on ``base_url``; background calls in flight
        there are cancelled (preempted)."""
        key = endpoint_key(base_url)
        if not key:
            return
        ep = self._endpoints.setdefault(key, _Endpoint())
        ep.owners[owner] = time.monotonic() + (self._ttl if ttl_s is None else ttl_s)
        for bg in list(ep.running):
            if not bg.preempted:
                bg.preempted = True
                bg.scope.cancel()
                self.preempted += 1
                log.info("side_query_preempted", endpoint=key)

    def end_foreground(self, owner: Hashable) -> None:
        """``owner``'s request on whatever endpoint it marked is over."""
        for ep in self._endpoints.values():
            if ep.owners.pop(owner, None) is not None:
                self._changed(ep)

    def foreground(self, base_url: str | None) -> int:
        """How many foreground requests are open on ``base_url`` now."""
        ep = self._endpoints.get(endpoint_key(base_url))
        if ep is None:
            return 0
        self._purge(ep)
        return len(ep.owners)

    # -- background ---------------------------------------------------------------------------
    async def wait_idle(self, base_url: str | None, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until ``base_url`` has no foreground request; whether
        it is idle now."""
        ep = self._endpoints.get(endpoint_key(base_url))
        if ep is None:
            return True
        self._purge(ep)
        if not ep.owners:
            return True
        started = time.monotonic()
        deadline = started + max(0.0, timeout_s)
        self.waits += 1
        try:
            while True:
                self._purge(ep)
                if not ep.owners:
                    return True
                now = time.monotonic()
                if now >= deadline:
                    return False
                lapse = min(ep.owners.values())
                if ep.changed is None:
                    ep.changed = anyio.Event()
                with anyio.move_on_after(max(0.001, min(deadline, lapse) - now)):
                    await ep.changed.wait()
        finally:
            self.waited_s += time.monotonic() - started

    @asynccontextmanager
    async def background(self, base_url: str | None) -> AsyncIterator[None]:
        """Run the body as a background call on ``base_url``: a foreground request that begins
        meanwhile cancels it, and :class:`Preempted` is raised here."""
        key = endpoint_key(base_url)
        if not key:
            yield
            return
        ep = self._endpoints.setdefault(key, _Endpoint())
        bg = _Background(scope=anyio.CancelScope())
        ep.running.add(bg)
        try:
            with bg.scope:
                yield
        finally:
            ep.running.discard(bg)
        if bg.preempted and bg.scope.cancelled_caught:
            raise Preempted(key)

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """For ``daemon.status`` → ``model.scheduler``."""
        for ep in self._endpoints.values():
            self._purge(ep)
        return {
            "foreground": sum(len(ep.owners) for ep in self._endpoints.values()),
            "background_running": sum(len(ep.running) for ep in self._endpoints.values()),
            "preempted": self.preempted,
            "waits": self.waits,
            "waited_s": round(self.waited_s, 3),
        }

    # -- internals ----------------------------------------------------------------------------
    def _purge(self, ep: _Endpoint) -> None:
        now = time.monotonic()
        lapsed = [o for o, until in ep.owners.items() if until <= now]
        for o in lapsed:
            del ep.owners[o]
        if lapsed:
            self._changed(ep)

    @staticmethod
    def _changed(ep: _Endpoint) -> None:
        if ep.changed is not None:
            ep.changed.set()
            ep.changed = None

