"""Writing a session JSONL (:class:`JsonlWriter`): one ``ChatRecord`` per line, in Qwen Code's format.

msgspec-encoded, one ``write`` of the whole line per record on an ``O_APPEND`` descriptor (so the
line reaches the kernel at once — "flushed per record"), fsync per policy. A torn tail left by a
crash is closed with ``"\\n"`` before the next append, so the torn line stays isolated and readers
skip it. The file may be shared with a running Qwen Code: a record is appended only when
``sessions.shared_file.append_state`` says no other writer is mid-record; until then it waits in
the writer's queue (written in the background on the event loop, or at
:meth:`JsonlWriter.close`), never dropped and never written into another's line (should another writer start a record in the
microseconds between the last look and the write, the lines are put back in order in place once
its record is complete: ``shared_file.mend_interleave``). The writer is
handed OpenAI messages and turns them into Gemini Contents (``sessions.gemini_format``). The
record types and the reading side live in ``sessions.records``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog

from qwenctxd.sessions import gemini_format, shared_file
from qwenctxd.sessions.records import (
    SUBTYPE_COMPRESSION,
    SUBTYPE_TITLE,
    ChatRecord,
    FsyncPolicy,
    RecordType,
    now_iso,
    record_uuid,
)

log = structlog.get_logger("qwenctxd.sessions")


class _UuidOnly(msgspec.Struct):
    type: RecordType
    uuid: str = ""


def _tail_uuid(fd: int, size: int) -> str | None:
    """The uuid of the last decodable record, reading backwards from the end of the file."""
    dec = msgspec.json.Decoder(_UuidOnly)
    pos, block, carry = size, 64 * 1024, b""
    while pos > 0:
        start = max(0, pos - block)
        buf = os.pread(fd, pos - start, start) + carry
        pos = start
        lines = buf.split(b"\n")
        carry = lines.pop(0) if pos > 0 else b""
        for line in reversed(lines):
            if line.strip():
                try:
                    return dec.decode(line).uuid or None
                except msgspec.DecodeError:
                    continue
        block = min(block * 2, 8 * 1024 * 1024)
    return None


def _open_for_append(path: Path) -> tuple[int, bool]:
    """An ``O_APPEND`` descriptor of ``path`` (made ``0600``, its directory ``0700`` if need
    be) and whether the file was there before. A new session's file (the usual case: a burst of
    32 conversations makes 32 at once) costs one ``open``; each call on a worker thread lets
    the GIL go and waits to get it back."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    for _ in range(2):
        try:
            return os.open(path, flags | os.O_EXCL, 0o600), False
        except FileExistsError:
            try:
                return os.open(path, flags & ~os.O_CREAT), True
            except FileNotFoundError:  # removed in between: make it
                continue
        except FileNotFoundError:  # no chats directory yet
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(path, flags, 0o600), False


class JsonlWriter:
    """Appends ChatRecords to one session file; one writer per session, used from one task.

    ``fsync``: ``"never"`` (page cache only), ``"always"`` (after every record) or
    ``"interval"`` (at most every ``fsync_interval`` seconds, checked on append). Every policy
    but ``"never"`` fsyncs on :meth:`close`. ``parent_uuid`` seeds the chain; by default it is
    the uuid of the last good record already in the file (``None`` for a new file).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        session_id: str | None = None,
        cwd: str = "",
        version: str = "",
        fsync: FsyncPolicy = "interval",
        fsync_interval: float = 1.0,
        parent_uuid: str | None | msgspec.UnsetType = msgspec.UNSET,
        defer_dir_sync: bool = False,
    ) -> None:
        if fsync not in ("never", "always", "interval"):
            raise ValueError(f"fsync policy must be never|always|interval, not {fsync!r}")
        self.path = Path(path)
        self.session_id = session_id or self.path.stem
        self.cwd = cwd
        self.version = version
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval = fsync_interval
        self.records_written = 0
        self._enc = msgspec.json.Encoder()
        self._buf = bytearray()
        self._dirty = False
        self._last_sync = time.monotonic()
        self._dir_pending = False
        self._fd: int | None = None
        self._fd, existed = _open_for_append(self.path)
        try:
            st = os.fstat(self._fd)
            size = st.st_size
            # lines waiting for the file to be safe to append to (shared_file.append_state)
            self._queue: list[bytes] = []
            self._watch = shared_file.TailWatch()
            self._drainer: Any = None
            self.deferred_appends = 0
            self._torn: shared_file.Interleave | None = None  # our lines inside another's record
            self.interleaves_mended = 0
            self.interleaves_left = 0
            # the size whose end is a newline we know of (-1: none yet, the first append looks)
            self._expected = size
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                self._expected = -1
                if time.time() - st.st_mtime >= shared_file.STALE_TAIL_S:
                    # a crashed writer's torn tail: close it so the next record starts a fresh
                    # line (a fresher one may be a live writer's record: the first append
                    # waits on it)
                    self._write(b"\n")
                    self._expected = size + 1
            if parent_uuid is msgspec.UNSET:
                parent_uuid = _tail_uuid(self._fd, size) if size else None
            self.last_uuid: str | None = parent_uuid
            # tool-call id -> name, for the functionResponse of a later tool result
            self.tool_names: dict[str, str] = {}
            #: a new file's directory entry is made durable with its first fsync (or now)
            self._dir_pending = not existed and fsync != "never"
            if not defer_dir_sync:
                self._sync_dir_if_pending()
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return self._fd is None

    def append(self, record: ChatRecord, *, chain: bool = True) -> ChatRecord:
        """Write one record as a single line; returns it with uuid/timestamp/etc. filled in."""
        if self._fd is None:
            raise ValueError("JsonlWriter is closed")
        updates: dict[str, Any] = {}
        if not record.uuid:
            updates["uuid"] = record_uuid()
        if chain and record.parentUuid is None and self.last_uuid is not None:
            updates["parentUuid"] = self.last_uuid
        if not record.sessionId:
            updates["sessionId"] = self.session_id
        if not record.timestamp:
            updates["timestamp"] = now_iso()
        if not record.cwd and self.cwd:
            updates["cwd"] = self.cwd
        if not record.version and self.version:
            updates["version"] = self.version
        updates.update(self._in_qwen_format(record))
        if updates:
            record = msgspec.structs.replace(record, **updates)
        buf = self._buf
        self._enc.encode_into(record, buf)
        buf.extend(b"\n")
        line = bytes(buf)
        del buf[:]
        self.last_uuid = record.uuid
        self.records_written += 1
        self._queue.append(line)
        if not self._flush_queue():
            self._defer()
        return record

    @property
    def pending(self) -> int:
        """Records accepted but not yet written (another writer is mid-record)."""
        return len(self._queue)

    def _flush_queue(self, *, force: bool = False) -> bool:
        """Write the queued lines if the file is safe to append to; True when nothing is left
        to do (none queued, no interleave left to mend)."""
        fd = self._fd
        if fd is None:
            return not self._queue
        if self._torn is not None and not self._mend(fd, force=force):
            return False
        if not self._queue:
            return True
        state = shared_file.append_state(fd, self._expected, self._watch, time.monotonic())
        if state == "wait" and not force:
            return False
        # The file is append-only, so at the size of our last write its end is our newline:
        # the common case (nobody else wrote) reads no byte back. Each syscall here lets the
        # GIL go, and on a busy daemon getting it back costs more than the call.
        size = self._watch.size  # append_state's look, a moment ago
        ours = size == self._expected
        lead = b""
        if not ours:
            if not shared_file.ends_in_newline(fd, size):
                if state != "stale_tail" and not force:
                    return False  # a record begun since the look above: a live writer's
                lead = b"\n"  # a dead writer's torn tail (or forced at close)
            self._rechain(fd)
        data = lead + b"".join(self._queue)
        # the last look right before the one write: nobody started a record meanwhile
        if not force and (os.fstat(fd).st_size != size or (
                not lead and not ours and not shared_file.ends_in_newline(fd, size))):
            return False
        self._write(data)
        self._queue.clear()
        self._expected = end = os.lseek(fd, 0, os.SEEK_CUR)
        start = end - len(data)
        if not lead and start > 0 and start != size and os.pread(fd, 1, start - 1) != b"\n":
            # another writer began a record between the last look and the write (at the size
            # of the last look, the byte before ours is the newline that look saw)
            self._torn = shared_file.Interleave(start, end)
        self._dirty = True
        if self.fsync_policy == "always":
            self.sync()
        elif self.fsync_policy == "interval":
            if time.monotonic() - self._last_sync >= self.fsync_interval:
                self.sync()
        return self._torn is None or self._mend(fd, force=force)

    def _mend(self, fd: int, *, force: bool) -> bool:
        """Try to put our lines after the record they landed in; True when no longer pending."""
        assert self._torn is not None
        state = shared_file.mend_interleave(self.path, fd, self._torn, time.monotonic())
        if state == "wait" and not force:
            return False
        log.info("session file: our lines landed inside another writer's record",
                 path=str(self.path), start=self._torn.start, end=self._torn.end, outcome=state)
        if state == "mended":
            self.interleaves_mended += 1
            self._dirty = True
            self._expected = self._torn.ours_end  # growth past it is the other writer's: settle
        else:
            self.interleaves_left += 1
        self._torn = None
        return True

    def _rechain(self, fd: int) -> None:
        """Another writer appended: chain the first queued line to the file's last record, so the
        parentUuid chain stays one line of descent where it can (resume reads file order)."""
        tail = _tail_uuid(fd, os.fstat(fd).st_size)
        if tail is None or not self._queue:
            return
        try:
            first = msgspec.json.decode(self._queue[0].rstrip(b"\n"), type=ChatRecord)
        except msgspec.DecodeError:
            return
        if first.parentUuid is not None and first.parentUuid != tail:
            first = msgspec.structs.replace(first, parentUuid=tail)
            self._queue[0] = self._enc.encode(first) + b"\n"

    def _defer(self) -> None:
        """Another writer is mid-record: write the queue once the file is safe, in the
        background on the running event loop (never blocking it), or here when there is none."""
        import asyncio

        self.deferred_appends += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._wait_and_flush(None)
            return
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())

    async def _drain(self) -> None:
        import asyncio

        # polling a file's size: there is no event to wait on
        while self._fd is not None and not self._flush_queue():  # noqa: ASYNC110
            await asyncio.sleep(shared_file.POLL_S)

    def _wait_and_flush(self, deadline_s: float | None) -> None:
        """Block until the queue is written; past ``deadline_s`` write it anyway."""
        start = time.monotonic()
        while not self._flush_queue():
            if deadline_s is not None and time.monotonic() - start >= deadline_s:
                self._flush_queue(force=True)
                return
            time.sleep(shared_file.POLL_S)

    def remember_tool_calls(self, messages: list[dict[str, Any]]) -> None:
        """Learn the tool names of an existing history (OpenAI form), e.g. after a resume."""
        gemini_format.learn_tool_names(messages, self.tool_names)

    def _in_qwen_format(self, record: ChatRecord) -> dict[str, Any]:
        """The field updates that turn an OpenAI-shaped record into Qwen Code's format."""
        out: dict[str, Any] = {}
        msg = record.message
        if msg is not None and not gemini_format.is_gemini_content(msg):
            out["message"] = gemini_format.to_content(msg, self.tool_names)
            shown = gemini_format.display_text(msg)
            if shown is not None and record.systemPayload is None:
                out["systemPayload"] = {"displayText": shown}
            if record.provenance is None:
                role = msg.get("role")
                out["provenance"] = {"user": "real_user", "assistant": "assistant_output",
                                     "tool": "tool_result"}.get(str(role), "system")
        if record.usage is not None:
            out["usage"] = None
            if record.usageMetadata is None:
                out["usageMetadata"] = gemini_format.to_usage_metadata(record.usage)
        payload = record.systemPayload
        hist = payload.get("compressedHistory") if payload else None
        if payload is not None and isinstance(hist, list) and any(
                isinstance(m, dict) and not gemini_format.is_gemini_content(m) for m in hist):
            names = dict(self.tool_names)
            out["systemPayload"] = {**payload,
                                    "compressedHistory": gemini_format.to_contents(hist, names)}
        return out

    def append_message(
        self,
        type: RecordType,
        message: dict[str, Any],
        *,
        usage: dict[str, Any] | None = None,
        model: str | None = None,
        context_window_size: int | None = None,
    ) -> ChatRecord:
        return self.append(
            ChatRecord(
                type=type,
                message=message,
                usage=usage,
                model=model,
                contextWindowSize=context_window_size,
            )
        )

    def append_system(self, subtype: str, payload: dict[str, Any]) -> ChatRecord:
        return self.append(ChatRecord(type="system", subtype=subtype, systemPayload=payload))

    def append_checkpoint(
        self, compressed_history: list[dict[str, Any]], **payload: Any
    ) -> ChatRecord:
        """A ``chat_compression`` record; :func:`resume` restarts from the latest one."""
        return self.append_system(
            SUBTYPE_COMPRESSION, {**payload, "compressedHistory": compressed_history}
        )

    def append_title(self, title: str, *, source: str = "manual") -> ChatRecord:
        return self.append_system(SUBTYPE_TITLE, {"customTitle": title, "titleSource": source})

    def sync(self) -> None:
        """fsync now (whatever the policy)."""
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False
        self._sync_dir_if_pending()
        self._last_sync = time.monotonic()

    def close(self, *, wait_s: float = 10.0) -> None:
        """Write what is queued (waiting up to ``wait_s`` for another writer to finish its
        record, then writing anyway: an acknowledged record is never dropped), then close."""
        if self._fd is not None and (self._queue or self._torn is not None):
            self._wait_and_flush(wait_s)
        if self._drainer is not None and not self._drainer.done():
            self._drainer.cancel()
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._dirty and self.fsync_policy != "never":
                os.fsync(fd)
            self._dirty = False
            self._sync_dir_if_pending()
        finally:
            os.close(fd)

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, data: bytes | bytearray) -> None:
        assert self._fd is not None
        n = os.write(self._fd, data)
        while n < len(data):  # a regular file takes the whole line at once; short writes are rare
            data = bytes(data[n:])
            n = os.write(self._fd, data)

    def _sync_dir_if_pending(self) -> None:
        if self._dir_pending:
            self._fsync_dir()
            self._dir_pending = False

    def _fsync_dir(self) -> None:
        with contextlib.suppress(OSError):
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
