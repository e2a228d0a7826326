"""Turn an upstream chat-completions reply into the assistant message the daemon records.

:class:`StreamAccumulator` is fed the raw SSE bytes exactly as they pass through to the
client and joins content, reasoning and tool-call deltas; a stream that ends before
``[DONE]``/a finish reason is a cut reply (its partial tool calls are dropped, since nobody
can answer them, and a marker says the reply was cut). :func:`message_of_completion` does the
same for a non-streamed body.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

CUT_MARKER = "[reply cut off: {why}]"


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    """The fields of a ``chat.completion.chunk`` the reply is built from; anything else is
    skipped by the decoder without being built as Python objects."""

    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_any = msgspec.json.Decoder().decode


class StreamAccumulator:
    """Every SSE event passes through here on the relay's hot path (issue 28: parsing each
    event with ``json.loads`` into dicts was an eighth of the proxy's CPU): an event is one
    typed msgspec decode of the fields used; a chunk whose fields have other types than
    OpenAI's goes the generic way."""

    def __init__(self) -> None:
        self._buf = b""
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.bytes = 0

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # CRLF framing: a "\r" left at the end is joined to its "\n" with the next chunk
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()  # what follows the last blank line: an unfinished event
        for event in events:
            self._event(event)

    def _event(self, raw: bytes) -> None:
        if raw.startswith(b"data:") and b"\n" not in raw:  # the usual shape: one data line
            data = raw[5:].lstrip()
        else:
            data = b"\n".join(line[5:].lstrip() for line in raw.split(b"\n")
                               if line.startswith(b"data:"))
        if not data:
            return
        if data.rstrip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = _decode_chunk(data)
        except msgspec.ValidationError:  # valid JSON of another shape: field by field
            self._event_obj(_decode_any(data))
            return
        except msgspec.DecodeError:  # e.g. bytes that are not UTF-8: as the text reads
            try:
                obj = json.loads(data.decode("utf-8", "replace"))
            except ValueError:
                return
            self._event_obj(obj)
            return
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content is not None:
                    self.content.append(delta.content)
                if delta.reasoning_content is not None:
                    self.reasoning.append(delta.reasoning_content)
                if delta.reasoning is not None:
                    self.reasoning.append(delta.reasoning)
                for tc in delta.tool_calls or ():
                    self._call_delta(tc)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def _event_obj(self, obj: Any) -> None:
        """An event decoded without a schema (fields of unexpected types are skipped)."""
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                delta = {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    self.reasoning.append(delta[key])
            calls = delta.get("tool_calls")
            for tc in calls if isinstance(calls, list) else []:
                self._call_delta(tc)
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                self.finish_reason = choice["finish_reason"]

    def _call_delta(self, tc: Any) -> None:
        if not isinstance(tc, dict):
            return
        idx = tc.get("index") if isinstance(tc.get("index"), int) else len(self._calls)
        call = self._calls.setdefault(
            idx, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if tc.get("id"):
            call["id"] = tc["id"]
        fn = tc.get("function") or {}
        if isinstance(fn.get("name"), str):
            call["function"]["name"] += fn["name"]
        if isinstance(fn.get("arguments"), str):
            call["function"]["arguments"] += fn["arguments"]

    @property
    def complete(self) -> bool:
        return self.done or self.finish_reason is not None

    def message(self, cut_reason: str | None = None) -> dict[str, Any]:
        """The assistant message; ``cut_reason`` (or an unfinished stream) makes it a cut
        reply: content kept with a marker, partial tool calls dropped."""
        content = "".join(self.content)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        cut = cut_reason or (None if self.complete else "the upstream stream ended early")
        calls = [c for c in (self._calls[i] for i in sorted(self._calls))
                 if c["id"] and c["function"]["name"]]
        if cut:
            marker = CUT_MARKER.format(why=cut)
            msg["content"] = f"{content}\n\n{marker}" if content else marker
        elif calls:
            msg["tool_calls"] = calls
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        return msg


def message_of_completion(body: Any) -> dict[str, Any] | None:
    """The assistant message of a non-streamed ``chat.completion`` body (None if it has none)."""
    try:
        m = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(m, dict):
        return None
    msg: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
    if m.get("tool_calls"):
        msg["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type") or "function", "function": c.get("function")}
            for c in m["tool_calls"] if isinstance(c, dict)]
    for key in ("reasoning_content",):
        if isinstance(m.get(key), str) and m[key]:
            msg[key] = m[key]
    return msg


def finish_reason_of(body: Any) -> str | None:
    """The first choice's ``finish_reason`` of a non-streamed body (None if it has none)."""
    try:
        reason = body["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


#: how Qwen Code (0.24) tells an answer it must not keep from one it shows: it asks the same
#: history again after each of these, and that is a retry, not a regenerate
_PROTOCOL_TAGS = ("<analysis", "</analysis", "<summary", "</summary")
_LEAKED_CALL_TAGS = re.compile(r"[}\]]\s*</parameter>\s*</function>", re.IGNORECASE)
_DEGRADED_PLACEHOLDER = "(request timeout)"
_CUT_PREFIX = CUT_MARKER.split("{", 1)[0]  # "[reply cut off: "


def unusable_answer(message: dict[str, Any], finish_reason: str | None) -> bool:
    """Whether a recorded reply is no answer the client can keep, so that a client asking
    the same again is retrying it: stopped by the token budget (``finish_reason``
    "length"), ended without a finish reason (llama-cpp-python's server ends a stream it
    interrupts for another request with ``[DONE]`` and no finish reason), cut off, empty,
    or one Qwen Code throws away as an invalid stream: text that starts with a leaked
    protocol tag (``<summary>``, ``<analysis>``), JSON text carrying leaked tool-call tags,
    or the upstream's ``(request timeout)`` placeholder."""
    if finish_reason in ("length", None):
        return True
    if message.get("tool_calls"):
        return False
    text = message.get("content")
    text = text.strip() if isinstance(text, str) else ""
    if not text or _CUT_PREFIX in text or text == _DEGRADED_PLACEHOLDER:
        return True
    head = text.lower()
    for tag in _PROTOCOL_TAGS:
        if tag.startswith(head):  # the whole answer is (the start of) a tag: "<summ"
            return True
        if head.startswith(tag) and head[len(tag)] in " \t\n\r/>":
            return True
    return head[:1] in "{[" and _LEAKED_CALL_TAGS.search(text) is not None


def usage_of(body: Any) -> dict[str, int] | None:
    u = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(u, dict) or not isinstance(u.get("prompt_tokens"), int):
        return None
    return {"prompt_tokens": u["prompt_tokens"],
            "completion_tokens": int(u.get("completion_tokens") or 0)}
