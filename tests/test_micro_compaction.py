"""Micro-compaction (§7.4): keep N per kind, placeholders, errors, evicted reads, triggers."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from qwenctxd.compaction.invariants import problems
from qwenctxd.compaction.micro import (
    CLEARED_TOOL_RESULT,
    media_mime,
    micro_compact,
    micro_compact_if_due,
    should_micro_compact,
)
from qwenctxd.tokens import estimate_tokens, history_tokens, message_tokens, tool_result_chars

PNG = "data:image/png;base64," + "iVBORw0KGgo" * 20
JPEG = "data:image/jpeg;base64," + "/9j/4AAQ" * 20
BIG = "x" * 2_000


def img(url: str = PNG) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def call(cid: str, name: str, args: Any) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def history(n: int = 5) -> list[dict[str, Any]]:
    """``n`` rounds, each with one read_file result, one user image and one nested image."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for k in range(n):
        msgs.append({"role": "user", "content": [text(f"look {k}"), img()]})
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call(f"r{k}", "read_file", {"file_path": f"/src/f{k}.py"}),
                    call(f"s{k}", "browser_screenshot", {}),
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"r{k}", "name": "read_file", "content": BIG})
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": f"s{k}",
                "name": "browser_screenshot",
                "content": [text(f"shot {k}"), img(JPEG)],
            }
        )
        msgs.append({"role": "assistant", "content": f"done {k}"})
    return msgs


def by_id(msgs: list[dict[str, Any]], cid: str) -> dict[str, Any]:
    return next(m for m in msgs if m.get("tool_call_id") == cid)


def test_keep_n_per_kind_separately() -> None:
    msgs = history(5)
    before = history_tokens(msgs)
    res = micro_compact(msgs, keep=2, trigger="force")
    assert res.cleared == {"tool": 3, "media": 3, "nested_media": 3}
    assert res.kept == {"tool": 2, "media": 2, "nested_media": 2}
    out = res.messages
    for k in range(5):
        old = k < 3
        assert (by_id(out, f"r{k}")["content"] == CLEARED_TOOL_RESULT) is old
        user = out[1 + 5 * k]
        shot = by_id(out, f"s{k}")
        if old:
            assert user["content"] == [
                text(f"look {k}"),
                text("[Old inline media cleared: image/png]"),
            ]
            assert shot["content"] == [
                text(f"shot {k}"),
                text("[Old inline media cleared: image/jpeg]"),
            ]
        else:
            assert user["content"][1] == img()
            assert shot["content"][1] == img(JPEG)
    assert res.tokens_saved == before - history_tokens(out) > 0
    assert res.evicted_read_paths == ["/src/f0.py", "/src/f1.py", "/src/f2.py"]
    assert res.unresolved_evicted_reads == 0
    assert problems(out) == []


def test_placeholders_exact_and_other_fields_kept() -> None:
    res = micro_compact(history(2), keep=1, trigger="idle")
    cleared = by_id(res.messages, "r0")
    assert cleared == {
        "role": "tool",
        "tool_call_id": "r0",
        "name": "read_file",
        "content": "[Old tool result content cleared]",
    }
    assert res.messages[1]["content"][1] == {
        "type": "text",
        "text": "[Old inline media cleared: image/png]",
    }


def test_compactable_result_drops_nested_media_with_it() -> None:
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", "web_fetch", {})]},
        {"role": "tool", "tool_call_id": "a", "name": "web_fetch", "content": [text(BIG), img()]},
        {"role": "assistant", "content": None, "tool_calls": [call("b", "web_fetch", {})]},
        {"role": "tool", "tool_call_id": "b", "name": "web_fetch", "content": "recent"},
    ]
    res = micro_compact(msgs, keep=1, trigger="force")
    assert res.messages[2]["content"] == CLEARED_TOOL_RESULT
    assert res.cleared == {"tool": 1, "media": 0, "nested_media": 0}
    assert res.tokens_saved == estimate_tokens(BIG) + 1600 - estimate_tokens(CLEARED_TOOL_RESULT)
    assert res.evicted_read_paths == [] and res.unresolved_evicted_reads == 0


def test_non_compactable_tool_text_is_kept() -> None:
    msgs = history(3)
    res = micro_compact(msgs, keep=1, trigger="force")
    for k in range(2):
        shot = by_id(res.messages, f"s{k}")
        assert shot["content"][0] == text(f"shot {k}")
        assert shot["content"][1]["type"] == "text"
    assert by_id(res.messages, "s2")["content"] == [text("shot 2"), img(JPEG)]


def test_size_trigger_clears_only_tool_results() -> None:
    res = micro_compact(history(5), keep=2, trigger="size")
    assert res.cleared == {"tool": 3, "media": 0, "nested_media": 0}
    assert res.kept == {"tool": 2, "media": 5, "nested_media": 5}
    assert all(m["content"][1] == img() for m in res.messages if m["role"] == "user")


def test_error_results_never_cleared_and_take_no_slot() -> None:
    msgs = history(5)
    by_id(msgs, "r0")["is_error"] = True
    by_id(msgs, "r1")["content"] = "Error: file not found " + BIG
    by_id(msgs, "r2")["content"] = "Error: looks like one " + BIG
    by_id(msgs, "r2")["is_error"] = False  # the explicit flag wins over the prefix
    by_id(msgs, "s0")["is_error"] = True  # an erroring non-compactable tool keeps its media
    res = micro_compact(msgs, keep=2, trigger="force")
    out = res.messages
    assert by_id(out, "r0")["content"] == BIG
    assert by_id(out, "r1")["content"].startswith("Error: file not found")
    assert by_id(out, "r2")["content"] == CLEARED_TOOL_RESULT
    assert by_id(out, "r3")["content"] == BIG and by_id(out, "r4")["content"] == BIG
    assert by_id(out, "s0")["content"][1] == img(JPEG)
    # candidates s1..s4: the newest two (s3, s4) are kept
    assert by_id(out, "s1")["content"][1]["type"] == "text"
    assert by_id(out, "s2")["content"][1]["type"] == "text"
    assert res.cleared == {"tool": 1, "media": 3, "nested_media": 2}
    assert res.kept == {"tool": 4, "media": 2, "nested_media": 3}
    assert res.evicted_read_paths == ["/src/f2.py"]


def test_error_prefix_in_parts_and_leading_space() -> None:
    msgs = [
        {"role": "assistant", "content": None, "tool_calls": [call("a", "glob", {})]},
        {
            "role": "tool",
            "tool_call_id": "a",
            "name": "glob",
            "content": [text("  Error: x" + BIG)],
        },
        {"role": "assistant", "content": None, "tool_calls": [call("b", "glob", {})]},
        {"role": "tool", "tool_call_id": "b", "name": "glob", "content": BIG},
    ]
    res = micro_compact(msgs, keep=1, trigger="force")
    assert res.messages is msgs and res.tokens_saved == 0


def test_evicted_read_paths_and_unresolved() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("a", "read_file", {"file_path": "/a.py"}),
                call("b", "read_file", {"path": "/b.py"}),
                call("c", "read_file", "{not json"),
                call("d", "read_file", {"offset": 3}),
                call("e", "read_file", {"file_path": "/a.py"}),
            ],
        },
        # name recovered from the call when the tool message has none
        {"role": "tool", "tool_call_id": "a", "content": BIG},
        {"role": "tool", "tool_call_id": "b", "name": "read_file", "content": BIG},
        {"role": "tool", "tool_call_id": "c", "name": "read_file", "content": BIG},
        {"role": "tool", "tool_call_id": "d", "name": "read_file", "content": BIG},
        {"role": "tool", "tool_call_id": "e", "name": "read_file", "content": BIG},
        # a read whose call is not in the history at all (e.g. after a full compression)
        {"role": "tool", "tool_call_id": "zz", "name": "read_file", "content": BIG},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("k", "read_file", {"file_path": "/k"})],
        },
        {"role": "tool", "tool_call_id": "k", "name": "read_file", "content": BIG},
    ]
    res = micro_compact(msgs, keep=1, trigger="idle")
    assert res.cleared["tool"] == 6
    assert res.evicted_read_paths == ["/a.py", "/b.py"]  # deduplicated, in order
    assert res.unresolved_evicted_reads == 3  # c (bad JSON), d (no path), zz (no call)


def test_edit_and_write_results_are_evicted_like_reads_shell_results_are_not() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("w", "write_file", {"file_path": "/w.py", "content": "x"}),
                call("a", "edit", {"file_path": "/e.py"}),
                call("b", "run_shell_command", {}),
                call("c", "grep_search", {}),
                call("d", "my_tool", {}),
            ],
        },
        {"role": "tool", "tool_call_id": "w", "name": "write_file", "content": BIG},
        {"role": "tool", "tool_call_id": "a", "name": "edit", "content": BIG},
        {"role": "tool", "tool_call_id": "b", "name": "run_shell_command", "content": BIG},
        {"role": "tool", "tool_call_id": "c", "name": "grep_search", "content": BIG},
        {"role": "tool", "tool_call_id": "d", "name": "my_tool", "content": BIG},
    ]
    res = micro_compact(msgs, keep=1, trigger="force")
    assert [m["content"] == CLEARED_TOOL_RESULT for m in res.messages[1:]] == [
        True,
        True,
        True,
        False,
        False,
    ]
    # upstream (issue #4239): a cleared edit / write_file result disarms that file's read cache
    assert res.evicted_read_paths == ["/w.py", "/e.py"] and res.unresolved_evicted_reads == 0


def test_small_results_are_not_replaced() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("a", "glob", {}), call("b", "glob", {})],
        },
        {"role": "tool", "tool_call_id": "a", "name": "glob", "content": "a.py"},
        {"role": "tool", "tool_call_id": "b", "name": "glob", "content": "b.py"},
    ]
    res = micro_compact(msgs, keep=1, trigger="force")
    assert res.messages is msgs
    assert res.cleared == {"tool": 0, "media": 0, "nested_media": 0}
    assert res.kept["tool"] == 2


def test_strip_reasoning() -> None:
    msgs = history(3)
    for m in msgs:
        if m["role"] == "assistant":
            m["reasoning_content"] = "thinking hard " * 20
    msgs[2]["thinking"] = "more"
    msgs[2]["reasoning"] = "and more"
    res = micro_compact(msgs, keep=10, trigger="force", strip_reasoning=True)
    assistants = [m for m in res.messages if m["role"] == "assistant"]
    assert all(
        not ({"reasoning_content", "reasoning", "thinking"} & m.keys()) for m in assistants[:-1]
    )
    assert assistants[-1]["reasoning_content"] == "thinking hard " * 20
    assert res.reasoning_stripped == len(assistants) - 1
    assert res.cleared == {"tool": 0, "media": 0, "nested_media": 0}
    assert res.tokens_saved == history_tokens(msgs) - history_tokens(res.messages) > 0
    # without the flag the reasoning stays and nothing else is old enough: a no-op
    assert micro_compact(msgs, keep=10, trigger="force").messages is msgs


def test_noop_returns_same_object_with_zero_counts() -> None:
    msgs = history(3)
    res = micro_compact(msgs, keep=5, trigger="force")
    assert res.messages is msgs
    assert res.tokens_saved == 0 and not res.changed
    assert res.cleared == {"tool": 0, "media": 0, "nested_media": 0}
    assert res.evicted_read_paths == [] and res.unresolved_evicted_reads == 0
    assert micro_compact([], trigger="idle").messages == []


def test_second_pass_is_a_noop() -> None:
    first = micro_compact(history(5), keep=2, trigger="force")
    second = micro_compact(first.messages, keep=2, trigger="force")
    assert second.messages is first.messages and second.tokens_saved == 0
    assert second.kept == {"tool": 2, "media": 2, "nested_media": 2}


def test_keep_floor_is_one() -> None:
    res = micro_compact(history(3), keep=0, trigger="force")
    assert res.kept == {"tool": 1, "media": 1, "nested_media": 1}


def test_input_not_mutated() -> None:
    msgs = history(5)
    for m in msgs:
        if m["role"] == "assistant":
            m["reasoning_content"] = "r"
    snapshot = copy.deepcopy(msgs)
    ids = [id(m) for m in msgs]
    res = micro_compact(msgs, keep=1, trigger="force", strip_reasoning=True)
    assert res.messages is not msgs
    assert msgs == snapshot
    assert [id(m) for m in msgs] == ids


def test_media_mime_fallbacks() -> None:
    assert media_mime(img("https://example.com/a.png")) == "image"
    assert media_mime(img("data:image/we[ird]\n;base64,AAAA")) == "image/weird"
    assert (
        media_mime({"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}})
        == "audio/wav"
    )
    assert media_mime({"type": "image_url", "image_url": "data:image/gif;base64,AA"}) == "image/gif"


def test_estimates() -> None:
    assert message_tokens({"role": "user", "content": "abcd" * 10}) == 4 + 10
    assert message_tokens({"role": "user", "content": [text("abcd"), img()]}) == 4 + 1 + 1600
    assert message_tokens({"role": "user", "content": [img()]}, image_tokens=10) == 14
    assert message_tokens({"role": "assistant", "content": None}) == 4
    fn_call = call("x", "read_file", '{"file_path": "/a"}')
    expected = 4 + estimate_tokens("read_file" + '{"file_path": "/a"}')
    assert (
        message_tokens({"role": "assistant", "content": None, "tool_calls": [fn_call]}) == expected
    )
    assert message_tokens({"role": "assistant", "content": "", "reasoning_content": "abcd"}) == 5
    assert message_tokens({"role": "user", "content": "你好"}) == 4 + 2
    assert history_tokens([{"role": "user", "content": "abcd"}] * 3) == 15


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"now": 3_600.0, "last_model_reply_at": 0.0, "idle_minutes": 60}, "idle"),
        ({"now": 3_599.0, "last_model_reply_at": 0.0, "idle_minutes": 60}, None),
        ({"now": 1e9, "last_model_reply_at": 0.0, "idle_minutes": -1}, None),
        ({"now": 1e9, "last_model_reply_at": None, "idle_minutes": 60}, None),
        ({"now": 10.0, "last_model_reply_at": 0.0, "idle_minutes": 60, "tool_chars": 100}, "size"),
        ({"now": 10.0, "last_model_reply_at": 0.0, "idle_minutes": 60, "tool_chars": 99}, None),
        (
            {"now": 1e9, "last_model_reply_at": 0.0, "idle_minutes": 1, "tool_chars": 1_000},
            "idle",
        ),
        (
            {
                "now": 0.0,
                "last_model_reply_at": None,
                "idle_minutes": 60,
                "tool_chars": 10**9,
                "size_threshold": -1,
            },
            None,
        ),
    ],
)
def test_triggers(kw: dict[str, Any], expected: str | None) -> None:
    args = {"tool_chars": 0, "size_threshold": 100, **kw}
    assert should_micro_compact(**args) == expected


def test_tool_result_chars() -> None:
    msgs = history(2)
    assert tool_result_chars(msgs) == 2 * len(BIG) + len("shot 0") + len("shot 1")


def test_micro_compact_if_due_decides_and_compacts_in_one_call() -> None:
    msgs = history(8)
    due = {"now": 10.0, "last_model_reply_at": 0.0, "idle_minutes": 60, "keep": 2}
    # no trigger due: nothing to do
    assert micro_compact_if_due(msgs, tool_chars=0, size_threshold=10**9, **due) is None
    # the size trigger fires: the same result as micro_compact for it, its trigger named
    r = micro_compact_if_due(msgs, tool_chars=tool_result_chars(msgs), size_threshold=1, **due)
    assert r is not None and r.trigger == "size"
    assert r == micro_compact(msgs, keep=2, trigger="size")
    # a trigger fires but clearing saves nothing: None
    assert micro_compact_if_due(r.messages, tool_chars=1, size_threshold=1, **due) is None
