"""FrameDecoder and the nesting bound, driven by hypothesis: any split of a byte stream into
chunks yields the same frames, in either framing; the nesting bound is exact."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.protocol import framing
from qwenctxd.protocol.framing import FrameDecoder, Framing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=6), st.sampled_from(list(Framing)),
       st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_any_chunking_gives_the_same_frames(values, kind, cuts) -> None:  # type: ignore[no-untyped-def]
    bodies = [json.dumps({"v": v}).encode() for v in values]
    stream = b"".join(framing.encode(b, kind) for b in bodies)
    dec = FrameDecoder()  # server side: detects the framing
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        dec.feed(stream[pos:pos + n])
        pos, i = pos + n, i + 1
        while (frame := dec.next_frame()) is not None:
            out.append(frame)
    assert out == bodies and dec.framing is kind


def test_oversized_frames_refused_in_both_framings() -> None:
    nd = FrameDecoder(Framing.NDJSON, max_frame=1024)
    nd.feed(b"{" + b" " * 2000)
    with pytest.raises(framing.FrameTooLarge):
        nd.next_frame()
    lsp = FrameDecoder(Framing.LSP, max_frame=1024)
    lsp.feed(b"Content-Length: 5000\r\n\r\n")
    with pytest.raises(framing.FrameTooLarge):
        lsp.next_frame()
    unknown = FrameDecoder()
    unknown.feed(b"  GET / HTTP/1.1\r\n")
    with pytest.raises(framing.UnknownFraming):
        unknown.next_frame()


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=600), st.lists(st.sampled_from("[{"), min_size=1))
def test_nesting_bound_is_exact(depth, shape) -> None:  # type: ignore[no-untyped-def]
    opens = [shape[i % len(shape)] for i in range(depth)]
    text = "".join('{"k":' if o == "{" else "[" for o in opens)
    text += '"x]}\\""' + "".join("}" if o == "{" else "]" for o in reversed(opens))
    if depth > framing.MAX_NESTING:
        with pytest.raises(framing.NestingTooDeep):
            framing.decode_json(text.encode())
    else:
        assert framing.decode_json(text.encode()) == json.loads(text)
