"""Text for SQLite FTS5: tokenization and the one quoting rule, shared by every FTS index.

Used by memory recall (``memory/lexical.py``) and by session search (``sessions/search/``).
:func:`quote_term` is the only place user text becomes part of an FTS5 MATCH string.

Tokenization, as Qwen Code's ``memory/recall.ts`` does it (reference §3.7):

* Text is NFKC-normalised and lower-cased.
* A run of CJK characters (Han, Hiragana, Katakana, Hangul) becomes its code-point
  **bigrams** (``部署流程`` → ``部署 署流 流程``); a one-character run yields no query token
  (upstream treats it as noise: a query of ``部``, ``認`` or ``배`` recalls nothing).
* Any other run of letters, combining marks and digits is a token when it is at least
  3 characters long (``go``, ``ci`` are dropped); ``_``, ``-`` and punctuation split runs.
* :func:`tokens` keeps at most 64 distinct tokens: the first 32 distinct (head) and the
  last 32 distinct of the rest (tail, LRU: a repeated tail token moves to the end).

One deliberate difference from upstream, a small one:

* Upstream's CJK class is ``\\p{Script_Extensions=Katakana}``, which also contains CJK
  punctuation (``、。「」【】・`` …), so ``部署。然后`` yields the bigrams ``署。`` and ``。然``.
  Here punctuation splits CJK runs: such bigrams match nothing useful, and SQLite's
  ``unicode61`` tokenizer (the FTS index) would split them anyway.

The indexed side (:func:`fts_text`, :func:`cjk_bigrams`) still keeps a one-character run as a
unigram; it only matters to a query token, and queries no longer produce one.

Python's ``re`` has no ``\\p{Script=…}``: the CJK class is spelled as code-point ranges and
the combining-mark class is built once (lazily) from :mod:`unicodedata` over the BMP.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterator

MAX_QUERY_TOKENS = 64

# Letters of the four scripts (no punctuation): Han (radicals, 々〆〇, Hangzhou numerals,
# unified + extensions + compatibility), Hiragana (+ voiced marks, ゟ), Katakana (+ ー, ヿ,
# phonetic extensions, kana supplements), Hangul (jamo, compatibility jamo, syllables).
_CJK_RANGES = (
    "\u2e80-\u2eff\u2f00-\u2fdf\u3005-\u3007\u3021-\u3029\u3038-\u303b"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\U00020000-\U0002fa1f\U00030000-\U000323af"
    "\u3041-\u3096\u3099-\u30a0"
    "\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff\u32d0-\u32fe\u3300-\u3357\uff66-\uff9f"
    "\U0001aff0-\U0001b16f"
    "\u1100-\u11ff\u3131-\u318e\ua960-\ua97f\uac00-\ud7a3\ud7b0-\ud7ff\uffa0-\uffdc"
)
CJK_CHAR = f"[{_CJK_RANGES}]"
_CJK_RUN = re.compile(f"{CJK_CHAR}+")
_CJK_ONE = re.compile(CJK_CHAR)


def _ranges(chars: list[int]) -> str:
    out: list[str] = []
    start = prev = chars[0]
    for c in chars[1:] + [-2]:
        if c == prev + 1:
            prev = c
            continue
        out.append(re.escape(chr(start)) + ("" if prev == start else "-" + re.escape(chr(prev))))
        start = prev = c
    return "".join(out)


@functools.cache
def _token_run() -> re.Pattern[str]:
    """``CJK+ | [L N][L M N]{2,}`` with CJK excluded from the second alternative.

    ``[^\\W_…]`` is "a letter or digit that is not CJK"; the continuation adds the
    combining marks (``\\p{M}``, BMP), which ``\\w`` lacks (Devanagari vowel signs …).
    """
    marks = [c for c in range(0x300, 0x10000) if unicodedata.category(chr(c))[0] == "M"]
    word = f"[^\\W_{_CJK_RANGES}]"
    cont = f"(?:{word}|[{_ranges(marks)}])"
    return re.compile(f"(?P<cjk>{CJK_CHAR}+)|{word}{cont}{{2,}}")


def normalize(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()


def _bigrams(run: str) -> Iterator[str]:
    if len(run) == 1:
        yield run
        return
    for i in range(len(run) - 1):
        yield run[i : i + 2]


def iter_tokens(text: str) -> Iterator[str]:
    """Every token of ``text`` in order, repeats included, no cap (one-character CJK runs,
    like upstream's, make no token)."""
    for m in _token_run().finditer(normalize(text)):
        if m.lastgroup == "cjk":
            run = m.group()
            if len(run) > 1:
                yield from _bigrams(run)
        else:
            yield m.group()


def tokens(text: str) -> list[str]:
    """The distinct recall tokens of ``text``: first 32 distinct + last 32 distinct (LRU)."""
    edge = MAX_QUERY_TOKENS // 2
    head: dict[str, None] = {}
    tail: dict[str, None] = {}
    for tok in iter_tokens(text):
        if tok in head:
            continue
        if tok in tail:
            del tail[tok]
            tail[tok] = None
            continue
        if len(head) < edge:
            head[tok] = None
            continue
        tail[tok] = None
        if len(tail) > edge:
            del tail[next(iter(tail))]
    return [*head, *tail]


def is_cjk(token: str) -> bool:
    """True for a CJK bigram/unigram produced by :func:`tokens`."""
    return bool(token) and _CJK_ONE.match(token) is not None


def cjk_bigrams(text: str) -> str:
    """Space-separated bigrams (unigram for a one-character run) of every CJK run in
    ``text``, repeats kept — the FTS ``cjk`` column. Non-CJK text contributes nothing."""
    return " ".join(b for run in _CJK_RUN.findall(normalize(text)) for b in _bigrams(run))


def fts_text(text: str) -> str:
    """``text`` as the FTS index should see it: NFKC, lower-case, and every CJK run
    replaced by its space-separated bigrams (so ``unicode61`` indexes words of two
    characters, and ``用pytest跑`` no longer glues Latin and Han into one token)."""
    norm = normalize(text)
    if _CJK_ONE.search(norm) is None:
        return norm
    return _CJK_RUN.sub(lambda m: " " + " ".join(_bigrams(m.group())) + " ", norm)


def is_noise_query(text: str) -> bool:
    """True for a query with no recall token made only of CJK characters and punctuation
    (``部``, ``認？``, ``배``): upstream treats it as noise and recalls nothing for it."""
    norm = normalize(text)
    return not tokens(norm) and _CJK_ONE.search(norm) is not None and all(
        _CJK_ONE.match(ch) or not ch.isalnum() for ch in norm)


def quote_term(term: str) -> str:
    """``term`` as an FTS5 string literal: double-quoted, ``"`` doubled, NUL and other control
    characters replaced by spaces — so nothing in it (``OR``, ``NEAR(``, ``*``, ``:``, ``^``,
    ``-``) is ever query syntax. The tokenizer then reads it as a phrase of its tokens."""
    clean = _CONTROL.sub(" ", term)
    return '"' + clean.replace('"', '""') + '"'


_CONTROL = re.compile("[\x00-\x1f\x7f]")
