"""Lexical recall: an SQLite FTS5 (BM25) index of the memory documents, and the seed's scoring.

:class:`LexicalIndex` keeps one SQLite file in step with a set of memory documents
(:meth:`~LexicalIndex.sync` — insert / update / delete in one transaction, unchanged documents,
keyed by path and ``(mtime, size)``, are not rewritten) and answers
:meth:`~LexicalIndex.search` with ONE ``SELECT … MATCH … ORDER BY … LIMIT`` per query.

Layout::

    docs(id INTEGER PRIMARY KEY, path TEXT UNIQUE, scope, type, mtime, size)
    docs_fts USING fts5(title, description, keywords, body,
                        tokenize='unicode61 remove_diacritics 2')   -- rowid = docs.id

(``id`` is an explicit integer key, not the implicit rowid of a ``path PRIMARY KEY`` table:
``VACUUM`` may renumber implicit rowids, which would silently detach the FTS rows.)

Chinese (and Japanese, Korean): ``unicode61`` indexes a whole Han run as ONE token, and the
trigram tokenizer cannot match two-character words (see the reference's FTS5/CJK addendum).
The index therefore never sees raw CJK runs: every column is stored in its *search form*
(:func:`~qwenctxd.memory.tokenize.fts_text`: NFKC, lower-case, each CJK run replaced by its
space-separated code-point bigrams), and a query's CJK tokens are those same bigrams. Putting
the bigrams in the column they come from (rather than in one extra ``cjk`` column) lets a
Chinese title match weigh as much as an English one, and splits ``用pytest跑测试`` into
``用 pytest 跑测 测试`` (``unicode61`` alone would read one token). On bench/recall_set the
two layouts score the same (MRR@10 0.871 vs 0.872 with a separate ``cjk`` column weighted 2);
the glued-Latin case is covered by a test instead. A one-character CJK query token (a
one-character run) is a prefix query (``"改"*``) so it meets the bigrams it starts.

No Porter stemming. Instead a non-CJK query token of at least 5 characters is a prefix query
(``"deploy"*`` finds ``deployment``, ``"migration"*`` finds ``migrations``), which is the seed's
substring match in the forward direction, without Porter's over-conflation (``general`` /
``generate`` → ``gener``). On bench/recall_set this scored hit@5 0.985 / MRR@10 0.887 against
0.971 / 0.871 with Porter (the same p50 at 10 000 documents) — a difference of a few queries,
so the reason to choose it is the semantics; the numbers only say it does not hurt.

Query: the tokens of :func:`~qwenctxd.memory.tokenize.tokens` minus a short stop-word list
(kept when nothing else remains; it makes a typical query 2.5× faster at 10 000 documents and
moves the set's MRR@10 by less than 0.01), each double-quoted (``"`` doubled) and OR'ed, so user text
can never inject FTS5 syntax (``OR``, ``NEAR(``, ``*``, ``:``, ``^`` are plain text).
Score = ``-bm25(docs_fts, 4, 3, 4, 1)`` (title, description, keywords, body — the seed's
+4 / +3 / +4 / +1) plus ``TYPE_BOOST × min(#query tokens in TYPE_KEYWORDS[type], 2)``;
ties go to the newer document.

:func:`seed_score_search` is the seed's linear scan (the benchmark's baseline): for every
document, +2 per query token found in it (substring of its title, description, keywords or
body), +1 when a query token is one of the document type's topic keywords
(``TYPE_KEYWORDS[type]`` — the "topic keyword table"), +1 for a non-empty body; a document
without any token hit scores 0 and is dropped; score desc, then mtime desc.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import aiosqlite
import anyio
import anyio.to_thread

from qwenctxd.fts import quote_term as _quote
from qwenctxd.memory.tokenize import fts_text, is_cjk, normalize, tokens
from qwenctxd.store.sqlite import CacheDatabase

SCHEMA_VERSION = 1
# bm25 column weights: title, description, keywords, body (the seed's +4 / +3 / +4 / +1)
WEIGHTS = (4.0, 3.0, 4.0, 1.0)
PREFIX_MIN = 5  # non-CJK query tokens this long match as prefixes
TIE_SLACK = 32  # rows past the limit the fast query ranks, for equal scores (see _select)
TYPE_BOOST = 1.0  # per query token that is a topic keyword of the doc's type, at most 2
OPTIMIZE_AFTER = 1000  # merge the FTS segments after a sync that wrote this many rows
EMPTY_BODY = "_No entries yet._"

TYPE_KEYWORDS: dict[str, frozenset[str]] = {
    "user": frozenset({"user", "preference", "preferences", "background", "role", "terse"}),
    "feedback": frozenset({"feedback", "rule", "rules", "avoid", "style", "summary"}),
    "project": frozenset({"project", "goal", "goals", "incident", "deadline", "release"}),
    "reference": frozenset({"reference", "dashboard", "ticket", "docs", "doc", "link"}),
}

# Function words (≥ 3 letters: shorter ones never become tokens) and the commonest Chinese
# function bigrams. They match most documents, so they cost the most time and add the least
# ranking signal; a query made only of them keeps them.
STOP_WORDS = frozenset(
    """
    about above after again against all also and any are aren't because been before being
    below between both but can cannot could did does doing don during each few for from
    further had has have having her here hers herself him himself his how into its itself
    just let more most mustn myself nor not now once only other ought our ours ourselves
    over own same she should some such than that the their theirs them themselves then
    there these they this those through too under until upon very was wasn were weren what
    when where which while who whom why will with won would you your yours yourself
    yourselves please thanks thank want need like sure
    一个 这个 那个 我们 你们 他们 什么 怎么 可以 没有 就是 还是 如果 因为 所以 但是 然后
    这样 那样 时候 的话 是不 不是 一下 一些 有没 这些 那些 之前 之后 现在 应该 需要
    """.split()
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    id    INTEGER PRIMARY KEY,
    path  TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL,
    type  TEXT NOT NULL,
    mtime NOT NULL,  -- no affinity: compared as given (float seconds, or int ns)
    size  INTEGER NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS docs_fts USING fts5(
    title, description, keywords, body,
    tokenize = 'unicode61 remove_diacritics 2'
);
"""
_INSERT_FTS = (
    "INSERT INTO docs_fts(rowid, title, description, keywords, body) "
    "VALUES ((SELECT id FROM docs WHERE path = ?), ?, ?, ?, ?)"
)


class DocLike(Protocol):
    """What the index needs of a memory document (``store.MemoryDoc`` is one)."""

    @property
    def path(self) -> str | os.PathLike[str]: ...
    @property
    def scope(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def mtime(self) -> float: ...
    @property
    def size(self) -> int: ...
    @property
    def keywords(self) -> Sequence[str]: ...


class Hit(NamedTuple):
    path: str  # str(doc.path)
    score: float


class SyncStats(NamedTuple):
    docs: int  # documents in the set
    added: int
    updated: int
    removed: int


def _body(doc: DocLike) -> str:
    body = doc.body.strip()
    return "" if body == EMPTY_BODY else body


def _fts_row(doc: DocLike) -> tuple[str, str, str, str, str]:
    return (
        str(doc.path),
        fts_text(doc.name),
        fts_text(doc.description),
        fts_text(" ".join(doc.keywords)),
        fts_text(_body(doc)),
    )


def query_terms(query: str) -> list[str]:
    """The query's recall tokens minus stop words (all of them if only stop words remain)."""
    toks = tokens(query)
    kept = [t for t in toks if t not in STOP_WORDS]
    return kept or toks


def match_expression(terms: Iterable[str]) -> str:
    """An FTS5 MATCH string that ORs every term as a quoted string (never FTS syntax).

    A lone CJK character (a one-character run) matches the bigrams it starts; a non-CJK term
    of at least ``PREFIX_MIN`` characters matches as a prefix; the rest match exactly."""
    parts = []
    for t in terms:
        cjk = is_cjk(t)
        prefix = len(t) == 1 if cjk else len(t) >= PREFIX_MIN
        parts.append(_quote(t) + "*" if prefix else _quote(t))
    return " OR ".join(parts)


_WORD = re.compile(r"[\w./:#-]+")
_CAMEL = re.compile(r"[a-z][A-Z]")
MAX_IDENTIFIERS = 8


def identifiers(query: str) -> list[list[str]]:
    """The query's words that name something exactly — with a digit and a letter
    (``marker0152``, ``v2``), a ``_``, camelCase, a ``.`` or ``/`` inside, or three digits or
    more (``#1234``) — each as its recall tokens. An embedder cannot tell ``marker0151`` from
    ``marker0152``; the lexical tier can, and recall lets such a match decide."""
    out: list[list[str]] = []
    for word in _WORD.findall(query):
        w = word.strip("./:#-")
        named = ((any(c.isdigit() for c in w) and any(c.isalpha() for c in w))
                 or "_" in w.strip("_") or bool(_CAMEL.search(w))
                 or any(sep in w for sep in "./")
                 or (w.isdigit() and len(w) >= 3))
        toks = tokens(w) if named else []
        if toks and toks not in out:
            out.append(toks)
        if len(out) >= MAX_IDENTIFIERS:
            break
    return out


def type_boosts(query_tokens: Iterable[str]) -> dict[str, float]:
    """``{type: TYPE_BOOST × min(#tokens in TYPE_KEYWORDS[type], 2)}`` for the non-zero ones."""
    toks = set(query_tokens)
    out = {}
    for typ, words in TYPE_KEYWORDS.items():
        n = min(len(toks & words), 2)
        if n:
            out[typ] = TYPE_BOOST * n
    return out


class LexicalIndex(CacheDatabase):
    """An FTS5 index of memory documents in one SQLite file (WAL, synchronous=NORMAL).

    One aiosqlite connection (one thread); every statement is serialised by a lock so a search
    never sees half a sync. A file that is not a SQLite database is moved aside
    (``<name>.corrupt-<ts>``) and the index rebuilt by the next :meth:`sync` — it is a cache.
    """

    SCHEMA = _SCHEMA
    SCHEMA_VERSION = SCHEMA_VERSION
    TABLES = ("docs_fts", "docs")

    async def count(self) -> int:
        rows = await self._conn().execute_fetchall("SELECT count(*) FROM docs")
        return int(rows[0][0])

    async def sync(self, docs: Sequence[DocLike]) -> SyncStats:
        """Make the index hold exactly ``docs`` (by ``str(path)``; the last of duplicates wins).

        A document whose path is indexed with the same ``(mtime, size)`` is left alone; new
        ones are inserted, changed ones rewritten, the others deleted — one transaction.
        """
        db = self._conn()
        assert self._lock is not None
        want: dict[str, DocLike] = {str(d.path): d for d in docs}
        async with self._lock:
            rows = await db.execute_fetchall("SELECT path, id, mtime, size FROM docs")
            have = {r[0]: (r[1], r[2], r[3]) for r in rows}
            new = [d for p, d in want.items() if p not in have]
            changed = [(have[p][0], d) for p, d in want.items()
                       if p in have and (have[p][1], have[p][2]) != (d.mtime, d.size)]
            gone = [(v[0],) for p, v in have.items() if p not in want]
            if not (new or changed or gone):
                return SyncStats(len(want), 0, 0, 0)
            todo = [*new, *(d for _, d in changed)]
            if len(todo) > 64:  # NFKC + bigrams of many bodies: off the event loop
                fts_rows = await anyio.to_thread.run_sync(lambda: [_fts_row(d) for d in todo])
            else:
                fts_rows = [_fts_row(d) for d in todo]
            try:
                stale = gone + [(i,) for i, _ in changed]
                if stale:
                    await db.executemany("DELETE FROM docs_fts WHERE rowid = ?", stale)
                if gone:
                    await db.executemany("DELETE FROM docs WHERE id = ?", gone)
                if changed:
                    await db.executemany(
                        "UPDATE docs SET scope = ?, type = ?, mtime = ?, size = ? WHERE id = ?",
                        [(d.scope, d.type, d.mtime, d.size, i) for i, d in changed],
                    )
                if new:
                    await db.executemany(
                        "INSERT INTO docs(path, scope, type, mtime, size) VALUES (?, ?, ?, ?, ?)",
                        [(str(d.path), d.scope, d.type, d.mtime, d.size) for d in new],
                    )
                await db.executemany(_INSERT_FTS, fts_rows)
                await db.commit()
            except BaseException:
                with anyio.CancelScope(shield=True):  # queued after the statements above
                    await db.rollback()
                raise
            if len(todo) + len(gone) >= OPTIMIZE_AFTER:
                await db.execute("INSERT INTO docs_fts(docs_fts) VALUES ('optimize')")
                await db.commit()
        return SyncStats(len(want), len(new), len(changed), len(gone))

    async def search(self, query: str, *, scopes: Iterable[str] | None = None, limit: int = 5,
                     exclude: Iterable[str] = ()) -> list[Hit]:
        """The ``limit`` best documents for ``query``, best first (empty without tokens).

        ``scopes`` keeps only documents of those scopes; ``exclude`` drops those paths.
        """
        toks = tokens(query)
        terms = query_terms(query)
        if not terms or limit <= 0:
            return []
        sql, args = self._select(terms, type_boosts(toks), scopes, [str(p) for p in exclude],
                                 limit)
        db = self._conn()
        assert self._lock is not None
        async with self._lock:
            rows = await db.execute_fetchall(sql, args)
        return [Hit(r[0], float(r[1])) for r in rows]

    async def naming(self, groups: Sequence[Sequence[str]], paths: Iterable[str]) -> dict[str, int]:
        """Of ``paths``, how many of the identifier ``groups`` (:func:`identifiers`) each
        document contains, each group as a phrase of its tokens; documents with none left out."""
        want = list(dict.fromkeys(str(p) for p in paths))
        if not groups or not want:
            return {}
        db = self._conn()
        assert self._lock is not None
        counts: dict[str, int] = {}
        marks = ", ".join("?" * len(want))
        async with self._lock:
            for group in groups:
                phrase = " + ".join(_quote(t) for t in group)
                rows = await db.execute_fetchall(
                    f"SELECT d.path FROM docs_fts JOIN docs d ON d.id = docs_fts.rowid "
                    f"WHERE docs_fts MATCH ? AND d.path IN ({marks})", [phrase, *want])
                for (path,) in rows:
                    counts[path] = counts.get(path, 0) + 1
        return counts

    # -- internals --------------------------------------------------------------------------------

    @staticmethod
    def _select(terms: list[str], boosts: dict[str, float], scopes: Iterable[str] | None,
                exclude: list[str], limit: int) -> tuple[str, list[Any]]:
        w = ", ".join(repr(x) for x in WEIGHTS)
        args: list[Any] = []
        if not boosts and scopes is None:
            # the common case: rank inside FTS5 first and join only the top rows (10 000
            # memories, ~2 000 matches a query: 5.3 -> 3.7 ms); the inner list is long enough
            # for the excluded paths and for ties on the score (newest first, as below)
            args = [match_expression(terms), limit + len(exclude) + TIE_SLACK]
            skip = ""
            if exclude:
                skip = f"WHERE d.path NOT IN ({', '.join('?' * len(exclude))}) "
                args += exclude
            args.append(limit)
            sql = (f"SELECT d.path, t.score FROM (SELECT rowid AS id, -bm25(docs_fts, {w}) "
                   f"AS score FROM docs_fts WHERE docs_fts MATCH ? ORDER BY score DESC "
                   f"LIMIT ?) t JOIN docs d ON d.id = t.id {skip}"
                   f"ORDER BY t.score DESC, d.mtime DESC LIMIT ?")
            return sql, args
        if boosts:
            whens = " ".join("WHEN ? THEN ?" for _ in boosts)
            score = f"-bm25(docs_fts, {w}) + (CASE d.type {whens} ELSE 0 END)"
            for typ, b in boosts.items():
                args += [typ, b]
        else:
            score = f"-bm25(docs_fts, {w})"
        where = ["docs_fts MATCH ?"]
        args.append(match_expression(terms))
        if scopes is not None:
            sc = list(scopes)
            if not sc:
                where.append("0")
            where.append(f"d.scope IN ({', '.join('?' * len(sc))})")
            args += sc
        if exclude:
            where.append(f"d.path NOT IN ({', '.join('?' * len(exclude))})")
            args += exclude
        args.append(limit)
        sql = (f"SELECT d.path, {score} AS score FROM docs_fts JOIN docs d ON d.id = "
               f"docs_fts.rowid WHERE {' AND '.join(where)} "
               f"ORDER BY score DESC, d.mtime DESC LIMIT ?")
        return sql, args

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("LexicalIndex is not open")
        return self._db

# -- the baseline: the seed's linear scan -----------------------------------------------------------


def seed_score(query_tokens: Sequence[str], doc: DocLike) -> int:
    """The seed's ``scoreDocument``: +2 per query token in the document (substring of its
    normalised title, description, keywords or body), +1 if a query token is a topic keyword
    of its type (``TYPE_KEYWORDS[type]``), +1 for a non-empty body; 0 without a token hit."""
    body = _body(doc)
    hay = normalize("\n".join((doc.name, doc.description, " ".join(doc.keywords), body)))
    hits = sum(1 for t in query_tokens if t in hay)
    if hits == 0:
        return 0
    topic = 1 if any(t in TYPE_KEYWORDS.get(doc.type, ()) for t in query_tokens) else 0
    return 2 * hits + topic + (1 if body else 0)


def seed_score_search(docs: Sequence[DocLike], query: str, limit: int = 5) -> list[Hit]:
    """Rank ``docs`` for ``query`` by :func:`seed_score` — a linear scan that normalises every
    document on every query, as the seed does. Score desc, then mtime desc, then input order."""
    toks = tokens(query)
    if not toks:
        return []
    scored = [(s, d) for d in docs if (s := seed_score(toks, d)) > 0]
    scored.sort(key=lambda sd: (-sd[0], -sd[1].mtime))
    return [Hit(str(d.path), float(s)) for s, d in scored[:limit]]
