"""Recall tokenization: a re-export of :mod:`qwenctxd.fts` (where it lives, shared with
session search), for the memory modules that import it from here."""

from qwenctxd.fts import (  # noqa: F401
    CJK_CHAR,
    MAX_QUERY_TOKENS,
    cjk_bigrams,
    fts_text,
    is_cjk,
    is_noise_query,
    iter_tokens,
    normalize,
    tokens,
)
