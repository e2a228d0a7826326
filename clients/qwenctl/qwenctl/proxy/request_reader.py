"""Read a chat request's body, reading only the messages its conversation has not sent before.

An agent sends its whole history with every request, so checking and fingerprinting each
message anew costs time in proportion to the history: 0.6 ms of the proxy's CPU for a
conversation of 300 short messages, before the first byte can go upstream (issue 28). The
body is decoded with its ``messages`` left as raw JSON (:class:`msgspec.Raw`, a slice of the
body); the reader keeps, per conversation, where reading its last request ended (a
:class:`~qwenctl.proxy.conversation.ReadState`: roles, fingerprints, system prompt) under
the digest of that request's raw messages. A request whose first messages are byte for byte
those of a request read before goes on from there, so only the new messages are decoded,
checked and fingerprinted. Byte-identical messages read the same, so the result is the
whole read's; anything else (a client that re-serialised an old message, an edited history,
a new conversation) is read from scratch.

Conversations are found by the digest of their first two messages (the system prompt and
the first user message, mostly); each keeps its few latest reads (a regenerated reply
branches), and the least recently used conversations are forgotten past
:data:`MAX_CONVERSATIONS` or :data:`MAX_MESSAGES` messages in all.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from qwenctl.proxy.conversation import BadRequest, Conversation, ReadState, parse

MAX_CONVERSATIONS = 256
MAX_MESSAGES = 200_000  # fingerprints and roles kept in all (about 100 bytes each)
READS_PER_CONVERSATION = 4
_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_decode = msgspec.json.Decoder().decode
_SEP = b"\0"  # never in JSON text outside a string, and escaped inside one


@dataclass
class _Read:
    """Where reading one request's messages ended, under the digest of those raw messages."""

    digest: bytes
    state: ReadState


class RequestReader:
    def __init__(self) -> None:
        self._reads: OrderedDict[bytes, list[_Read]] = OrderedDict()
        self._messages = 0  # messages held by the kept reads
        self.reused = 0  # requests read on from an earlier one (for tests and diagnostics)

    def read(self, data: bytes) -> tuple[dict[str, Any], Conversation]:
        """The body as a dict (``messages`` left as :class:`msgspec.Raw` items, which
        ``msgspec`` encodes as they came) and its conversation; ``BadRequest`` naming the
        field for a body that is no JSON object or messages that are no valid history."""
        try:
            fields = _fields.decode(data)
        except msgspec.ValidationError:
            raise BadRequest("request body must be a JSON object") from None
        except msgspec.DecodeError as exc:
            raise BadRequest(f"request body is not JSON: {exc}") from None
        body: dict[str, Any] = {k: _decode(v) for k, v in fields.items() if k != "messages"}
        raw = fields.get("messages")
        try:
            raws = _raw_list.decode(raw) if raw is not None else None
        except msgspec.ValidationError:
            raws = None
        if not raws:
            parse(_decode(raw) if raw is not None else None)  # raises the usual BadRequest
            raise AssertionError("unreachable")  # pragma: no cover
        body["messages"] = raws
        return body, self._conversation(raws)

    def _conversation(self, raws: list[msgspec.Raw]) -> Conversation:
        key = hashlib.sha256(_SEP.join(raws[:2])).digest()
        h, done = hashlib.sha256(), 0
        base: tuple[ReadState, Any] | None = None  # the longest matching read, its hasher
        for r in sorted(self._reads.get(key, ()), key=lambda r: r.state.count):
            n = r.state.count
            if n > len(raws):
                break
            h.update(_SEP.join(raws[done:n]) + _SEP)
            done = n
            if h.digest() == r.digest:
                base = (r.state, h.copy())
        if base is None:
            state, h = ReadState(), hashlib.sha256()
        else:
            state, h = base[0].copy(), base[1]
            self.reused += 1
        start = state.count
        tail = state.read([_decode(r) for r in raws[start:]])
        conv = state.conversation(tail, len(state.roles) - len(tail),
                                  self._rest(raws) if start else None)
        if start < len(raws):  # (a request sent again adds nothing)
            h.update(_SEP.join(raws[start:]) + _SEP)
        self._keep(key, _Read(h.digest(), state))
        return conv

    @staticmethod
    def _rest(raws: list[msgspec.Raw]) -> Callable[[], Conversation]:
        """Reads the whole request from scratch, once, when an older message is needed."""
        whole: list[Conversation] = []

        def read() -> Conversation:
            if not whole:
                whole.append(parse([_decode(r) for r in raws]))
            return whole[0]
        return read

    def _keep(self, key: bytes, read: _Read) -> None:
        old = self._reads.pop(key, [])
        kept = [r for r in old if r.state.count != read.state.count]
        kept = [*kept, read][-READS_PER_CONVERSATION:]
        self._reads[key] = kept
        self._messages += sum(r.state.count for r in kept) - sum(r.state.count for r in old)
        while self._reads and (len(self._reads) > MAX_CONVERSATIONS
                               or self._messages > MAX_MESSAGES):
            _, dropped = self._reads.popitem(last=False)
            self._messages -= sum(r.state.count for r in dropped)
