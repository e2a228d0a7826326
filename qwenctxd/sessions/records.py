"""The session JSONL record: one ``ChatRecord`` per line, in Qwen Code's own format.

A session lives at ``<runtime base>/projects/<slug>/chats/<session-uuid>.jsonl`` (SPEC §S3). Each
line is a ``ChatRecord`` whose ``message`` holds one Gemini ``Content`` (``{role: "user"|"model",
parts}``) and whose ``usageMetadata`` holds the reply's token counts, exactly as Qwen Code writes
them, so either side resumes the other's sessions; a ``system``/``chat_compression`` record
carries the compressed history (Contents) in ``systemPayload["compressedHistory"]`` so
:func:`resume` can start from the latest one. The daemon hands the writer OpenAI messages and
gets OpenAI messages back from :func:`resume`; ``sessions.gemini_format`` converts at this
boundary. Files written before (OpenAI-shaped ``message``, ``usage``) still resume.

Writing is ``sessions.jsonl_writer`` (:class:`~qwenctxd.sessions.jsonl_writer.JsonlWriter`:
whole lines only, never into another writer's record); this module holds the record types, the
paths and the reading side.

Reading (:func:`read_records`, :func:`resume`, :func:`scan_summary`): streamed line by line with
typed msgspec decoders; a line that does not decode is reported as a :class:`TornLine`, never
raised. Unknown fields are ignored, so files written by later versions still read.
"""

from __future__ import annotations

import os
import random
import re
import uuid as _uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from qwenctxd.compaction.summary import join_content
from qwenctxd.fsutil import open_regular
from qwenctxd.paths import chats_dir
from qwenctxd.sessions import gemini_format

RecordType = Literal["user", "assistant", "tool_result", "system"]
FsyncPolicy = Literal["never", "always", "interval"]

SESSION_ID_RE = re.compile(r"^[0-9a-fA-F-]{32,36}$")
TORN_PREVIEW_BYTES = 4096

SUBTYPE_COMPRESSION = "chat_compression"
SUBTYPE_TITLE = "custom_title"
# the session's options (window, tools, agent, keep_reasoning, threshold) as last set
SUBTYPE_OPTIONS = "session_options"
# a rewind: like a checkpoint, ``compressedHistory`` is the whole history that remains
SUBTYPE_REWIND = "rewind"
# a ``user`` record whose parts join the user message before it (Qwen Code's own subtype for
# a message typed mid-turn; the daemon's for a user turn merged into an unanswered one)
SUBTYPE_MID_TURN = "mid_turn_user_message"


class ChatRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One JSONL line. Field names follow Qwen Code's ChatRecord; ``message`` is a Content.

    Empty ``uuid``/``sessionId``/``timestamp``/``cwd``/``version`` are filled in by
    :meth:`~qwenctxd.sessions.jsonl_writer.JsonlWriter.append`; a ``None`` ``parentUuid`` is chained to the previous record.
    :meth:`~qwenctxd.sessions.jsonl_writer.JsonlWriter.append` also turns an OpenAI ``message`` into a Content and an OpenAI
    ``usage`` into ``usageMetadata``; ``usage`` is only read, from files written before.
    """

    uuid: str = ""
    parentUuid: str | None = None
    sessionId: str = ""
    timestamp: str = ""
    type: RecordType
    subtype: str | None = None
    cwd: str = ""
    version: str = ""
    message: dict[str, Any] | None = None
    usageMetadata: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    systemPayload: dict[str, Any] | None = None
    contextWindowSize: int | None = None
    provenance: str | None = None


class TornLine(msgspec.Struct, frozen=True):
    """A line that did not decode: 1-based ``line_no``, its first bytes, why, and its full length."""

    line_no: int
    data: bytes
    reason: str
    length: int = 0


class ReadResult(msgspec.Struct):
    records: list[ChatRecord]
    torn: list[TornLine]


class ResumeState(msgspec.Struct, kw_only=True):
    """What :func:`resume` rebuilds: the API history plus the facts needed for token anchoring.

    ``last_usage`` is the usage of the last assistant record carrying one after the latest
    checkpoint; ``anchor_index`` is ``len(messages)`` right after that assistant message (the
    messages ``last_usage.prompt_tokens + completion_tokens`` cover). ``last_uuid`` is the last
    good record's uuid, for chaining a writer reopened on the same file.
    """

    messages: list[dict[str, Any]]
    checkpoint_uuid: str | None = None
    last_usage: dict[str, Any] | None = None
    last_model: str | None = None
    records: int = 0
    torn: list[TornLine] = msgspec.field(default_factory=list)
    started_at: str | None = None
    updated_at: str | None = None
    title: str | None = None
    cwd: str | None = None
    anchor_index: int | None = None
    last_uuid: str | None = None
    options: dict[str, Any] | None = None


class SessionSummary(msgspec.Struct, kw_only=True):
    """One session's index row as scanned from its file (see ``sessions.index``).

    ``path`` may be left empty when upserting: the index then uses ``session_path(project, id)``.
    """

    session_id: str
    path: str = ""
    cwd: str | None = None
    started_at: str | None = None
    updated_at: str | None = None
    messages: int = 0
    title: str | None = None
    size: int = 0
    mtime_ns: int = 0


# -- paths ----------------------------------------------------------------------------------------


def session_path(project: str | os.PathLike[str], session_id: str) -> Path:
    if not SESSION_ID_RE.match(session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    return chats_dir(project) / f"{session_id}.jsonl"


def new_session_id() -> str:
    return str(_uuid.uuid4())


_uuid_bits = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _uuid_bits.seed(os.urandom(32)))


def record_uuid() -> str:
    """A random (version 4) uuid for a record: unique, not secret, so drawn from a PRNG seeded
    from the OS once per process — ``uuid.uuid4`` makes a ``getrandom`` call per id, which
    lets the event-loop thread's GIL go to a busy worker thread on every record."""
    return str(_uuid.UUID(int=_uuid_bits.getrandbits(128), version=4))


def now_iso() -> str:
    """UTC timestamp like JavaScript's ``toISOString()``: ``2025-01-02T03:04:05.678Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- reading --------------------------------------------------------------------------------------


def _torn(line_no: int, line: bytes, err: Exception) -> TornLine:
    body = line.rstrip(b"\r\n")
    kind = "undecodable line" if line.endswith(b"\n") else "torn tail (no newline)"
    return TornLine(line_no, bytes(body[:TORN_PREVIEW_BYTES]), f"{kind}: {err}", len(body))


def _lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    with open_regular(path, buffering=1024 * 1024) as f:
        yield from enumerate(f, 1)


def read_records(path: str | os.PathLike[str]) -> ReadResult:
    """Every record in file order; undecodable lines are skipped and reported, never raised."""
    dec = msgspec.json.Decoder(ChatRecord)
    records: list[ChatRecord] = []
    torn: list[TornLine] = []
    for line_no, line in _lines(path):
        try:
            records.append(dec.decode(line))
        except msgspec.DecodeError as e:
            if line.strip():
                torn.append(_torn(line_no, line, e))
    return ReadResult(records, torn)


def merged_user(before: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """The user message a ``mid_turn_user_message`` record's ``delta`` makes of the user message
    ``before`` it: the contents joined, as the live session joined them."""
    return {"role": "user", "content": join_content(before.get("content"), delta.get("content"))}


class _ResumeRec(msgspec.Struct, kw_only=True):
    type: RecordType
    uuid: str = ""
    timestamp: str = ""
    subtype: str | None = None
    cwd: str = ""
    message: dict[str, Any] | None = None
    usageMetadata: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    systemPayload: msgspec.Raw = msgspec.Raw()


_PAYLOAD_DEC = msgspec.json.Decoder(dict[str, Any] | None)


def resume(path: str | os.PathLike[str]) -> ResumeState:
    """Rebuild the API history: the latest checkpoint's compressed history + every later message.

    Without a checkpoint, every non-system record's message in file order; a
    ``mid_turn_user_message`` record joins the user message before it (:func:`merged_user`), as
    Qwen Code's resume appends its parts to the previous user Content. Streams the file;
    messages collected before a checkpoint are dropped when it is met. Contents (Qwen Code's
    format) come back as OpenAI messages; OpenAI-shaped payloads of older files as they are.
    """
    dec = msgspec.json.Decoder(_ResumeRec)
    decode = dec.decode
    payload_decode = _PAYLOAD_DEC.decode
    messages: list[dict[str, Any]] = []
    torn: list[TornLine] = []
    records = 0
    checkpoint_uuid = last_model = title = started_at = cwd = None
    last_usage: dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    anchor: int | None = None
    rec: _ResumeRec | None = None
    last_good: _ResumeRec | None = None
    for line_no, line in _lines(path):
        try:
            rec = decode(line)
        except msgspec.DecodeError as e:
            if line.strip():
                torn.append(_torn(line_no, line, e))
            continue
        if rec.type == "system":
            sub = rec.subtype
            if sub in (SUBTYPE_COMPRESSION, SUBTYPE_TITLE, SUBTYPE_OPTIONS, SUBTYPE_REWIND):
                try:
                    payload = payload_decode(rec.systemPayload) if rec.systemPayload else None
                except msgspec.DecodeError as e:
                    torn.append(_torn(line_no, line, e))
                    continue
                if sub == SUBTYPE_OPTIONS:
                    options = payload
                elif sub == SUBTYPE_COMPRESSION or sub == SUBTYPE_REWIND:
                    hist = payload.get("compressedHistory") if payload else None
                    if isinstance(hist, list):
                        messages = gemini_format.to_message_list(hist)
                        checkpoint_uuid = rec.uuid or None
                        last_usage = anchor = None
                elif payload and isinstance(payload.get("customTitle"), str):
                    title = payload["customTitle"] or None
        else:
            msg = rec.message
            if msg is not None:
                got = gemini_format.to_messages(msg) if "parts" in msg else [msg]
                if rec.subtype == SUBTYPE_MID_TURN and len(got) == 1 and messages \
                        and messages[-1].get("role") == "user" == got[0].get("role"):
                    messages[-1] = merged_user(messages[-1], got[0])
                else:
                    messages.extend(got)
            usage = rec.usage if rec.usageMetadata is None else \
                gemini_format.to_openai_usage(rec.usageMetadata)
            if rec.type == "assistant" and usage is not None:
                last_usage = usage
                anchor = len(messages)
            if rec.model:
                last_model = rec.model
        records += 1
        if last_good is None:
            started_at = rec.timestamp or None
        if cwd is None and rec.cwd:
            cwd = rec.cwd
        last_good = rec
    return ResumeState(
        messages=messages,
        checkpoint_uuid=checkpoint_uuid,
        last_usage=last_usage,
        last_model=last_model,
        records=records,
        torn=torn,
        started_at=started_at,
        updated_at=(last_good.timestamp or None) if last_good else None,
        title=title,
        cwd=cwd,
        anchor_index=anchor,
        last_uuid=(last_good.uuid or None) if last_good else None,
        options=options,
    )


class _SummaryRec(msgspec.Struct, kw_only=True):
    type: RecordType
    timestamp: str = ""
    subtype: str | None = None
    cwd: str = ""
    message: msgspec.Raw = msgspec.Raw()
    systemPayload: msgspec.Raw = msgspec.Raw()


def scan_summary(path: str | os.PathLike[str]) -> SessionSummary:
    """The index row for one session file: cheap per line (messages are skipped, not built).

    ``size``/``mtime_ns`` are taken before reading, so a concurrent append makes the row look
    stale (and get rescanned) rather than look fresh with missing data.
    """
    p = Path(path)
    st = os.stat(p)
    dec = msgspec.json.Decoder(_SummaryRec)
    started_at = updated_at = cwd = title = None
    count = 0
    for _line_no, line in _lines(p):
        try:
            rec = dec.decode(line)
        except msgspec.DecodeError:
            continue
        if started_at is None and rec.timestamp:
            started_at = rec.timestamp
        if rec.timestamp:
            updated_at = rec.timestamp
        if cwd is None and rec.cwd:
            cwd = rec.cwd
        if rec.type == "system":
            if rec.subtype == SUBTYPE_TITLE and rec.systemPayload:
                try:
                    payload = _PAYLOAD_DEC.decode(rec.systemPayload)
                except msgspec.DecodeError:
                    continue
                if payload and isinstance(payload.get("customTitle"), str):
                    title = payload["customTitle"] or None
        elif rec.message and not (len(rec.message) == 4 and bytes(rec.message) == b"null") \
                and rec.subtype != SUBTYPE_MID_TURN:  # a delta joins the message before it
            count += 1
    return SessionSummary(
        session_id=p.stem,
        path=str(p),
        cwd=cwd,
        started_at=started_at,
        updated_at=updated_at,
        messages=count,
        title=title,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
    )


def parse_time(value: str | None) -> float | None:
    """A record's ISO-8601 ``timestamp`` as a Unix time (None when absent or unreadable)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
