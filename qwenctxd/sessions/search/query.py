"""Session search queries: user text → one FTS5 MATCH string, and the snippet of a hit.

A query is plain words (every one must match: AND), ``"quoted phrases"`` (their words in
that order) and CJK text (a substring match: the index holds each CJK run as code-point
bigrams, :func:`qwenctxd.fts.fts_text`, and a CJK query chunk is the phrase of its bigrams).
Each word or phrase is put in the search form and quoted by :func:`qwenctxd.fts.quote_term`,
the one quoting rule, so nothing a user types is FTS5 syntax: ``OR``, ``NEAR(``, ``*``,
``-x``, ``col:x``, ``^`` are words like any other. A chunk with no letter or digit in it
(``*``, ``^``, ``-``) matches nothing and is dropped; a query of only such chunks matches
nothing (:attr:`SearchQuery.match` is None). A chunk ending in one CJK character matches the
bigrams that character starts (a prefix), so ``部`` finds ``部署``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from qwenctxd.fts import fts_text, is_cjk, normalize, quote_term

MAX_QUERY_CHARS = 2000  # the rest of a longer query is ignored (cut at a space)
MAX_TERMS = 32  # words and phrases; later ones are ignored
SNIPPET_CHARS = 300
SNIPPET_BEFORE = 80  # context kept before the first match

_PHRASE = re.compile(r'"([^"]*)"')
_WORDLIKE = re.compile(r"\w")
_SPACE = re.compile(r"\s+")


class SearchQuery(NamedTuple):
    match: str | None  # the FTS5 MATCH string; None: the query can match nothing
    needles: list[str]  # the words and phrases, normalised, to place a snippet


def _term(chunk: str) -> str | None:
    form = fts_text(chunk).split()
    if not any(_WORDLIKE.search(t) for t in form):
        return None
    quoted = quote_term(" ".join(form))
    last = form[-1]
    return quoted + "*" if len(last) == 1 and is_cjk(last) else quoted


def parse(text: str) -> SearchQuery:
    """The MATCH string for ``text`` (see the module docstring) and its needles."""
    if len(text) > MAX_QUERY_CHARS:  # cut at a space, so no word is cut in two
        head = text[:MAX_QUERY_CHARS]
        text = head if text[MAX_QUERY_CHARS].isspace() or not head.split() \
            else head.rsplit(maxsplit=1)[0] if len(head.split()) > 1 else head
    chunks: list[str] = []
    pos = 0
    for m in _PHRASE.finditer(text):
        chunks.extend(text[pos:m.start()].split())
        if m.group(1).strip():
            chunks.append(m.group(1))
        pos = m.end()
    chunks.extend(text[pos:].replace('"', " ").split())  # an unbalanced quote is a space
    terms: list[str] = []
    needles: list[str] = []
    for chunk in chunks:
        term = _term(chunk)
        if term is None or term in terms:
            continue
        terms.append(term)
        needles.append(_SPACE.sub(" ", normalize(chunk)).strip())
        if len(terms) == MAX_TERMS:
            break
    return SearchQuery(" AND ".join(terms) if terms else None, needles)


def snippet(text: str, needles: list[str], *, width: int = SNIPPET_CHARS) -> str:
    """At most ``width`` characters of ``text`` (whitespace runs as one space) around the
    first place a needle occurs (the start when none is found as written), ``…`` where cut."""
    flat = _SPACE.sub(" ", text).strip()
    if len(flat) <= width:
        return flat
    low = flat.lower()
    found = [i for i in (low.find(n) for n in needles if n) if i >= 0]
    first = min(found) if found else 0
    start = max(0, first - SNIPPET_BEFORE)
    head = "…" if start > 0 else ""
    room = width - len(head)
    body = flat[start:start + room]
    if start + room < len(flat):
        body = body[:room - 1] + "…"
    return head + body
