"""Wire framing shared by the server and the clients: NDJSON and LSP ``Content-Length``.

The one place frames are cut out of a byte stream. ``FrameDecoder`` is a push parser: feed it
whatever bytes arrived and pop complete frames; the daemon's connections, the blocking
``Client`` and the ``AsyncClient`` all use it, with the one cap ``MAX_FRAME_BYTES``.

A connection's framing is chosen by its first non-blank byte (``{``/``[`` → NDJSON,
``C``/``c`` → LSP base protocol). Replies use the framing the client chose.

``decode_json`` bounds how deep a JSON frame nests (protocol.md "Resource bounds") while
msgspec decodes it.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

import msgspec

MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 8 * 1024
MAX_NESTING = 256
WHITESPACE = b" \t\r\n"


class Framing(enum.Enum):
    NDJSON = "ndjson"
    LSP = "lsp"


class FramingError(Exception):
    """The byte stream cannot be cut into frames; the connection cannot continue."""


class FrameTooLarge(FramingError):
    """A frame (or its declared length) is over the cap."""

    def __init__(self, size: int | None, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"frame over {limit} bytes")


class FrameSkipped(Exception):
    """A frame over the cap was discarded without buffering it; the stream goes on."""

    def __init__(self, size: int | None, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"message over {limit} bytes discarded")


class BadHeader(FramingError):
    """An LSP header block without a usable Content-Length."""


class UnknownFraming(FramingError):
    """The first non-blank byte chooses no framing."""


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


class FrameDecoder:
    """Cuts frames out of a byte stream: ``feed(bytes)``, then ``next_frame()`` until None.

    ``framing=None`` detects the framing from the first non-blank byte (the server side).
    Blank NDJSON lines and blank space between LSP messages are skipped. Errors are
    ``FramingError`` subclasses; after one the stream is unusable.
    """

    def __init__(self, framing: Framing | None = None, *, max_frame: int = MAX_FRAME_BYTES,
                 max_message: int | None = None):
        self.framing = framing
        self.max_frame = max_frame
        # max_message (< max_frame): a frame over it, but not over max_frame, is discarded as
        # it streams in, never buffered, and FrameSkipped is raised once it has ended; the
        # stream goes on. Over max_frame it is still FrameTooLarge (the stream ends).
        self.max_message = max_message if max_message and max_message < max_frame else None
        self._discard_line = False  # NDJSON: dropping bytes up to the next newline
        self._discard_body = 0  # LSP: body bytes still to drop
        self._discarded = 0
        self._skipped: FrameSkipped | None = None
        self._fatal: FrameTooLarge | None = None
        self._buf = bytearray()
        self._scan = 0  # NDJSON: where the newline search resumes
        self._body_len: int | None = None  # LSP: length of the body being awaited

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._fatal is not None:
            return
        if self._discard_body:
            n = min(self._discard_body, len(data))
            self._discard_body -= n
            self._discarded += n
            data = data[n:]
            if not self._discard_body:
                self._end_discard()
        elif self._discard_line:
            idx = data.find(b"\n")
            self._discarded += len(data) if idx < 0 else idx
            if self._discarded > self.max_frame:
                self._discard_line = False
                self._fatal = FrameTooLarge(None, self.max_frame)
                return
            if idx < 0:
                return
            self._discard_line = False
            self._end_discard()
            data = data[idx + 1:]
        self._buf += data

    def _end_discard(self) -> None:
        assert self.max_message is not None
        self._skipped = FrameSkipped(self._discarded, self.max_message)
        self._discarded = 0

    def next_frame(self) -> bytes | None:
        """The next complete frame, or None when more bytes are needed."""
        if self._fatal is not None:
            raise self._fatal
        if self._skipped is not None:
            skipped, self._skipped = self._skipped, None
            raise skipped
        buf = self._buf
        if self.framing is None:
            stripped = len(buf) - len(buf.lstrip(WHITESPACE))
            if stripped:
                del buf[:stripped]
            if not buf:
                return None
            self.framing = detect(buf[0])
            if self.framing is None:
                raise UnknownFraming("expected JSON or a Content-Length header")
        if self.framing is Framing.NDJSON:
            return self._next_line()
        return self._next_lsp()

    def _next_line(self) -> bytes | None:
        buf = self._buf
        while True:
            idx = buf.find(b"\n", self._scan)
            if idx < 0:
                self._scan = len(buf)
                if self.max_message is not None and len(buf) > self.max_message:
                    self._discarded = len(buf)
                    del buf[:]
                    self._scan = 0
                    self._discard_line = True
                    return None
                if len(buf) > self.max_frame:
                    raise FrameTooLarge(None, self.max_frame)
                return None
            line = bytes(buf[:idx])
            del buf[: idx + 1]
            self._scan = 0
            if self.max_message is not None and self.max_message < len(line) <= self.max_frame:
                raise FrameSkipped(len(line), self.max_message)
            if len(line) > self.max_frame:
                raise FrameTooLarge(len(line), self.max_frame)
            if line.strip():
                return line

    def _next_lsp(self) -> bytes | None:
        buf = self._buf
        if self._body_len is None:
            stripped = len(buf) - len(buf.lstrip(WHITESPACE))
            if stripped:
                del buf[:stripped]
            idx = buf.find(b"\r\n\r\n")
            if idx < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    raise BadHeader("header block over 8 KiB")
                return None
            length = parse_content_length(bytes(buf[:idx]))
            del buf[: idx + 4]
            if length > self.max_frame:
                raise FrameTooLarge(length, self.max_frame)
            if self.max_message is not None and length > self.max_message:
                n = min(length, len(buf))
                del buf[:n]
                self._discarded = n
                self._discard_body = length - n
                if not self._discard_body:
                    self._end_discard()
                    return self.next_frame()
                return None
            self._body_len = length
        if len(buf) < self._body_len:
            return None
        body = bytes(buf[: self._body_len])
        del buf[: self._body_len]
        self._body_len = None
        return body


# -- nesting ----------------------------------------------------------------------------------
class NestingTooDeep(ValueError):
    """A JSON frame nests arrays/objects deeper than ``MAX_NESTING``."""


_headroom: dict[int, int] = {}  # stack depth → recursion headroom admitting MAX_NESTING levels


def _stack_depth() -> int:
    f = sys._getframe(1)
    n = 0
    while f is not None:
        n += 1
        f = f.f_back  # type: ignore[assignment]
    return n


def _decode_with_limit(frame: bytes, depth: int, headroom: int) -> Any:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + headroom)
    try:
        return msgspec.json.decode(frame)
    finally:
        sys.setrecursionlimit(old)


def _calibrate(depth: int) -> int:
    """The smallest headroom at which ``MAX_NESTING`` levels decode (found once per depth)."""
    probe = b"[" * MAX_NESTING + b"]" * MAX_NESTING
    for headroom in range(MAX_NESTING, MAX_NESTING + 400):
        try:
            _decode_with_limit(probe, depth + 1, headroom)  # +1: this frame
        except RecursionError:
            continue
        return headroom
    raise RuntimeError("cannot calibrate the JSON nesting bound")


def decode_json(frame: bytes) -> Any:
    """``msgspec.json.decode`` that refuses nesting deeper than ``MAX_NESTING`` levels.

    msgspec counts each level against the interpreter's recursion limit, so the limit is set,
    for the length of the decode only, to the current depth plus a headroom calibrated to admit
    exactly ``MAX_NESTING`` levels at this stack depth: exact, and free for the frames that are not deep (no
    second pass over the bytes). The GIL is held throughout, so no other thread sees the limit.
    Raises ``msgspec.DecodeError`` for bad JSON, ``NestingTooDeep`` past the bound.
    """
    if frame.count(b"[") + frame.count(b"{") <= MAX_NESTING:
        return msgspec.json.decode(frame)
    depth = _stack_depth()
    headroom = _headroom.get(depth)
    if headroom is None:
        headroom = _headroom[depth] = _calibrate(depth)
    try:
        return _decode_with_limit(frame, depth, headroom)
    except RecursionError:
        raise NestingTooDeep(f"nesting too deep (limit {MAX_NESTING} levels)") from None
