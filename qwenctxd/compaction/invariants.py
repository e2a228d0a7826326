"""History invariants: what a chat history sent to a model must satisfy, and how to restore them.

:func:`problems` is the validator; :func:`repair` rewrites any history into one it accepts.
Both are pure; ``repair`` never mutates its input (changed messages are copies, unchanged ones
are shared with the input list).

The invariants (the turn structure Qwen's chat template and OpenAI-compatible endpoints enforce):

1. a ``system`` message only at index 0;
2. no two adjacent ``user`` messages and no two adjacent ``assistant`` messages;
3. every assistant ``tool_calls`` entry has a non-empty string ``id``, unique in that message,
   and the list is non-empty when present;
4. every tool call is answered by a ``tool`` message with that ``tool_call_id`` before the next
   non-tool message (with ``allow_pending_tail``, the calls of the last assistant message may
   still be pending at the end of the history: their results are on their way);
5. no ``tool`` message without a pending call of the preceding assistant message to answer
   (an orphan, or a second answer to the same call);
6. no empty assistant message without tool calls (content ``None``, blank text, or a parts
   list with neither non-blank text nor any non-text part);
7. every role is one of system / user / assistant / tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ROLES", "is_empty_content", "problems", "repair"]

Message = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


def is_empty_content(content: Any) -> bool:
    """True for ``None``, blank text, or a parts list with no non-blank text and no other part."""
    if content is None:
        return True
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return False
            text = part.get("text")
            if isinstance(text, str) and text.strip():
                return False
        return True
    return False


def _call_ids(calls: list[Any]) -> tuple[list[str], list[str]]:
    """(valid unique ids in order, descriptions of bad entries) of a ``tool_calls`` list."""
    ids: list[str] = []
    bad: list[str] = []
    for j, call in enumerate(calls):
        call_id = call.get("id") if isinstance(call, dict) else None
        if not isinstance(call_id, str) or not call_id:
            bad.append(f"tool_calls[{j}] has no id")
        elif call_id in ids:
            bad.append(f"tool_calls[{j}] repeats id {call_id!r}")
        else:
            ids.append(call_id)
    return ids, bad


def problems(messages: Sequence[Message], *, allow_pending_tail: bool = False) -> list[str]:
    """Every invariant violation in ``messages`` (see the module docstring); empty when valid."""
    out: list[str] = []
    pending: dict[str, None] = {}
    owner = -1
    prev_role: Any = None
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ROLES:
            out.append(f"[{i}]: unknown role {role!r}")
            prev_role = role
            continue
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if isinstance(call_id, str) and call_id in pending:
                del pending[call_id]
            else:
                out.append(f"[{i}]: tool message {call_id!r} answers no pending tool call")
            prev_role = role
            continue
        if pending:
            out.append(f"[{owner}]: tool calls {list(pending)} unanswered before [{i}]")
            pending.clear()
        if role == "system" and i != 0:
            out.append(f"[{i}]: system message not at index 0")
        if role == prev_role and role in ("user", "assistant"):
            out.append(f"[{i - 1}], [{i}]: two consecutive {role} messages")
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                out.append(f"[{i}]: tool_calls is not a list")
                calls = None
            if isinstance(calls, list):
                if not calls:
                    out.append(f"[{i}]: empty tool_calls list")
                ids, bad = _call_ids(calls)
                out.extend(f"[{i}]: {b}" for b in bad)
                pending = dict.fromkeys(ids)
                owner = i
            if not calls and is_empty_content(msg.get("content")):
                out.append(f"[{i}]: empty assistant message without tool calls")
        prev_role = role
    if pending and not allow_pending_tail:
        out.append(f"[{owner}]: tool calls {list(pending)} never answered")
    return out


# --- repair -------------------------------------------------------------------------------


def _as_parts(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return list(content)
    return [content]


def _merge_content(a: Any, b: Any) -> Any:
    """Concatenate two contents: text with a blank line between, else as a parts list."""
    if a is None or a == "" or a == []:
        return b
    if b is None or b == "" or b == []:
        return a
    if isinstance(a, str) and isinstance(b, str):
        return f"{a}\n\n{b}"
    return _as_parts(a) + _as_parts(b)


def _merge(a: Message, b: Message) -> Message:
    """Merge ``b`` into a copy of ``a`` (same role): content, tool calls and reasoning joined."""
    merged = {**b, **a}
    merged["content"] = _merge_content(a.get("content"), b.get("content"))
    calls = [c for m in (a, b) if isinstance(m.get("tool_calls"), list) for c in m["tool_calls"]]
    if calls:
        merged["tool_calls"] = calls
    for key in ("reasoning_content", "reasoning", "thinking"):
        ra, rb = a.get(key), b.get(key)
        if isinstance(ra, str) and isinstance(rb, str) and ra and rb:
            merged[key] = f"{ra}\n\n{rb}"
        elif ra in (None, "") and rb is not None:
            merged[key] = rb
    return merged


def _merge_adjacent(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    for msg in messages:
        if out and msg["role"] in ("user", "assistant") and out[-1]["role"] == msg["role"]:
            out[-1] = _merge(out[-1], msg)
        else:
            out.append(msg)
    return out


def _normalize_roles(messages: Sequence[Message]) -> list[Message]:
    """Leading system messages merged into one; later ones become user messages; bad roles go."""
    out: list[Message] = []
    for msg in messages:
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ROLES:
            continue
        if role == "system":
            if len(out) == 1 and out[0]["role"] == "system":
                out[0] = _merge(out[0], msg)
                continue
            if out:
                msg = {**msg, "role": "user"}
        out.append(msg)
    return out


def _valid_calls(msg: Message) -> list[Any]:
    """The tool calls of an assistant message with an id, first occurrence of each id."""
    calls = msg.get("tool_calls")
    if not isinstance(calls, list):
        return []
    seen: set[str] = set()
    valid = []
    for call in calls:
        call_id = call.get("id") if isinstance(call, dict) else None
        if isinstance(call_id, str) and call_id and call_id not in seen:
            seen.add(call_id)
            valid.append(call)
    return valid


def _with_calls(msg: Message, calls: list[Any]) -> Message | None:
    """``msg`` with ``calls`` as its tool calls; None when it would be an empty message."""
    if calls:
        if calls == msg.get("tool_calls"):
            return msg
        return {**msg, "tool_calls": calls}
    if is_empty_content(msg.get("content")):
        return None
    if msg.get("tool_calls") is None:
        return msg
    return {k: v for k, v in msg.items() if k != "tool_calls"}


def _pair_tool_calls(messages: list[Message], keep_trailing: bool) -> list[Message]:
    out: list[Message] = []
    n = len(messages)
    i = 0
    while i < n:
        msg = messages[i]
        role = msg["role"]
        if role == "tool":  # not inside an assistant's run: an orphan
            i += 1
            continue
        if role != "assistant":
            out.append(msg)
            i += 1
            continue
        calls = _valid_calls(msg)
        by_id = {c["id"]: c for c in calls}
        end = i + 1
        while end < n and messages[end]["role"] == "tool":
            end += 1
        answers: list[Message] = []
        answered: set[str] = set()
        for tool in messages[i + 1 : end]:
            call_id = tool.get("tool_call_id")
            if isinstance(call_id, str) and call_id in by_id and call_id not in answered:
                answered.add(call_id)
                answers.append(tool)
        if not (keep_trailing and end == n):
            calls = [c for c in calls if c["id"] in answered]
        kept = _with_calls(msg, calls)
        if kept is not None:
            out.append(kept)
            out.extend(answers)
        i = end
    return out


def repair(messages: Sequence[Message], *, drop_trailing_unanswered: bool) -> list[Message]:
    """A copy of ``messages`` that satisfies every invariant of :func:`problems`.

    In order: messages with an unknown role are dropped; leading system messages are merged
    and a later system message becomes a user message; adjacent user (or assistant) messages
    are merged (text joined with a blank line, otherwise as one parts list; tool calls and
    reasoning concatenated); tool calls without an id or repeating an id are dropped; tool
    messages that answer no pending call of the assistant message right before them (orphans,
    duplicates) are removed; unanswered calls are dropped — except, when
    ``drop_trailing_unanswered`` is False, those of an assistant message whose results run to
    the end of the history (they are pending); an assistant message left with neither tool calls
    nor content is removed; finally the neighbours that removal brought together are merged.

    The result passes ``problems(result) == []`` with ``drop_trailing_unanswered=True``, and
    ``problems(result, allow_pending_tail=True) == []`` otherwise. A valid history is returned
    unchanged (equal, with the same message objects).
    """
    msgs = _normalize_roles(messages)
    msgs = _merge_adjacent(msgs)
    msgs = _pair_tool_calls(msgs, keep_trailing=not drop_trailing_unanswered)
    return _merge_adjacent(msgs)
