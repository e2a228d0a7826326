"""History invariants: the validator, each repair rule, and a property test over random histories."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.compaction.invariants import problems, repair
from qwenctxd.compaction.micro import micro_compact

PNG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def u(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


def a(content: Any = "ok", *ids: str) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if ids:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
            for i in ids
        ]
    return msg


def t(cid: Any, content: Any = "out") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "name": "read_file", "content": content}


def ids_of(msg: dict[str, Any]) -> list[str]:
    return [c["id"] for c in msg.get("tool_calls") or []]


# --- the validator -------------------------------------------------------------------------


def test_valid_history_has_no_problems() -> None:
    h = [{"role": "system", "content": "s"}, u(), a(None, "1", "2"), t("2"), t("1"), a(), u()]
    assert problems(h) == []


def test_problems_each_rule() -> None:
    assert problems([u(), u()]) == ["[0], [1]: two consecutive user messages"]
    assert problems([u(), a(), a()]) == ["[1], [2]: two consecutive assistant messages"]
    assert problems([u(), {"role": "system", "content": "s"}]) == [
        "[1]: system message not at index 0"
    ]
    assert problems([u(), t("x")]) == ["[1]: tool message 'x' answers no pending tool call"]
    assert problems([u(), a(None, "1"), t("1"), t("1")]) == [
        "[3]: tool message '1' answers no pending tool call"
    ]
    assert problems([u(), a(None, "1", "2"), t("1"), u()]) == [
        "[1]: tool calls ['2'] unanswered before [3]"
    ]
    assert problems([u(), a(None, "1")]) == ["[1]: tool calls ['1'] never answered"]
    assert problems([u(), a(None, "1")], allow_pending_tail=True) == []
    assert problems([u(), a(None)]) == ["[1]: empty assistant message without tool calls"]
    assert problems([u(), a("  ")]) == ["[1]: empty assistant message without tool calls"]
    assert problems([u(), a([{"type": "text", "text": ""}])]) == [
        "[1]: empty assistant message without tool calls"
    ]
    assert problems([u(), {"role": "assistant", "content": "x", "tool_calls": []}]) == [
        "[1]: empty tool_calls list"
    ]
    bad = a(None, "1", "1")
    bad["tool_calls"].append({"type": "function"})
    assert problems([u(), bad, t("1")]) == [
        "[1]: tool_calls[1] repeats id '1'",
        "[1]: tool_calls[2] has no id",
    ]
    assert problems([u(), {"role": "function", "content": "x"}]) == ["[1]: unknown role 'function'"]


def test_tool_answers_only_the_latest_assistant() -> None:
    # '1' was dropped as unanswered at the user message; a later answer is an orphan
    h = [u(), a(None, "1"), u("again"), a(None, "2"), t("2"), t("1")]
    assert problems(h) == [
        "[1]: tool calls ['1'] unanswered before [2]",
        "[5]: tool message '1' answers no pending tool call",
    ]


# --- repair rules --------------------------------------------------------------------------


def test_repair_merges_consecutive_users() -> None:
    assert repair([u("a"), u("b")], drop_trailing_unanswered=True) == [u("a\n\nb")]
    merged = repair([u("a"), u([PNG]), u("c")], drop_trailing_unanswered=True)
    assert merged == [u([{"type": "text", "text": "a"}, PNG, {"type": "text", "text": "c"}])]
    assert repair([u(""), u("b")], drop_trailing_unanswered=True) == [u("b")]


def test_repair_merges_consecutive_assistants() -> None:
    h = [u(), a("thinking"), a(None, "1"), t("1"), a("x"), a("y")]
    out = repair(h, drop_trailing_unanswered=True)
    assert out == [u(), {**a("thinking", "1")}, t("1"), a("x\n\ny")]
    assert problems(out) == []


def test_repair_merges_assistants_split_between_their_calls() -> None:
    out = repair([u(), a(None, "1"), a(None, "2"), t("2"), t("1")], drop_trailing_unanswered=True)
    assert len(out) == 4 and ids_of(out[1]) == ["1", "2"]
    assert problems(out) == []


def test_repair_removes_orphan_tool_messages() -> None:
    h = [t("x"), u(), t("y"), a(None, "1"), t("1"), t("1"), t("zz"), a()]
    out = repair(h, drop_trailing_unanswered=True)
    assert out == [u(), a(None, "1"), t("1"), a()]


def test_repair_drops_unanswered_calls_mid_history() -> None:
    out = repair([u(), a("x", "1", "2"), t("1"), u("b")], drop_trailing_unanswered=False)
    assert out == [u(), a("x", "1"), t("1"), u("b")]
    # nothing answered and no content: the assistant message goes, the users merge
    out = repair([u("a"), a(None, "1"), u("b"), a()], drop_trailing_unanswered=False)
    assert out == [u("a\n\nb"), a()]
    # the call had content: keep the text, drop the tool_calls key
    assert repair([u(), a("x", "1"), u("b")], drop_trailing_unanswered=True) == [
        u(),
        a("x"),
        u("b"),
    ]


def test_repair_trailing_unanswered() -> None:
    h = [u(), a(None, "1", "2")]
    assert repair(h, drop_trailing_unanswered=False) == h
    assert repair(h, drop_trailing_unanswered=True) == [u()]
    partial = [u(), a("x", "1", "2"), t("1")]
    assert repair(partial, drop_trailing_unanswered=False) == partial
    assert problems(partial, allow_pending_tail=True) == []
    assert repair(partial, drop_trailing_unanswered=True) == [u(), a("x", "1"), t("1")]


def test_repair_system_messages() -> None:
    s1, s2 = {"role": "system", "content": "one"}, {"role": "system", "content": "two"}
    assert repair([s1, s2, u()], drop_trailing_unanswered=True) == [
        {"role": "system", "content": "one\n\ntwo"},
        u(),
    ]
    assert repair([s1, u("a"), s2, a()], drop_trailing_unanswered=True) == [
        s1,
        u("a\n\ntwo"),
        a(),
    ]


def test_repair_empty_assistant_and_bad_calls() -> None:
    out = repair([u("a"), a(""), u("b")], drop_trailing_unanswered=True)
    assert out == [u("a\n\nb")]
    bad = a(None, "1", "1")
    bad["tool_calls"].append({"type": "function", "function": {"name": "x", "arguments": "{}"}})
    out = repair([u(), bad, t("1"), a()], drop_trailing_unanswered=True)
    assert ids_of(out[1]) == ["1"] and problems(out) == []
    out = repair(
        [u(), {"role": "assistant", "content": "x", "tool_calls": []}],
        drop_trailing_unanswered=True,
    )
    assert out == [u(), a("x")]
    assert repair([u(), {"role": "function"}, 3, u("b")], drop_trailing_unanswered=True) == [  # type: ignore[list-item]
        u("hi\n\nb")
    ]


def test_repair_merges_reasoning() -> None:
    out = repair(
        [u(), {**a("x"), "reasoning_content": "r1"}, {**a("y"), "reasoning_content": "r2"}],
        drop_trailing_unanswered=True,
    )
    assert out[1]["reasoning_content"] == "r1\n\nr2" and out[1]["content"] == "x\n\ny"


def test_repair_valid_is_identity_and_input_untouched() -> None:
    h = [{"role": "system", "content": "s"}, u(), a(None, "1"), t("1"), a(), u([PNG])]
    out = repair(h, drop_trailing_unanswered=True)
    assert out == h and all(x is y for x, y in zip(out, h, strict=True))
    broken = [u("a"), u("b"), a(None, "1"), t("2"), a(None)]
    snap = copy.deepcopy(broken)
    repair(broken, drop_trailing_unanswered=True)
    assert broken == snap


# --- property test -------------------------------------------------------------------------

IDS = st.sampled_from(["c1", "c2", "c3", "c4"])
TOOL_NAMES = st.sampled_from(["read_file", "run_shell_command", "glob", "browser", "edit", "x"])
TEXT = st.sampled_from(["", " ", "hi", "Error: boom", "y" * 300])
IMG = st.builds(
    lambda mime: {"type": "image_url", "image_url": {"url": f"data:{mime};base64,AAAA"}},
    st.sampled_from(["image/png", "image/jpeg"]),
)
PARTS = st.lists(st.one_of(TEXT.map(lambda s: {"type": "text", "text": s}), IMG), max_size=3)
CONTENT = st.one_of(st.none(), TEXT, PARTS)


@st.composite
def tool_call(draw: st.DrawFn) -> dict[str, Any]:
    args = draw(
        st.one_of(
            st.just("{bad json"),
            st.builds(lambda p: json.dumps({"file_path": p}), st.sampled_from(["/a", "/b"])),
            st.just(json.dumps({"path": "/c"})),
        )
    )
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": draw(TOOL_NAMES), "arguments": args},
    }
    cid = draw(st.one_of(IDS, IDS, IDS, st.none(), st.just("")))
    if cid is not None:
        call["id"] = cid
    return call


@st.composite
def assistant(draw: st.DrawFn) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": draw(CONTENT)}
    calls = draw(st.one_of(st.none(), st.lists(tool_call(), max_size=3)))
    if calls is not None:
        msg["tool_calls"] = calls
    if draw(st.booleans()):
        msg["reasoning_content"] = draw(TEXT)
    return msg


@st.composite
def tool(draw: st.DrawFn) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": draw(st.one_of(IDS, st.none()))}
    if draw(st.booleans()):
        msg["name"] = draw(TOOL_NAMES)
    msg["content"] = draw(st.one_of(TEXT, PARTS))
    if draw(st.integers(0, 4)) == 0:
        msg["is_error"] = draw(st.booleans())
    return msg


@st.composite
def exchange(draw: st.DrawFn) -> list[dict[str, Any]]:
    """An assistant message with calls followed by some of their answers, in random order."""
    msg = draw(assistant())
    ids = [c["id"] for c in msg.get("tool_calls") or [] if c.get("id")]
    answers = [
        {"role": "tool", "tool_call_id": i, "content": draw(st.one_of(TEXT, PARTS))}
        for i in draw(st.permutations(ids))
        if draw(st.integers(0, 5))  # mostly answered
    ]
    return [msg, *answers]


MESSAGE = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, st.one_of(TEXT, PARTS)),
    st.builds(lambda c: {"role": "system", "content": c}, TEXT),
    assistant(),
    tool(),
    st.just({"role": "developer", "content": "x"}),
)
RANDOM_HISTORY = st.lists(
    st.one_of(MESSAGE.map(lambda m: [m]), exchange(), exchange()), max_size=25
).map(lambda chunks: [m for chunk in chunks for m in chunk])


@st.composite
def near_valid_history(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Well-formed rounds (user, tool exchanges, reply), then a few random deletions and swaps."""
    h: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for _ in range(draw(st.integers(0, 6))):
        h.append({"role": "user", "content": draw(st.one_of(TEXT, PARTS))})
        for _ in range(draw(st.integers(0, 3))):
            h.extend(draw(exchange()))
        h.append({"role": "assistant", "content": draw(TEXT)})
    for _ in range(draw(st.integers(0, 3))):
        if len(h) < 2:
            break
        i = draw(st.integers(0, len(h) - 1))
        if draw(st.booleans()):
            del h[i]
        else:
            j = draw(st.integers(0, len(h) - 1))
            h[i], h[j] = h[j], h[i]
    return h


HISTORY = st.one_of(RANDOM_HISTORY, near_valid_history())


@settings(max_examples=600, deadline=None)
@given(
    HISTORY,
    st.integers(0, 4),
    st.sampled_from(["force", "idle", "size"]),
    st.booleans(),
)
def test_repair_always_yields_a_valid_history(
    h: list[dict[str, Any]], keep: int, trigger: Any, strip: bool
) -> None:
    snapshot = copy.deepcopy(h)

    strict = repair(h, drop_trailing_unanswered=True)
    assert problems(strict) == []
    assert repair(strict, drop_trailing_unanswered=True) == strict  # idempotent

    lenient = repair(h, drop_trailing_unanswered=False)
    assert problems(lenient, allow_pending_tail=True) == []
    assert repair(lenient, drop_trailing_unanswered=False) == lenient

    if problems(h) == []:
        assert strict == h

    for repaired, pending in ((strict, False), (lenient, True)):
        res = micro_compact(repaired, keep=keep, trigger=trigger, strip_reasoning=strip)
        assert problems(res.messages, allow_pending_tail=pending) == []
        assert res.tokens_saved >= 0
        assert (res.messages is repaired) == (res.tokens_saved == 0)

    assert h == snapshot  # neither function mutated its input
