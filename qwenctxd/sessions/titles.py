"""Session titles: the automatic one taken from the first user message, and the user's own.

A session gets an ``auto`` title on its first user-query turn (the first non-empty line of the
message, whitespace collapsed, cut at a word boundary) so ``session.list`` is readable without
a model call. ``session.set_title`` records a ``manual`` one; an automatic title is only ever
written when the session has none, so a manual title is never overwritten. Both are
``custom_title`` system records (``{customTitle, titleSource}``) in the session JSONL, the
upstream format, so resume and the index read them back.
"""

from __future__ import annotations

import re

from qwenctxd.protocol import errors

AUTO_TITLE_CHARS = 80
MAX_TITLE_CHARS = 200
_SPACE = re.compile(r"\s+")


#: a whole reminder block, or an unclosed one running to the end (a cut-off message)
_REMINDER = re.compile(r"<system-reminder>.*?(?:</system-reminder>|\Z)", re.S | re.I)


def auto_title(text: str, limit: int = AUTO_TITLE_CHARS) -> str | None:
    """The title a session gets from its first user message, or None for a blank message.

    Text inside ``<system-reminder>`` blocks (what an agent such as Qwen Code prepends to the
    user's words: the environment, reminders) is never a title; a message that is nothing but
    such blocks gives none (a later user message may)."""
    text = _REMINDER.sub(" ", text)
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    title = _SPACE.sub(" ", line).strip()
    if not title:
        return None
    if len(title) <= limit:
        return title
    cut = title[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def manual_title(raw: str) -> str:
    """A user-given title, whitespace collapsed; a blank or over-long one is InvalidParams."""
    title = _SPACE.sub(" ", raw).strip()
    if not title:
        raise errors.InvalidParams("title is empty",
                                   data={"field": "title", "message": "empty"})
    if len(title) > MAX_TITLE_CHARS:
        raise errors.InvalidParams(
            f"title is {len(title)} characters; the limit is {MAX_TITLE_CHARS}",
            data={"field": "title", "message": "too long"})
    return title
