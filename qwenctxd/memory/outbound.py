"""Memory text on its way out: redacted and escaped where it is rendered for a model or client.

A memory file a person wrote by hand was never scanned on its way in, so every place memory
text leaves the daemon — the recall reminder of ``session.turn``, ``memory.recall`` (and so MCP
``recall_memory``), the memory index of the system prompt (and so the proxy's upstream
request) — passes it through :class:`Outbound`: each secret becomes ``[redacted: <rule id>]``
(:func:`qwenctxd.secrets.redact`) and the text is escaped for the tagged block it rides in
(:func:`qwenctxd.tags.escape_in_tag`).

The rendering is cached per text content (a bounded LRU keyed by the string itself: memory
documents keep their string objects between re-scans, so a warm turn costs a dict lookup, not a
rescan). Every rendering that carried a redaction counts in ``daemon.status``
``secrets.redacted_out``.

``QWENCTXD_BENCH_NO_SECRET_GUARD=1`` in the daemon's environment turns the outbound redaction
off: it exists only for ``bench/secrets.py``'s same-run baseline and is never set otherwise.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from qwenctxd.memory import render
from qwenctxd.secrets import COUNTERS, redact
from qwenctxd.tags import escape_in_tag

__all__ = ["OUTBOUND", "Outbound", "SafeDoc", "render_outbound"]

MAX_CACHED = 4096
BYPASS_ENV = "QWENCTXD_BENCH_NO_SECRET_GUARD"


@dataclass
class SafeDoc:
    """A memory document's fields as they may leave the daemon (redacted, escaped)."""

    name: str
    description: str
    body: str
    type: str
    relative_path: str
    mtime: float
    keywords: tuple[str, ...]


class Outbound:
    def __init__(self, *, bypass: bool | None = None, max_cached: int = MAX_CACHED) -> None:
        self.bypass = os.environ.get(BYPASS_ENV) == "1" if bypass is None else bypass
        self._cache: OrderedDict[tuple[str, bool], tuple[str, int]] = OrderedDict()
        self._max = max_cached

    def _render(self, text: str, escape: bool) -> tuple[str, int]:
        key = (text, escape)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        red = redact(text)
        out = escape_in_tag(red.text) if escape else red.text
        value = (out, len(red.findings))
        self._cache[key] = value
        if len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return value

    def text(self, text: str, *, escape: bool = True) -> str:
        """``text`` redacted (and escaped for a tagged block unless ``escape=False``)."""
        if not text:
            return text
        if self.bypass:
            return escape_in_tag(text) if escape else text
        out, count = self._render(text, escape)
        COUNTERS.add("redacted_out", count)
        return out

    def doc(self, doc: Any) -> SafeDoc:
        return SafeDoc(name=self.text(doc.name), description=self.text(doc.description),
                       body=self.text(doc.body), type=doc.type,
                       relative_path=escape_in_tag(doc.relative_path),
                       mtime=doc.mtime, keywords=tuple(doc.keywords))


OUTBOUND = Outbound()


def render_outbound(docs: Any) -> str:
    """The "Relevant memory" block of ``docs`` as it may leave the daemon: every name,
    description and body redacted and escaped (the recall reminder and ``memory.recall``)."""
    return render.render([OUTBOUND.doc(d) for d in docs])
