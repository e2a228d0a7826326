"""Turn an upstream chat-completions reply into the assistant message the daemon records.

:class:`StreamAccumulator` is fed the raw SSE bytes exactly as they pass through to the
client and joins content, reasoning and tool-call deltas; a stream that ends before
``[DONE]``/a finish reason is a cut reply (its partial tool calls are dropped, since nobody
can answer them, and a marker says the reply was cut). :func:`message_of_completion` does the
same for a non-streamed body.
"""

from __future__ import annotations

import json
from typing import Any

CUT_MARKER = "[reply cut off: {why}]"


class StreamAccumulator:
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
        self._buf += chunk
        while True:
            cut = self._event_end()
            if cut is None:
                return
            end, sep = cut
            event, self._buf = self._buf[:end], self._buf[end + sep:]
            self._event(event)

    def _event_end(self) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for sep in (b"\n\n", b"\r\n\r\n"):
            i = self._buf.find(sep)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, len(sep))
        return best

    def _event(self, raw: bytes) -> None:
        data = "\n".join(line[5:].lstrip() for line in raw.decode("utf-8", "replace").splitlines()
                         if line.startswith("data:"))
        if not data:
            return
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    self.reasoning.append(delta[key])
            for tc in delta.get("tool_calls") or []:
                self._call_delta(tc)
            if choice.get("finish_reason"):
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


def usage_of(body: Any) -> dict[str, int] | None:
    u = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(u, dict) or not isinstance(u.get("prompt_tokens"), int):
        return None
    return {"prompt_tokens": u["prompt_tokens"],
            "completion_tokens": int(u.get("completion_tokens") or 0)}
