"""Read a client's chat-completions ``messages`` into what the daemon takes: the client's
system prompt, the dialogue (validated, with unknown message fields refused), the key that
names the conversation, and the dialogue cut into the steps a daemon session records
(user turns, model replies, tool results)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
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
    """A request's messages as read: the client's system prompt, the role and
    :func:`fingerprint` of each dialogue message (non-system messages; later system messages
    become user ones), and the dialogue messages themselves from ``tail_start`` on. A request
    read on from the same conversation's last one (:mod:`qwenctl.proxy.request_reader`) holds
    only the new messages as dicts; ``rest`` reads the whole request again for the rare path
    that needs an older message."""

    system: str
    roles: list[str]
    fps: list[bytes]
    first_user: Any
    tail: list[dict[str, Any]]  # the dialogue from ``tail_start`` on
    tail_start: int = 0
    rest: Callable[[], Conversation] | None = None  # the whole request, read from scratch

    @property
    def dialogue(self) -> list[dict[str, Any]]:
        """Every dialogue message (a request read on from an earlier one reads it again)."""
        if self.tail_start == 0:
            return self.tail
        assert self.rest is not None
        return self.rest().tail

    def dialogue_from(self, i: int) -> list[dict[str, Any]]:
        """The dialogue messages from index ``i`` on."""
        if i >= self.tail_start:
            return self.tail[i - self.tail_start:]
        return self.dialogue[i:]

    def conversation_id(self, cwd: str) -> str:
        """Same project, system prompt and first user message → the same session id."""
        return str(uuid.uuid5(SESSION_NAMESPACE, _canon([cwd, self.system, self.first_user])))


@dataclass
class ReadState:
    """What reading a request's messages has found so far; :meth:`read` goes on from where
    it stopped, so the messages a conversation's next request repeats need not be read again
    (:mod:`qwenctl.proxy.request_reader`)."""

    count: int = 0  # messages read
    system_parts: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    fps: list[bytes] = field(default_factory=list)
    first_user: Any = None  # the content of the first user message
    has_user: bool = False

    def copy(self) -> ReadState:
        return ReadState(self.count, list(self.system_parts), list(self.roles), list(self.fps),
                         self.first_user, self.has_user)

    def read(self, messages: list[Any]) -> list[dict[str, Any]]:
        """Check and read ``messages``, the request's messages from ``count`` on (their
        positions in errors count from the request's first message); returns the dialogue
        messages they add."""
        dialogue: list[dict[str, Any]] = []
        roles, fps = self.roles, self.fps
        for i, m in enumerate(messages, self.count):
            where = f"messages[{i}]"
            if not isinstance(m, dict):
                raise BadRequest(f"{where} must be an object", where)
            if not m.keys() <= MESSAGE_FIELDS:  # every new message: the C check first
                unknown = sorted(set(m) - MESSAGE_FIELDS)
                raise BadRequest(f"{where} has unknown field {unknown[0]!r}",
                                 f"{where}.{unknown[0]}")
            role = m.get("role")
            if role not in ROLES:
                raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}",
                                 f"{where}.role")
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
                if not roles:
                    self.system_parts.append(text_of(content))
                    continue
                m = {"role": "user", "content": text_of(content)}
                role = "user"
            elif role == "tool" and not isinstance(m.get("tool_call_id"), str):
                raise BadRequest(f"{where}.tool_call_id must be a string",
                                 f"{where}.tool_call_id")
            elif role == "assistant" and m.get("tool_calls") is not None:
                calls = m["tool_calls"]
                if not isinstance(calls, list) or not all(
                        isinstance(c, dict) and isinstance(c.get("id"), str)
                        and isinstance(c.get("function"), dict) for c in calls):
                    raise BadRequest(f"{where}.tool_calls must be a list of calls with id and "
                                     "function", f"{where}.tool_calls")
            elif role == "user" and content is None:
                raise BadRequest(f"{where}.content is missing", f"{where}.content")
            if role == "user" and not self.has_user:
                self.first_user, self.has_user = m.get("content"), True
            dialogue.append(m)
            roles.append(role)
            fps.append(fingerprint(m))
        self.count += len(messages)
        return dialogue

    def conversation(self, tail: list[dict[str, Any]], tail_start: int = 0,
                     rest: Callable[[], Conversation] | None = None) -> Conversation:
        """The request read so far as a :class:`Conversation`, after the checks on the whole
        (a dialogue to answer, not ending in a reply)."""
        if not self.roles:
            raise BadRequest("messages hold no user message", "messages")
        if self.roles[-1] == "assistant":
            raise BadRequest("the last message must be the user's input or tool results, not "
                             "an assistant message", f"messages[{self.count - 1}].role")
        return Conversation(system="\n\n".join(p for p in self.system_parts if p),
                            roles=list(self.roles), fps=list(self.fps),
                            first_user=self.first_user, tail=tail, tail_start=tail_start,
                            rest=rest)


def parse(messages: Any) -> Conversation:
    """Read a request's ``messages`` from scratch."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    state = ReadState()
    return state.conversation(state.read(messages))


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
