"""A strict validator for OpenAI chat-completions request bodies (pure, no I/O).

Real endpoints (and the chat templates behind them, e.g. Qwen's) refuse or silently mangle
conversations that break the turn structure: two user turns in a row, a system message in the
middle, a tool result nobody asked for, or a tool call that is never answered. Tests use
:func:`validate_chat_body` directly, and ``ScriptedOpenAI(strict_chat=True)`` uses it to answer
HTTP 400 so a daemon bug that builds such a conversation fails loudly.

:func:`validate_payload` checks what real servers reject about the *payload* rather than the
conversation (reference/real-endpoints.md): ``"content": null`` (llama.cpp: HTTP 500), tools
without ``tool_choice`` (llama.cpp hides them), a missing ``max_tokens`` (a tiny model rambles to
the whole context) and prompt + ``max_tokens`` over the context window (vLLM: HTTP 400). The
scripted server applies it by default (``ScriptedOpenAI(strict_payload=True)``).
"""

from __future__ import annotations

import json
from typing import Any

from qwenctxd.tokens import estimate_tokens

__all__ = ["DEFAULT_STUB_CONTEXT", "validate_chat_body", "validate_payload"]

#: the context window the scripted server assumes (the daemon's own default window)
DEFAULT_STUB_CONTEXT = 131_072

_ROLES = ("system", "user", "assistant", "tool")


def _content_ok(content: Any, *, allow_none: bool) -> bool:
    if content is None:
        return allow_none
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) for p in content)


def _check_tool_calls(where: str, calls: Any, problems: list[str]) -> list[str]:
    """Validate an assistant ``tool_calls`` list; return the ids it declares."""
    if not isinstance(calls, list) or not calls:
        problems.append(f"{where}: tool_calls must be a non-empty list when present")
        return []
    ids: list[str] = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            problems.append(f"{at}: must be an object")
            continue
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            problems.append(f"{at}: id must be a non-empty string")
        elif call_id in ids:
            problems.append(f"{at}: duplicate tool call id {call_id!r}")
        else:
            ids.append(call_id)
        if call.get("type", "function") != "function":
            problems.append(f"{at}: type must be 'function'")
        fn = call.get("function")
        if not isinstance(fn, dict):
            problems.append(f"{at}: function must be an object")
            continue
        if not isinstance(fn.get("name"), str) or not fn.get("name"):
            problems.append(f"{at}: function.name must be a non-empty string")
        if not isinstance(fn.get("arguments"), str):
            problems.append(f"{at}: function.arguments must be a JSON-encoded string")
    return ids


def validate_chat_body(body: Any) -> list[str]:
    """Every problem that makes ``body`` an invalid chat-completions request (empty when valid).

    Rules: ``model`` is a non-empty string; ``messages`` is a non-empty list; each role is one of
    system/user/assistant/tool; a system message may only come first; no two consecutive user
    or assistant messages; an assistant message has content or tool_calls; tool messages follow
    an assistant message with tool_calls, answer one of its still-pending ids, and every id is
    answered before the next non-tool message (or the end of the conversation).
    """
    if not isinstance(body, dict):
        return ["body must be a JSON object"]
    problems: list[str] = []
    model = body.get("model")
    if not isinstance(model, str) or not model:
        problems.append("model must be a non-empty string")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        problems.append("tools must be a list when present")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        problems.append("messages must be a non-empty list")
        return problems

    pending: dict[str, int] = {}  # unanswered tool call id -> index of the assistant message
    prev_role: str | None = None
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            problems.append(f"{where}: must be an object")
            prev_role = None
            continue
        role = msg.get("role")
        if role not in _ROLES:
            problems.append(f"{where}: role {role!r} is not one of {', '.join(_ROLES)}")
            prev_role = None
            continue
        if role != "tool" and pending:
            owner = min(pending.values())
            problems.append(
                f"{where}: tool call(s) {sorted(pending)} from messages[{owner}] are not "
                f"answered by tool messages before this {role} message"
            )
            pending.clear()

        if role == "system":
            if i != 0:
                problems.append(f"{where}: a system message is only allowed as the first message")
            if not _content_ok(msg.get("content"), allow_none=False):
                problems.append(f"{where}: system content must be a string or a list of parts")
        elif role == "user":
            if prev_role == "user":
                problems.append(
                    f"{where}: two consecutive user messages (messages[{i - 1}] and {where})"
                )
            if not _content_ok(msg.get("content"), allow_none=False):
                problems.append(f"{where}: user content must be a string or a list of parts")
        elif role == "assistant":
            if prev_role == "assistant":
                problems.append(
                    f"{where}: two consecutive assistant messages (messages[{i - 1}] and {where})"
                )
            content = msg.get("content")
            if not _content_ok(content, allow_none=True):
                problems.append(f"{where}: assistant content must be a string, a list or null")
            if "tool_calls" in msg and msg["tool_calls"] is not None:
                for call_id in _check_tool_calls(where, msg["tool_calls"], problems):
                    pending[call_id] = i
            elif content is None or content == "":
                problems.append(f"{where}: assistant message needs content or tool_calls")
        else:  # tool
            call_id = msg.get("tool_call_id")
            if prev_role not in ("assistant", "tool"):
                problems.append(
                    f"{where}: a tool message must follow an assistant message with tool_calls"
                )
            if not isinstance(call_id, str) or not call_id:
                problems.append(f"{where}: tool message needs a tool_call_id")
            elif call_id not in pending:
                problems.append(f"{where}: tool_call_id {call_id!r} matches no pending tool call")
            else:
                del pending[call_id]
            if not _content_ok(msg.get("content"), allow_none=False):
                problems.append(f"{where}: tool content must be a string or a list of parts")
        prev_role = role

    if pending:
        owner = min(pending.values())
        problems.append(
            f"tool call(s) {sorted(pending)} from messages[{owner}] are never answered by a tool message"
        )
    return problems


def validate_payload(body: Any, *, context_window: int = DEFAULT_STUB_CONTEXT) -> list[str]:
    """What a real server rejects about ``body`` beyond the conversation's structure.

    The prompt is estimated as the daemon's token estimator counts the JSON of messages and
    tools (without the daemon's safety factor, so a correctly sized request always passes).
    """
    if not isinstance(body, dict):
        return ["body must be a JSON object"]
    problems: list[str] = []
    messages = body.get("messages")
    for i, msg in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(msg, dict) and "content" in msg and msg["content"] is None:
            problems.append(f"messages[{i}]: content is null (send \"\" instead)")
        elif isinstance(msg, dict) and msg.get("role") == "assistant" and "content" not in msg:
            problems.append(f"messages[{i}]: assistant message without a content key")
    if body.get("tools") and body.get("tool_choice") is None:
        problems.append("tools sent without tool_choice")
    for i, tool in enumerate(body.get("tools") or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("parameters"), dict):
            # llama.cpp's chat templates read function.parameters: HTTP 500 without it
            problems.append(f"tools[{i}].function has no parameters object")
    limit = body.get("max_tokens", body.get("max_completion_tokens"))
    if limit is None:
        problems.append("max_tokens is missing")
    elif not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        problems.append("max_tokens must be a positive integer")
    else:
        text = json.dumps(messages if isinstance(messages, list) else [], ensure_ascii=False)
        if body.get("tools"):
            text += json.dumps(body["tools"], ensure_ascii=False)
        prompt = estimate_tokens(text)
        if prompt + limit > context_window:
            problems.append(
                f"prompt (~{prompt} tokens) + max_tokens ({limit}) exceeds the context window "
                f"({context_window})"
            )
    return problems
