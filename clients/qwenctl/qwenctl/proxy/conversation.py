"""Read a client's chat-completions ``messages`` into what the daemon takes: the client's
system prompt, the dialogue (validated, with unknown message fields refused), the key that
names the conversation, and the dialogue cut into the steps a daemon session records
(user turns, model replies, tool results)."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_FIELDS = frozenset({
    "role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning",
    "refusal", "function_call", "audio", "annotations", "prefix",
})
SESSION_NAMESPACE = uuid.UUID("6b0f3c52-56a4-4b8e-9a38-3f2c7e1d9a11")
NO_RESULT = "[no result: the client sent none for this call]"


class BadRequest(Exception):
    """The request is malformed; ``param`` names the offending field (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return ""


@dataclass
class Conversation:
    system: str
    dialogue: list[dict[str, Any]]  # non-system messages; later system messages become user

    @property
    def first_user(self) -> Any:
        return next((m.get("content") for m in self.dialogue if m["role"] == "user"), None)

    def conversation_id(self, cwd: str) -> str:
        """Same project, system prompt and first user message → the same session id."""
        return str(uuid.uuid5(SESSION_NAMESPACE, _canon([cwd, self.system, self.first_user])))


def parse(messages: Any) -> Conversation:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    system_parts: list[str] = []
    dialogue: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object", where)
        if not m.keys() <= MESSAGE_FIELDS:  # every message of every request: the C check first
            unknown = sorted(set(m) - MESSAGE_FIELDS)
            raise BadRequest(f"{where} has unknown field {unknown[0]!r}", f"{where}.{unknown[0]}")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(f"{where}.content must be a string or a list of parts",
                             f"{where}.content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise BadRequest(f"{where}.content[{j}] must be a part with a type",
                                     f"{where}.content[{j}]")
        if role == "system":
            if not dialogue:
                system_parts.append(text_of(content))
            else:
                dialogue.append({"role": "user", "content": text_of(content)})
            continue
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise BadRequest(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
        if role == "assistant" and m.get("tool_calls") is not None:
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("id"), str)
                    and isinstance(c.get("function"), dict) for c in calls):
                raise BadRequest(f"{where}.tool_calls must be a list of calls with id and "
                                 "function", f"{where}.tool_calls")
        if role == "user" and content is None:
            raise BadRequest(f"{where}.content is missing", f"{where}.content")
        dialogue.append(m)
    if not dialogue:
        raise BadRequest("messages hold no user message", "messages")
    if dialogue[-1]["role"] == "assistant":
        raise BadRequest("the last message must be the user's input or tool results, not an "
                         "assistant message", f"messages[{len(messages) - 1}].role")
    return Conversation(system="\n\n".join(p for p in system_parts if p), dialogue=dialogue)


_SORTED = msgspec.json.Encoder(order="sorted")


def fingerprint(m: dict[str, Any]) -> bytes:
    """Loose identity of a client message: assistant replies by their tool-call ids only
    (clients re-serialise replies in their own way), others by role and content. Every
    request fingerprints its whole history, so this is kept cheap: plain text is hashed as
    it is, anything else as sorted-key JSON (msgspec); the identities live only in this
    process's memory."""
    role = m["role"]
    if role == "assistant":
        key = b"a" + _SORTED.encode([c.get("id") for c in m.get("tool_calls") or []])
    elif role == "tool":
        key = b"t" + _SORTED.encode([m.get("tool_call_id"), m.get("content")])
    else:
        content = m.get("content")
        key = b"us" + content.encode("utf-8", "surrogatepass") if isinstance(content, str) \
            else b"uj" + _SORTED.encode(content)
    return hashlib.sha1(key).digest()


@dataclass
class Step:
    kind: str  # "user" | "tool_results" | "assistant"
    text: str | None = None
    images: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    message: dict[str, Any] | None = None

    def turn_params(self, session_id: str) -> dict[str, Any]:
        p: dict[str, Any] = {"session_id": session_id, "kind": self.kind}
        if self.kind == "tool_results":
            p["tool_results"] = self.results
        if self.text:
            p["text"] = self.text
        if self.images:
            p["images"] = self.images
        return p


def _split_user(content: Any) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(content, str):
        return content, []
    texts, media = [], []
    for part in content or []:
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        else:
            media.append(part)
    return "\n".join(texts), media


def assistant_record(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": text_of(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": c.get("type") or "function",
                              "function": c["function"]} for c in m["tool_calls"]]
    if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
        out["reasoning_content"] = m["reasoning_content"]
    return out


def steps(messages: list[dict[str, Any]], pending: list[str]) -> list[Step]:
    """Cut dialogue messages into daemon steps. ``pending``: the call ids awaiting results
    before the first message. Consecutive user messages merge; tool results answer exactly
    the pending calls (a missing one gets a placeholder, a stray one is dropped); tool
    results with no call to answer, or user words right after results, ride as text."""
    out: list[Step] = []
    i, n = 0, len(messages)
    while i < n:
        role = messages[i]["role"]
        j = i
        while j < n and messages[j]["role"] == role:
            j += 1
        group = messages[i:j]
        if role == "assistant":
            rec = assistant_record(group[-1])
            if len(group) > 1:
                rec["content"] = "\n\n".join(text_of(m.get("content")) for m in group)
            out.append(Step("assistant", message=rec))
            pending = [c["id"] for c in rec.get("tool_calls") or []]
        elif role == "user":
            texts, media = zip(*(_split_user(m.get("content")) for m in group), strict=True)
            out.append(Step("user", text="\n\n".join(t for t in texts if t) or None,
                            images=[p for ms in media for p in ms]))
            pending = []
        else:  # tool results, and user words that follow them
            k = j
            while k < n and messages[k]["role"] == "user":
                k += 1
            words = "\n\n".join(_split_user(m.get("content"))[0] for m in messages[j:k])
            by_id = {m["tool_call_id"]: m for m in group}
            if pending:
                results = []
                for cid in pending:
                    m = by_id.get(cid)
                    content = m.get("content") if m is not None else NO_RESULT
                    r: dict[str, Any] = {"tool_call_id": cid,
                                         "content": content if content is not None else ""}
                    if m is not None and isinstance(m.get("name"), str):
                        r["name"] = m["name"]
                    results.append(r)
                out.append(Step("tool_results", results=results, text=words or None))
            else:
                shown = "\n\n".join(f"[tool result {m['tool_call_id']}]\n{text_of(m.get('content'))}"
                                    for m in group)
                out.append(Step("user", text="\n\n".join(x for x in (shown, words) if x)))
            pending = []
            j = k
        i = j
    return out
