"""Property: for random histories, the post-compact history is always a valid conversation
(no two same-role messages in a row, no tool call without its result except a pending tail)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.compaction.invariants import problems, repair
from qwenctxd.compaction.post_compact import build_post_compact_history, pending_tool_call

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@st.composite
def histories(draw: st.DrawFn) -> list[dict]:
    msgs: list[dict] = []
    n = draw(st.integers(min_value=0, max_value=25))
    call_no = 0
    for _ in range(n):
        kind = draw(st.sampled_from(["user", "user_img", "assistant", "calls", "tool"]))
        if kind == "user":
            msgs.append({"role": "user", "content": draw(st.text(max_size=20))})
        elif kind == "user_img":
            msgs.append({"role": "user", "content": [{"type": "text", "text": "see"}, IMG]})
        elif kind == "assistant":
            msgs.append({"role": "assistant", "content": draw(st.text(min_size=1, max_size=20))})
        elif kind == "calls":
            k = draw(st.integers(min_value=1, max_value=3))
            calls = []
            for _ in range(k):
                call_no += 1
                name = draw(st.sampled_from(["read_file", "edit", "run_shell_command"]))
                calls.append({"id": f"c{call_no}", "type": "function", "function": {
                    "name": name, "arguments": json.dumps({"file_path": f"f{call_no}.py"})}})
            msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
        else:
            content = draw(st.sampled_from(["out", [{"type": "text", "text": "shot"}, IMG]]))
            msgs.append({"role": "tool", "tool_call_id": f"c{max(call_no, 1)}",
                         "content": content})
    return msgs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), keep_pending=st.booleans(), summary=st.text(max_size=50))
def test_post_compact_history_is_always_valid(history: list[dict], keep_pending: bool,
                                              summary: str) -> None:
    valid = repair(history, drop_trailing_unanswered=not keep_pending)
    pending = pending_tool_call(valid) if keep_pending else None
    new, _info = build_post_compact_history(summary or "[Summary unavailable]",
                                            original_history=valid,
                                            workspace_root=Path("/nonexistent-root"),
                                            pending_tool_call=pending)
    assert problems(new, allow_pending_tail=True) == []
    assert new[0]["role"] == "user"
    roles = [m["role"] for m in new]
    assert all(a != b or a == "tool" for a, b in zip(roles, roles[1:], strict=False))
    if pending is not None:
        assert new[-1]["role"] == "assistant" and new[-1].get("tool_calls")
