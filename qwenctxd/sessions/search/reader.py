"""Reading session files for the search index (blocking: run in a worker thread).

:func:`read_update` turns one session file into a :class:`~.index.FileUpdate`: from the
start for a file the index does not know (or one that shrank, or whose bytes before the
known offset no longer end a line), else from the indexed ``offset`` on — an append is never
read twice. Entries are exactly ``session.transcript``'s (the same
:class:`~qwenctxd.sessions.transcript.EntryFolder`), numbered from the file's first, so a hit's
``entry`` indexes that list. A last line without its newline is left for the next read unless
it already decodes; a line that does not decode is skipped and counted (``torn``).
:func:`discover` lists every ``<projects>/<slug>/chats/<uuid>.jsonl``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

import msgspec

from qwenctxd.fts import fts_text
from qwenctxd.paths import SESSION_FILE_RE
from qwenctxd.protocol import session as wire
from qwenctxd.sessions import records
from qwenctxd.sessions.search.index import EntryRow, FileState, FileUpdate
from qwenctxd.sessions.transcript import EntryFolder

SEARCHED_ROLES = ("user", "assistant", "tool")
MAX_TEXT_CHARS = 100_000  # of one entry; the rest is not searchable

_DECODER = msgspec.json.Decoder(records.ChatRecord)
_REMINDER = re.compile(r"<system-reminder>.*?(?:</system-reminder>|\Z)", re.S)


class Found(msgspec.Struct, array_like=True):
    path: str
    size: int
    mtime_ns: int


def discover(root: Path) -> dict[str, Found]:
    """``{path: Found}`` for every session file (a regular file) under ``root``."""
    found: dict[str, Found] = {}
    try:
        slugs = list(os.scandir(root))
    except OSError:
        return found
    for slug in slugs:
        try:
            chats = list(os.scandir(os.path.join(slug.path, "chats")))
        except OSError:
            continue
        for entry in chats:
            if not SESSION_FILE_RE.match(entry.name):
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found[entry.path] = Found(entry.path, st.st_size, st.st_mtime_ns)
    return found


def chats_dirs(root: Path) -> list[Path]:
    """``<root>/<slug>/chats`` for every project directory under ``root`` (missing ones too)."""
    try:
        return [Path(e.path) / "chats" for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return []




def _display(entry: wire.TranscriptEntry) -> str:
    """The searchable text of an entry: its text without the ``<system-reminder>`` blocks a
    client or the daemon added (the same in every session), then its tool calls as
    ``name(arguments)``."""
    text = _REMINDER.sub("", entry.text).strip() if "<system-reminder>" in entry.text \
        else entry.text
    if entry.tool_calls:
        calls = "\n".join(f"{c.name}({c.arguments})" for c in entry.tool_calls)
        text = f"{text}\n{calls}" if text else calls
    return text[:MAX_TEXT_CHARS]


def _row(index: int, entry: wire.TranscriptEntry) -> EntryRow | None:
    if entry.kind != "message" or entry.role not in SEARCHED_ROLES:
        return None
    text = _display(entry)
    if not text.strip():
        return None
    return EntryRow(index, entry.role, records.parse_time(entry.time), entry.time, text, fts_text(text))


def _starts_fresh(fh: BinaryIO, state: FileState | None, size: int) -> bool:
    """Whether the file must be read from the start: unknown, shrunk, or rewritten (the byte
    before the indexed offset no longer ends a line)."""
    if state is None or state.offset == 0 or size < state.offset:
        return True
    fh.seek(state.offset - 1)
    return fh.read(1) != b"\n"


def read_update(path: str, state: FileState | None) -> FileUpdate | None:
    """The update that brings the index in step with ``path``; None when nothing changed."""
    p = Path(path)
    try:
        fh = open(p, "rb")  # noqa: SIM115 - closed below; stat of the open file
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return FileUpdate(path=path, gone=True) if state is not None else None
    except OSError:
        return None  # unreadable now (permissions): try again on its next change
    with fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return FileUpdate(path=path, gone=True) if state is not None else None
        if state is not None and (state.size, state.mtime_ns) == (st.st_size, st.st_mtime_ns):
            return None
        full = _starts_fresh(fh, state, st.st_size)
        base = None if full else state
        offset = 0 if base is None else base.offset
        fh.seek(offset)
        data = fh.read()
    return _fold(p, base, st, offset, data)


def _fold(p: Path, base: FileState | None, st: os.stat_result, offset: int,
          data: bytes) -> FileUpdate:
    last_user = json.loads(base.last_user) if base is not None and base.last_user else None
    last = (wire.TranscriptEntry(kind="message", role=base.last_role, time=base.last_time)
            if base is not None and base.last_role else None)
    folder = EntryFolder(count=base.entries if base else 0, last_user=last_user, last=last,
                         text_cap=MAX_TEXT_CHARS)
    up = FileUpdate(path=str(p), full=base is None, session_id=p.stem,
                    project_slug=p.parent.parent.name, cwd=base.cwd if base else None,
                    title=base.title if base else None, size=st.st_size,
                    mtime_ns=st.st_mtime_ns, torn=base.torn if base else 0,
                    last_role=base.last_role if base else None,
                    last_time=base.last_time if base else None)
    pos = 0
    by_entry: dict[int, EntryRow] = {}
    while pos < len(data):
        nl = data.find(b"\n", pos)
        line = data[pos:] if nl < 0 else data[pos:nl]
        try:
            rec = _DECODER.decode(line) if line.strip() else None
        except msgspec.DecodeError:
            if nl < 0:
                break  # a last line still being written: read again once it is whole
            up.torn += 1
            rec = None
        pos = len(data) if nl < 0 else nl + 1
        if rec is None:
            continue
        _note(up, rec)
        got, replaced = folder.feed(rec)
        if replaced is not None:
            at = folder.count - 1
            text = _display(replaced)
            if at in by_entry:
                by_entry[at].text, by_entry[at].body = text, fts_text(text)
            else:
                up.replaced[at] = (text, fts_text(text))
        start = folder.count - len(got)
        for i, entry in enumerate(got):
            row = _row(start + i, entry)
            if row is not None:
                by_entry[row.entry] = row
        if got:
            up.last_role, up.last_time = got[-1].role, got[-1].time
    up.rows = list(by_entry.values())
    up.offset = offset + pos
    up.entries = folder.count
    up.last_user = json.dumps(folder.last_user, ensure_ascii=False) if folder.last_user else None
    return up


def _note(up: FileUpdate, rec: records.ChatRecord) -> None:
    """The session's cwd (the first recorded) and title (the last custom title)."""
    if up.cwd is None and rec.cwd:
        up.cwd = rec.cwd
    if rec.type == "system" and rec.subtype == records.SUBTYPE_TITLE:
        title = (rec.systemPayload or {}).get("customTitle")
        if isinstance(title, str):
            up.title = title or None
