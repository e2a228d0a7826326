"""Forget candidates without the model: rank memories by the request's terms, not one substring.

When the model is not configured, fails, or chooses nothing, ``memory.forget_candidates`` falls
back to :func:`term_candidates`: the request is split into recall tokens (CJK bigrams, words of
three characters or more), request words that carry no topic ("forget", "memory", "please", …)
are dropped, and a memory is a candidate when its name, description and body hold at least half
of the remaining terms (at least one). Best matches first, newest first among equals. A whole
request such as "forget what I said about tabs" therefore still finds the memory about tabs,
which a substring match of the full sentence never did. A request made only of words too short
to be terms (``"e"``) is matched as one substring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

from qwenctxd.memory.tokenize import normalize, tokens

__all__ = ["REQUEST_WORDS", "query_terms", "term_candidates"]

#: words of a forget request that say what to do, not which memory
REQUEST_WORDS = frozenset(
    "forget forgets forgot delete remove erase drop clear memory memories please about that "
    "this those these what said told the and any all you your from with saved remember "
    "note notes thing things stuff want would could should don't dont such some".split()
)


class ForgetDoc(Protocol):
    name: str
    description: str
    body: str
    mtime: float


D = TypeVar("D", bound=ForgetDoc)


def query_terms(query: str) -> list[str]:
    """The request's topic terms (recall tokens minus :data:`REQUEST_WORDS`)."""
    return [t for t in tokens(query) if t not in REQUEST_WORDS]


def term_candidates(query: str, docs: Sequence[D], *, limit: int) -> list[tuple[D, str]]:
    """``(doc, reason)`` for the docs matching enough of the request's terms (see module doc)."""
    terms = query_terms(query)
    if not terms:  # nothing but short words: the whole request as one needle, as before
        needle = " ".join(normalize(query).split())
        if not needle or tokens(query):
            return []
        return [(d, f"contains {query!r}") for d in sorted(docs, key=lambda d: -d.mtime)
                if needle in " ".join(normalize(" ".join([d.name, d.description, d.body])).split())
                ][:limit]
    need = max(1, math.ceil(len(terms) / 2))
    scored: list[tuple[int, float, D, list[str]]] = []
    for d in docs:
        hay = normalize(" ".join([d.name, d.description, d.body]))
        hits = [t for t in terms if t in hay]
        if len(hits) >= need:
            scored.append((len(hits), d.mtime, d, hits))
    scored.sort(key=lambda row: (-row[0], -row[1]))
    return [(d, "contains " + ", ".join(repr(t) for t in hits[:5]))
            for _, _, d, hits in scored[:limit]]
