"""The audit log of background agents' file changes, with undo.

Every create, edit or delete a background agent makes is appended to
``$XDG_STATE_HOME/qwenctxd/audit.jsonl`` (time, agent, session, path, action, sha256 before and
after, and ``redacted: [{rule, count}]`` when secrets were replaced in what was written)
before the change is applied, and the previous content is kept in a bounded history
directory, so ``qwenctl memory log`` can show what happened and ``qwenctl memory undo ID`` can
put it back. Undo itself is logged too.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from qwenctxd.fsutil import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    atomic_write,
    make_dirs,
    read_regular,
)

MAX_HISTORY_FILES = 2_000
MAX_HISTORY_BYTES = 64 * 1024 * 1024


class AuditEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    time: float
    agent: str
    session: str | None = None
    path: str
    action: str  # create | edit | delete | undo
    sha256_before: str | None = None
    sha256_after: str | None = None
    backup: str | None = None  # history file holding the previous content
    undoes: str | None = None
    redacted: list[dict[str, Any]] | None = None  # [{rule, count}] replaced before the write


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes | None:
    try:
        return read_regular(path)
    except FileNotFoundError:
        return None


@dataclass
class AuditLog:
    directory: Path

    def __post_init__(self) -> None:
        self.path = self.directory / "audit.jsonl"
        self.history = self.directory / "history"
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    # -- recording ------------------------------------------------------------------------------
    def _append(self, entry: AuditEntry) -> None:
        make_dirs(self.directory, PRIVATE_DIR_MODE)
        line = msgspec.json.encode(entry) + b"\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def _backup(self, entry_id: str, data: bytes) -> str:
        make_dirs(self.history, PRIVATE_DIR_MODE)
        target = self.history / f"{entry_id}.bak"
        atomic_write(target, data, mode=PRIVATE_FILE_MODE)  # copies of memories: private too
        self._prune()
        return str(target)

    def _prune(self) -> None:
        try:
            files = sorted(self.history.iterdir(), key=lambda p: p.stat().st_mtime)
        except OSError:
            return
        total = sum(p.stat().st_size for p in files)
        while files and (len(files) > MAX_HISTORY_FILES or total > MAX_HISTORY_BYTES):
            victim = files.pop(0)
            total -= victim.stat().st_size
            victim.unlink(missing_ok=True)

    def write_file(self, path: Path, text: str | bytes, *, agent: str,
                   session: str | None, mode: int = PRIVATE_FILE_MODE,
                   dir_mode: int | None = PRIVATE_DIR_MODE,
                   redacted: list[dict[str, Any]] | None = None) -> AuditEntry:
        """Record, then atomically write ``text`` to ``path`` (create or edit). A new file
        gets ``mode`` and missing folders ``dir_mode`` (memory: 0600/0700); an existing file
        keeps its mode. ``redacted`` (``[{rule, count}]``) says which secrets the writer
        replaced in ``text``."""
        before = _read(path)
        payload = text.encode() if isinstance(text, str) else text
        entry_id = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
        entry = AuditEntry(
            id=entry_id, time=time.time(), agent=agent, session=session, path=str(path),
            action="create" if before is None else "edit", sha256_before=sha256(before),
            sha256_after=sha256(payload),
            backup=self._backup(entry_id, before) if before is not None else None,
            redacted=redacted or None)
        self._append(entry)
        atomic_write(path, payload, mode=mode, dir_mode=dir_mode)
        return entry

    def delete_file(self, path: Path, *, agent: str, session: str | None) -> AuditEntry | None:
        before = _read(path)
        if before is None:
            return None
        entry_id = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
        entry = AuditEntry(id=entry_id, time=time.time(), agent=agent, session=session,
                           path=str(path), action="delete", sha256_before=sha256(before),
                           backup=self._backup(entry_id, before))
        self._append(entry)
        path.unlink(missing_ok=True)
        return entry

    # -- reading / undo -------------------------------------------------------------------------
    def entries(self, limit: int | None = None) -> list[AuditEntry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        dec = msgspec.json.Decoder(AuditEntry)
        out = []
        for line in raw.splitlines():
            try:
                out.append(dec.decode(line))
            except msgspec.DecodeError:
                continue  # a torn last line after a crash
        return out[-limit:] if limit else out

    def find(self, entry_id: str) -> AuditEntry:
        """The entry ``entry_id``; KeyError if there is none."""
        entry = next((e for e in self.entries() if e.id == entry_id), None)
        if entry is None:
            raise KeyError(entry_id)
        return entry

    def undo(self, entry_id: str, *, agent: str = "user") -> AuditEntry:
        """Restore the content before ``entry_id`` (delete a created file). KeyError if unknown;
        ValueError if the file changed since (its hash differs from the entry's after-hash).
        Returns the change the undo made (a ``delete`` when it undoes a ``create``)."""
        entry = self.find(entry_id)
        path = Path(entry.path)
        current = _read(path)
        if entry.action != "delete" and sha256(current) != entry.sha256_after:
            raise ValueError(f"{path} changed after entry {entry_id}; refusing to undo over it")
        if entry.action == "create":
            undo = self.delete_file(path, agent=agent, session=None)
        else:
            if entry.backup is None:
                raise ValueError(f"no saved content for entry {entry_id}")
            previous = Path(entry.backup).read_bytes()
            undo = self.write_file(path, previous, agent=agent, session=None)
        assert undo is not None
        marker = AuditEntry(id=f"{int(time.time())}-{uuid.uuid4().hex[:8]}", time=time.time(),
                            agent=agent, path=str(path), action="undo", undoes=entry_id)
        self._append(marker)
        return undo

    def as_dicts(self, limit: int | None = None) -> list[dict[str, Any]]:
        return [msgspec.to_builtins(e) for e in self.entries(limit)]


def undo_wording(undone: AuditEntry | dict[str, Any]) -> str:
    """What undoing ``undone`` did, for people: "removed it: the extraction agent had created
    it", never the mechanics of the reverse change ("undid a delete")."""
    d = undone if isinstance(undone, dict) else msgspec.to_builtins(undone)
    who = f"the {d.get('agent') or 'background'} agent"
    action = d.get("action")
    if action == "create":
        return f"removed the file {who} had created"
    if action == "edit":
        return f"put back its content from before {who}'s edit"
    if action == "delete":
        return f"brought back the file {who} had deleted"
    return f"reverted entry {d.get('id')}"
