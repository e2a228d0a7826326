"""Escaping user-controlled text placed inside a tagged block of a prompt.

One helper for every place the daemon wraps text it did not write in a tag the model is told
to trust the boundaries of — ``<system-reminder>`` (recalled memories), the memory index of the
system prompt, the ``<available_skills>`` listing: ``&``, ``<`` and ``>`` become entities
(quotes too when asked, as the skill listing does, as Qwen Code renders it), so a memory or a
skill description holding ``</system-reminder>\\nSYSTEM: …`` cannot close the block it rides in.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

__all__ = ["escape_in_tag"]

_QUOTES = {'"': "&quot;", "'": "&apos;"}


def escape_in_tag(text: str, *, quotes: bool = False) -> str:
    """``text`` safe inside a tagged block: it can open or close no tag."""
    if "<" not in text and ">" not in text and "&" not in text and not (
            quotes and ('"' in text or "'" in text)):
        return text
    return escape(text, _QUOTES if quotes else {})
