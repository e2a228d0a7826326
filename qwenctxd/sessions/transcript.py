"""``session.transcript``: a session's recorded conversation, entry by entry, for people.

Read from the session's JSONL (open or closed, without resuming it), in file order, so it
shows everything that was said — also what a compaction later folded into a summary, which
appears as a ``compression`` entry where it happened. A ``mid_turn_user_message`` record (a
user turn merged into an unanswered one) extends the user entry before it, so the entry shows
the merged message the model saw. Message payloads in either shape are
understood: OpenAI chat messages (``role`` user/assistant/tool, ``content``, ``tool_calls``)
and Qwen Code's own (``role`` user/model, ``parts`` with ``text``, ``functionCall``,
``functionResponse``). Unreadable lines are skipped and counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec

from qwenctxd.protocol import errors
from qwenctxd.protocol import session as wire
from qwenctxd.sessions import records
from qwenctxd.sessions.gemini_format import to_messages


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
                elif part.get("type") in ("image_url", "image") or "inlineData" in part:
                    out.append("[image]")
        return "\n".join(out)
    return ""


def _args(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def entries_of(rec: records.ChatRecord) -> list[wire.TranscriptEntry]:
    """The transcript entries one record contributes (none for titles and other records)."""
    ts = rec.timestamp or None
    if rec.type == "system":
        if rec.subtype == records.SUBTYPE_COMPRESSION:
            info = (rec.systemPayload or {}).get("info") or {}
            before, after = info.get("originalTokenCount"), info.get("newTokenCount")
            text = (f"context compressed ({info.get('trigger') or 'manual'}): "
                    f"{before} → {after} tokens" if before is not None else "context compressed")
            return [wire.TranscriptEntry(kind="compression", role="system", text=text, time=ts)]
        return []
    msg = rec.message or {}
    role = str(msg.get("role") or rec.type)
    parts = msg.get("parts")
    if isinstance(parts, list):  # Qwen Code's payload
        texts: list[str] = []
        calls: list[wire.TranscriptCall] = []
        out: list[wire.TranscriptEntry] = []
        for part in parts:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str) and not part.get("thought"):
                texts.append(part["text"])
            elif isinstance(part.get("functionCall"), dict):
                fc = part["functionCall"]
                calls.append(wire.TranscriptCall(id=fc.get("id"), name=str(fc.get("name")),
                                                 arguments=_args(fc.get("args") or {})))
            elif isinstance(part.get("functionResponse"), dict):
                fr = part["functionResponse"]
                resp = fr.get("response")
                body = resp.get("output", resp) if isinstance(resp, dict) else resp
                out.append(wire.TranscriptEntry(
                    kind="message", role="tool", time=ts, name=fr.get("name"),
                    tool_call_id=fr.get("id"),
                    text=body if isinstance(body, str) else _args(body)))
        if texts or calls:
            out.insert(0, wire.TranscriptEntry(
                kind="message", role="assistant" if role == "model" else role, time=ts,
                text="\n".join(texts), tool_calls=calls, model=rec.model))
        return out
    calls = [wire.TranscriptCall(id=c.get("id"), name=str((c.get("function") or {}).get("name")),
                                 arguments=_args((c.get("function") or {}).get("arguments", "")))
             for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
    return [wire.TranscriptEntry(kind="message", role=role, time=ts,
                                 text=_text_of(msg.get("content")), tool_calls=calls,
                                 tool_call_id=msg.get("tool_call_id"), name=msg.get("name"),
                                 model=rec.model)]


class EntryFolder:
    """Records in, transcript entries out, one record at a time — the rule of
    :func:`read_transcript`, resumable: ``count`` entries so far and the user message the last
    entry shows (``last_user``, OpenAI form) are all it carries, so an indexer can go on from
    where it stopped. :meth:`feed` returns the new entries and, when a mid-turn record joined
    the last entry, that entry's new form (``replaced``). ``text_cap``: an indexer that keeps
    only the first ``text_cap`` characters of an entry says so, and a merged user message stops
    growing there (merging every mid-turn delta into an ever longer copy would cost the square
    of the message in memory)."""

    def __init__(self, count: int = 0, last_user: dict[str, Any] | None = None,
                 last: wire.TranscriptEntry | None = None, *,
                 text_cap: int | None = None) -> None:
        self.count = count
        self.last_user = last_user
        self._last = last  # the last entry so far (a resumed folder gets it from the caller)
        self._cap = text_cap

    def feed(self, rec: records.ChatRecord,
             ) -> tuple[list[wire.TranscriptEntry], wire.TranscriptEntry | None]:
        got = entries_of(rec)
        msgs = to_messages(rec.message) if rec.type == "user" and rec.message else []
        delta = msgs[0] if len(msgs) == 1 and msgs[0].get("role") == "user" else None
        prev = self._last
        if rec.subtype == records.SUBTYPE_MID_TURN and delta is not None \
                and self.last_user is not None and len(got) == 1 and prev is not None:
            # the merged user message as the session held it: one entry, the contents joined
            if self._cap is not None and len(prev.text) >= self._cap:
                return [], None  # past what the caller keeps: nothing of it changes
            self.last_user = records.merged_user(self.last_user, delta)
            text = _text_of(self.last_user["content"])
            if self._cap is not None and len(text) > self._cap:
                text = text[:self._cap]
                self.last_user = {**self.last_user, "content": text}
            self._last = msgspec.structs.replace(prev, text=text)
            return [], self._last
        if got:  # records that show nothing (titles, options) leave the last entry as it is
            self.count += len(got)
            self._last = got[-1]
            self.last_user = delta if rec.type == "user" and len(got) == 1 else None
        return got, None


def read_transcript(path: Path) -> tuple[list[wire.TranscriptEntry], int]:
    """Every entry of the JSONL at ``path`` and the number of unreadable lines. Blocking."""
    result = records.read_records(path)
    out: list[wire.TranscriptEntry] = []
    folder = EntryFolder()
    for rec in result.records:
        got, replaced = folder.feed(rec)
        if replaced is not None:
            out[-1] = replaced
        out.extend(got)
    return out, len(result.torn)


async def transcript(manager: Any, session_id: str) -> wire.TranscriptResult:
    """The transcript of an open or recorded session (SessionNotFound when there is none)."""
    from qwenctxd.sessions.manager import checked_id

    checked_id(session_id)
    s = manager.sessions.get(session_id)
    path: Path | None = s.path if s is not None else None
    if path is None:
        path = await manager.store.find(session_id, Path("/"))
    if path is None or not path.exists():
        raise errors.SessionNotFound(f"no recorded session {session_id}",
                                     data={"session_id": session_id})
    entries, torn = await anyio.to_thread.run_sync(read_transcript, path)
    return wire.TranscriptResult(session_id=session_id, path=str(path), entries=entries,
                                 torn_lines=torn)
