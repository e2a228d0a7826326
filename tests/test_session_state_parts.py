"""The parts of a session's state keep their running figures equal to a recount.

Random sequences of append / pop / replace (compaction, micro-compaction keeping the anchor)
and anchoring drive a :class:`Session`; after every step the History's incremental figures
(total, last user, counts, wire cut) match a recount from scratch, the epoch moves on every
rewrite and never on an append, and the UsageAnchor's figure equals the direct sum.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.config import ConfigStore
from qwenctxd.project import Project
from qwenctxd.sessions.jsonl_writer import JsonlWriter
from qwenctxd.sessions.state import REASONING_KEYS, History, Session, SessionOptions
from qwenctxd.tokens import message_tokens, tool_result_chars

TEXT = st.text(min_size=0, max_size=40)
MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, TEXT),
    st.builds(lambda t: {"role": "assistant", "content": t}, TEXT),
    st.builds(lambda t: {"role": "assistant", "content": None, "reasoning_content": t}, TEXT),
    st.builds(lambda t: {"role": "tool", "tool_call_id": "c1", "content": t}, TEXT),
    st.builds(lambda t: {"role": "tool", "tool_call_id": "c2", "content": t, "is_error": True},
              TEXT),
)
STEP = st.one_of(
    st.tuples(st.just("append"), MESSAGE),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("replace"), st.lists(MESSAGE, max_size=6)),
    st.tuples(st.just("micro"), st.lists(MESSAGE, max_size=6)),
    st.tuples(st.just("anchor"), st.integers(min_value=0, max_value=5000)),
)


def make_session(tmp: Path) -> Session:
    opts = SessionOptions(window_tokens=32000, auto_compact_threshold=70.0, tools=[])
    project = Project(root=None, anchor=tmp, home=tmp, qwen_home=tmp / ".qwen",
                      config=ConfigStore(home=tmp, xdg_config=tmp))
    return Session(id="s", cwd=tmp, project=project, model="m", options=opts, env={},
                   path=tmp / "s.jsonl", writer=JsonlWriter(tmp / "s.jsonl"),
                   history=History(image_tokens=1600))


def check(h: History) -> None:
    msgs = h.messages
    assert h.tokens == [message_tokens(m, image_tokens=h.image_tokens) for m in msgs]
    assert h.total == sum(h.tokens)
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    assert h.last_user == (users[-1] if users else -1)
    assert h.ext_count == sum("is_error" in m for m in msgs)
    assert h.tool_chars == sum(tool_result_chars([m]) for m in msgs if m["role"] == "tool")
    assert h.reasoning_count == sum(m["role"] == "assistant" and any(k in m for k in REASONING_KEYS)
                                    for m in msgs)
    assert 0 <= h.wire_cut <= len(msgs)
    assert all(m.get("content") is not None for m in msgs if m["role"] == "assistant")
    for start in range(len(msgs) + 1):
        assert h.tail_tokens(start) == sum(h.tokens[start:])


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(STEP, max_size=40))
def test_running_figures_match_a_recount(tmp_path_factory, steps) -> None:
    s = make_session(tmp_path_factory.mktemp("state"))
    for kind, arg in steps:
        epoch = s.history.epoch
        if kind == "append":
            s.append(arg)
            assert s.history.epoch == epoch
        elif kind == "pop":
            if not s.history.messages:
                continue
            s.pop_last()
            assert s.history.epoch != epoch
        elif kind in ("replace", "micro"):
            before = s.usage.anchor
            s.replace_history(arg, keep_anchor_delta=7 if kind == "micro" else None)
            assert s.history.epoch != epoch
            if kind == "replace" or before is None:
                assert s.usage.anchor is None
            else:
                assert s.usage.anchor is not None
                assert s.usage.anchor.total == max(0, before.total - 7)
        else:
            s.set_anchor(arg, 10, 100)
            assert s.usage.anchor is not None and s.usage.anchor.index == len(s.history.messages)
        check(s.history)
        tokens, anchored = s.estimate(120)
        a = s.usage.anchor
        if a is not None and a.index <= len(s.history.messages):
            assert anchored
            assert tokens == max(0, a.total + sum(s.history.tokens[a.index:]) + 120
                                 - a.system_tokens)
        else:
            assert not anchored and tokens == 120 + sum(s.history.tokens)
