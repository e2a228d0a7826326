"""Views of a text for the scanner, each with a map back to the original characters.

An obfuscated key is still a key, so the scanner does not look at the text as written but at
views of it, built in this order:

1. :func:`decode_escapes` — ``\\uXXXX``, ``\\UXXXXXXXX`` and ``\\xXX`` escapes decoded;
2. :func:`clean` — zero-width characters (U+200B..U+200D, U+2060, U+FEFF) and soft hyphens
   removed, every other non-ASCII character replaced by its NFKC form (fullwidth ``ｇｈｐ＿``
   becomes ``ghp_``);
3. :func:`join_lines` — a line break (and the indentation after it) between two token
   characters removed when the token run across it looks like part of a key (a digit or one
   of ``_+/=`` in it, or 16+ characters not all lower case), so a key split over two lines is whole again and prose is left alone.

:func:`base64_runs` finds base64 (and base64url) runs of at least 24 characters in a view and
:func:`decode_base64` turns one into text when it decodes to printable UTF-8 (image data, a
digest or a lockfile hash decode to binary and are left alone).

Every view keeps a piecewise map (:class:`View`): :meth:`View.span` turns a span of the view
into the span of the original text it came from, so redaction replaces the characters that
were really written. A view that changed nothing is the identity and costs nothing. All work
is a single pass with bounded regexes: linear in the size of the text.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from bisect import bisect_right
from dataclasses import dataclass, field

__all__ = ["View", "base64_runs", "clean", "decode_base64", "decode_escapes", "join_lines",
           "views"]

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|x([0-9a-fA-F]{2}))")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_TOKEN = r"A-Za-z0-9+/_=-"
_JOIN = re.compile(rf"(?<=[{_TOKEN}])\r?\n[ \t]{{0,16}}(?=[{_TOKEN}])")
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{24,8192}+={0,2}")
MIN_PRINTABLE = 0.9
_HEX_RUN = re.compile(r"[0-9a-fA-F]{24,8192}")
_TEXT_BYTES = bytes(range(0x20, 0x7F)) + b"\t\n\r" + bytes(range(0x80, 0x100))


@dataclass
class View:
    """``text`` derived from ``parent`` (None: the original) through replaced pieces.

    ``out`` / ``src`` hold the start of each replaced piece in this text / the parent's text,
    ``src_end`` its end in the parent; between pieces the text is copied one for one.
    """

    text: str
    parent: View | None = None
    out: list[int] = field(default_factory=list)
    out_end: list[int] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    src_end: list[int] = field(default_factory=list)

    def _to_parent(self, i: int, end: bool) -> int:
        if not self.out:
            return i
        k = bisect_right(self.out, i if not end else i - 1) - 1
        if k < 0:
            return i  # before the first piece: same offset
        if i - (1 if end else 0) < self.out_end[k]:  # inside replaced piece k
            return self.src_end[k] if end else self.src[k]
        return self.src_end[k] + (i - self.out_end[k])

    def to_original(self, i: int, *, end: bool = False) -> int:
        view: View | None = self
        while view is not None and view.parent is not None:
            i = view._to_parent(i, end)
            view = view.parent
        return i

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original text that ``text[start:end]`` came from."""
        return self.to_original(start), self.to_original(end, end=True)


def _build(parent: View, pieces: list[tuple[int, int, str]]) -> View:
    """A view of ``parent`` with ``(start, end, replacement)`` pieces (sorted, disjoint)."""
    if not pieces:
        return parent
    src_text = parent.text
    chunks: list[str] = []
    view = View("", parent)
    pos = 0
    length = 0
    for start, end, rep in pieces:
        chunks.append(src_text[pos:start])
        length += start - pos
        view.out.append(length)
        view.src.append(start)
        chunks.append(rep)
        length += len(rep)
        view.out_end.append(length)
        view.src_end.append(end)
        pos = end
    chunks.append(src_text[pos:])
    view.text = "".join(chunks)
    return view


def _escape_char(m: re.Match[str]) -> str | None:
    code = int(m.group(1) or m.group(2) or m.group(3), 16)
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return None
    return chr(code)


def decode_escapes(view: View) -> View:
    if "\\" not in view.text:
        return view
    pieces = []
    for m in _ESCAPE.finditer(view.text):
        ch = _escape_char(m)
        if ch is not None:
            pieces.append((m.start(), m.end(), ch))
    return _build(view, pieces)


def clean(view: View) -> View:
    text = view.text
    if text.isascii():
        return view
    pieces = []
    for m in _NON_ASCII.finditer(text):
        ch = m.group()
        rep = "" if ch in ZERO_WIDTH else unicodedata.normalize("NFKC", ch)
        if rep != ch:
            pieces.append((m.start(), m.end(), rep))
    return _build(view, pieces)


_LEFT_RUN = re.compile(rf"[{_TOKEN}]{{1,64}}$")
_RIGHT_RUN = re.compile(rf"[{_TOKEN}]{{1,64}}")
_KEYISH = re.compile(r"[0-9_+/=]")


def _keyish_join(text: str, start: int, end: int) -> bool:
    """A break inside something key-like: the token run across it holds a digit or one of
    ``_+/=``, or is 16+ characters and not all lower case (prose — "see the\nnext line" —
    is neither, and stays unjoined)."""
    left = _LEFT_RUN.search(text, max(0, start - 64), start)
    right = _RIGHT_RUN.match(text, end)
    if not left or not right:
        return False
    run = left.group() + right.group()
    return bool(_KEYISH.search(run)) or (len(run) >= 16 and not run.islower())


def join_lines(view: View) -> View:
    if "\n" not in view.text:
        return view
    text = view.text
    return _build(view, [(m.start(), m.end(), "") for m in _JOIN.finditer(text)
                         if _keyish_join(text, m.start(), m.end())])


def views(text: str) -> list[View]:
    """The views to scan: escapes decoded and cleaned, then that with lines joined (when the
    join changed anything)."""
    base = clean(decode_escapes(View(text)))
    joined = join_lines(base)
    return [base] if joined is base else [base, joined]


def base64_runs(text: str, pos: int = 0, endpos: int | None = None) -> list[tuple[int, int]]:
    end = len(text) if endpos is None else endpos
    return [m.span() for m in _B64_RUN.finditer(text, pos, end)]


def decode_base64(run: str) -> str | None:
    """The text a base64 / base64url run encodes, or None (binary, not base64)."""
    if _HEX_RUN.fullmatch(run):
        return None  # a digest or a SHA: hex decodes to binary
    data = run.rstrip("=")
    if "-" in data or "_" in data:
        data = data.replace("-", "+").replace("_", "/")
    if len(data) % 4 == 1:
        data = data[:-1]
    data += "=" * (-len(data) % 4)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw.translate(None, _TEXT_BYTES)) > (1 - MIN_PRINTABLE) * len(raw) + 3:
        return None  # control bytes: binary (an image, a hash), not text
    for cut in range(4):  # a joined line may have added a few bytes of garbage at the end
        try:
            out = raw[: len(raw) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if out and sum(ch.isprintable() or ch in "\n\r\t" for ch in out) >= MIN_PRINTABLE * len(out):
            return out
        return None
    return None
