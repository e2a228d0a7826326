"""A checker for the agent-loop contract (docs/protocol.md, C1–C5) over AssembledPrompts.

Any suite that drives ``session.turn`` can call :func:`contract_problems` on each prompt it
gets back and assert the list is empty. The checks are structural (they do not need the
daemon): C1 turn structure, C2 the last message is the input the caller just sent, C4 no null
content and reasoning only after the latest user message (unless ``keep_reasoning="all"``),
C5 the system prompt names no agent product and no undeclared tool of the Qwen Code set.
C3 (the reply is recordable) is checked by the caller recording it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking", "reasoning_details")
#: Tool names of Qwen Code's own tool set: C5 forbids naming them unless declared.
QWEN_TOOL_NAMES = ("todo_write", "read_file", "grep_search", "run_shell_command",
                   "list_directory", "write_file", "read_many_files", "web_fetch",
                   "save_memory", "glob")
PRODUCT_NAMES = ("Qwen Code", "Claude Code", "Gemini CLI")


def _calls(msg: Mapping[str, Any]) -> list[str]:
    return [c.get("id") for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)]


def is_reminder_only(content: Any) -> bool:
    """True for a user content made only of ``<system-reminder>`` text parts."""
    if isinstance(content, str):
        return content.lstrip().startswith("<system-reminder>")
    if not isinstance(content, list) or not content:
        return False
    return all(isinstance(p, Mapping) and p.get("type") == "text"
               and str(p.get("text", "")).lstrip().startswith("<system-reminder>")
               for p in content)


def c1_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Turn structure: user first, user/assistant alternate, tool results right after their
    call, every call answered before the next non-tool message."""
    out: list[str] = []
    if not messages:
        return ["C1: no messages"]
    if messages[0].get("role") != "user":
        out.append(f"C1: first message is {messages[0].get('role')!r}, not user")
    pending: set[str] = set()
    last_turn_role: str | None = None  # the last user/assistant role seen
    prev: str | None = None
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id")
            if prev not in ("assistant", "tool") or cid not in pending:
                out.append(f"C1: [{i}] tool message {cid!r} answers no pending call")
            pending.discard(cid)
        elif role in ("user", "assistant"):
            if pending:
                out.append(f"C1: [{i}] {role} before calls {sorted(pending)} were answered")
                pending = set()
            if role == last_turn_role and prev != "tool":
                out.append(f"C1: [{i - 1}], [{i}] two {role} messages in a row")
            if role == "assistant":
                pending = {c for c in _calls(m) if c}
            last_turn_role = role
        else:
            out.append(f"C1: [{i}] role {role!r} in messages")
        prev = role
    return out


def c2_problems(messages: Sequence[Mapping[str, Any]], *, kind: str,
                text: str | None = None, tool_call_ids: Iterable[str] = ()) -> list[str]:
    """The last message is this turn's input: the user's words, or this turn's results
    (optionally followed by one user message that carries only reminders or the caller's text)."""
    if not messages:
        return ["C2: no messages"]
    last = messages[-1]
    if kind in ("user", "cron"):
        if last.get("role") != "user":
            return [f"C2: last message is {last.get('role')!r}, not the user turn"]
        if text and text not in _text(last.get("content")):
            return ["C2: the user's words are not in the last message"]
        return []
    ids = set(tool_call_ids)
    tail = list(messages)
    if last.get("role") == "user":
        if not (is_reminder_only(last.get("content"))
                or (text and text in _text(last.get("content")))):
            return ["C2: a user message after the tool results carries more than reminders"]
        tail = tail[:-1]
    got: set[str] = set()
    while tail and tail[-1].get("role") == "tool":
        got.add(str(tail[-1].get("tool_call_id")))
        tail.pop()
    if not got:
        return ["C2: the prompt does not end with this turn's tool results"]
    if ids - got:
        return [f"C2: results {sorted(ids - got)} are not at the end of the prompt"]
    return []


def c4_problems(messages: Sequence[Mapping[str, Any]], keep_reasoning: str = "current_turn"
                ) -> list[str]:
    out: list[str] = []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        if "content" not in m or m["content"] is None:
            out.append(f"C4: [{i}] assistant message with null content")
        has = [k for k in REASONING_KEYS if k in m]
        if has and (keep_reasoning == "none"
                    or (keep_reasoning == "current_turn" and i < last_user)):
            out.append(f"C4: [{i}] keeps {has} from before the latest user message")
    return out


def c5_problems(system: str, declared: Iterable[str], agent_name: str | None = None
                ) -> list[str]:
    out: list[str] = []
    names = set(declared)
    for product in PRODUCT_NAMES:
        if product in system and product != agent_name:
            out.append(f"C5: the system prompt names {product!r}")
    for tool in QWEN_TOOL_NAMES:
        if tool not in names and re.search(rf"\b{re.escape(tool)}\b", system):
            out.append(f"C5: the system prompt names undeclared tool {tool!r}")
    return out


def contract_problems(prompt: Mapping[str, Any], *, kind: str, text: str | None = None,
                      tool_call_ids: Iterable[str] = (), keep_reasoning: str = "current_turn",
                      agent_name: str | None = None, check_system: bool = True) -> list[str]:
    """Every C1/C2/C4/C5 violation in one AssembledPrompt (a dict as the socket returns it)."""
    messages = prompt["messages"]
    declared = [(t.get("function") or {}).get("name") for t in prompt.get("tools") or []]
    out = c1_problems(messages)
    out += c2_problems(messages, kind=kind, text=text, tool_call_ids=tool_call_ids)
    out += c4_problems(messages, keep_reasoning)
    if check_system:
        out += c5_problems(prompt["system"], [d for d in declared if d], agent_name)
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""
