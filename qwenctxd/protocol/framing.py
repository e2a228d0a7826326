"""Wire framing shared by the server and the clients: NDJSON and LSP ``Content-Length``.

A connection's framing is chosen by its first non-blank byte (``{``/``[`` → NDJSON,
``C``/``c`` → LSP base protocol). Replies use the framing the client chose.
"""

from __future__ import annotations

import enum

MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 8 * 1024
WHITESPACE = b" \t\r\n"


class Framing(enum.Enum):
    NDJSON = "ndjson"
    LSP = "lsp"


class FrameTooLarge(Exception):
    """A frame (or its declared length) is over the cap."""

    def __init__(self, size: int | None, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"frame over {limit} bytes")


class BadHeader(Exception):
    """An LSP header block without a usable Content-Length."""


def detect(first_byte: int) -> Framing | None:
    """Framing for a connection whose first non-blank byte is ``first_byte``; None if unknown."""
    if first_byte in (0x7B, 0x5B):  # '{' '['
        return Framing.NDJSON
    if first_byte in (0x43, 0x63):  # 'C' 'c'
        return Framing.LSP
    return None


def encode(body: bytes, framing: Framing) -> bytes:
    """Wrap one already-serialized JSON body in ``framing``."""
    if framing is Framing.NDJSON:
        return body + b"\n"
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def parse_content_length(header_block: bytes) -> int:
    """The Content-Length of an LSP header block (without the final blank line).

    Header names are case-insensitive; other headers (Content-Type) are accepted and ignored.
    """
    length: int | None = None
    for line in header_block.split(b"\r\n"):
        if not line.strip():
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise BadHeader("header line without ':'")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError as exc:
                raise BadHeader("Content-Length is not an integer") from exc
    if length is None or length < 0:
        raise BadHeader("missing Content-Length")
    return length
