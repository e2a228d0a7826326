"""The one token estimator used everywhere a count is needed before the API reports one.

Characters / 4 for text (Qwen Code's ratio), CJK characters one token each (a Chinese or
Japanese character is roughly a token in Qwen's tokenizer, not a quarter of one), and images at
a configurable flat estimate. API-reported prompt counts, when a client sends them, are
authoritative; this only estimates deltas and fills gaps.
"""

from __future__ import annotations

import math
import re

CHARS_PER_TOKEN = 4
DEFAULT_IMAGE_TOKENS = 1600
_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff00-\uffef\U00020000-\U0002fa1f]"
)


def estimate_tokens(text: str) -> int:
    """Estimated tokens of ``text``: ceil(other chars / 4) + one per CJK character."""
    if not text:
        return 0
    if text.isascii():
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / CHARS_PER_TOKEN)
