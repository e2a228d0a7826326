"""Check the content parts a client sends (a user turn's ``images``, a tool result's list
content) before they enter the history, so every later request stays a valid
chat-completions body and no part can trip the token estimate or compaction.

A part is an object with a string ``type``: ``text`` needs a string ``text``; ``image_url``
needs ``image_url`` as ``{url: str, detail?: str}`` (or a bare URL string); ``video_url``,
``input_audio`` and ``file`` need an object under their own key. Other types are refused: the
endpoints we serve would reject them too.
"""

from __future__ import annotations

from typing import Any

from qwenctxd.protocol import errors

_OBJECT_PARTS = ("video_url", "input_audio", "file")


def _bad(field: str, message: str) -> errors.InvalidParams:
    return errors.InvalidParams(f"{field}: {message}", data={"field": field, "message": message})


def check_parts(parts: list[Any], field: str) -> None:
    """Raise InvalidParams naming ``field[i]`` (and the key) for the first malformed part."""
    for i, part in enumerate(parts):
        where = f"{field}[{i}]"
        if not isinstance(part, dict):
            raise _bad(where, "a content part must be an object")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise _bad(f"{where}.type", "missing or not a string")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _bad(f"{where}.text", "a text part needs a string text")
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise _bad(f"{where}.image_url", "needs {url: string}")
            if isinstance(image, dict) and not isinstance(image.get("detail", ""), str):
                raise _bad(f"{where}.image_url.detail", "not a string")
        elif kind in _OBJECT_PARTS:
            if not isinstance(part.get(kind), dict):
                raise _bad(f"{where}.{kind}", f"a {kind} part needs an object under {kind!r}")
        else:
            raise _bad(f"{where}.type", f"unknown content part type {kind[:40]!r} (known: "
                       f"text, image_url, {', '.join(_OBJECT_PARTS)})")
