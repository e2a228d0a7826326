"""Session files shared with a running Qwen Code: when it is safe to append, and who holds one.

Qwen Code appends a record with ``fs.promises.appendFile`` on its own ``O_APPEND`` descriptor;
Node cuts a record over 512 KiB into several ``write()`` calls, and Qwen Code's lock is an
in-process mutex (no ``flock``, no lock file), so nothing outside its process orders its writes
against ours. A line of ours written between two of those ``write()`` calls tears both records.
:func:`append_state` is the rule :class:`~qwenctxd.sessions.jsonl_writer.JsonlWriter` follows before
each append: the file must end in ``"\\n"`` and, if it grew since our last write, must have stayed
the same size for :data:`SETTLE_S` (another writer's chunks of one record follow each other within
microseconds). A partial tail that has not changed for :data:`STALE_TAIL_S` is a dead writer's
torn line: it is closed with ``"\\n"`` and the append proceeds.

Those checks leave a window of microseconds between the last look and our ``write()``: another
writer may start a record in it. The writer then sees that the byte before its line is not
``"\\n"`` and :func:`mend_interleave` puts the bytes back in order once the other record is
complete: ``head | ours | rest`` becomes ``head rest | ours`` in place — the same bytes in the same
span, so the other writer's ``O_APPEND`` writes (always at the end) are never touched.

:func:`holders` finds the running Qwen Code processes that registered a session, exactly as
``qwen sessions ps`` does (Qwen Code 0.24 ``services/session-registry.ts``): one JSON record per
process under ``<qwen home>/sessions/<pid>.json`` (or ``<pid>-<8 hex>.json``) with ``pid``,
``procStart`` (``<boot id>:<start time in clock ticks>`` from ``/proc/<pid>/stat`` field 22),
``pidNs`` (inode of ``/proc/self/ns/pid``), ``sessionId``, ``cwd``, ``startedAt`` (ms), ``kind``.
A record counts when its file name's pid is its ``pid``, its namespace and boot id are ours and
the process is alive, not a zombie, and has the recorded start time. Unlike ``qwen sessions ps``
we never delete a stale record: the directory is Qwen Code's.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SETTLE_S = 0.02  # a file that grew under us must stay this long unchanged before we append
STALE_TAIL_S = 5.0  # a partial last line unchanged this long is a crashed writer's torn tail
POLL_S = 0.005

AppendState = Literal["ok", "wait", "stale_tail"]
MendState = Literal["mended", "wait", "gave_up"]
_SCAN = 1 << 20

_RECORD_NAME = re.compile(r"^\d+(-[0-9a-f]{8})?\.json$")
_MAX_RECORD_BYTES = 64 * 1024


def ends_in_newline(fd: int, size: int) -> bool:
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


@dataclass
class TailWatch:
    """What the writer saw of the file's end since it last found it unsafe."""

    size: int = -1
    since: float = 0.0


def append_state(fd: int, expected_size: int, watch: TailWatch, now: float) -> AppendState:
    """May a record be appended to ``fd`` now? ``expected_size``: the size after our last write
    (the writer's own size; -1 when it has none). Leaves the size it saw in ``watch.size``."""
    size = os.fstat(fd).st_size
    if size != watch.size:
        watch.size, watch.since = size, now
    if size == expected_size:
        return "ok"  # append-only: at our last write's size, the end is our newline
    newline = ends_in_newline(fd, size)
    quiet = now - watch.since
    if newline:
        return "ok" if quiet >= SETTLE_S else "wait"
    return "stale_tail" if quiet >= STALE_TAIL_S else "wait"


@dataclass
class Interleave:
    """Our lines ``[start, end)`` landed after another writer's partial record."""

    start: int
    end: int
    size: int = -1
    since: float = 0.0
    ours_end: int = -1  # where our lines end once mended


def _line_start(fd: int, pos: int) -> int:
    """The offset just after the last ``"\\n"`` before ``pos`` (0 when there is none)."""
    while pos > 0:
        begin = max(0, pos - _SCAN)
        at = os.pread(fd, pos - begin, begin).rfind(b"\n")
        if at >= 0:
            return begin + at + 1
        pos = begin
    return 0


def _line_end(fd: int, pos: int, size: int) -> int | None:
    """The offset just after the first ``"\\n"`` at or after ``pos``; None when none yet."""
    while pos < size:
        chunk = os.pread(fd, min(_SCAN, size - pos), pos)
        if not chunk:
            return None
        at = chunk.find(b"\n")
        if at >= 0:
            return pos + at + 1
        pos += len(chunk)
    return None


def mend_interleave(path: Path, fd: int, torn: Interleave, now: float) -> MendState:
    """Move our lines after the other writer's record they landed inside, once it is complete.

    ``"wait"`` while the other record's end has not been written; ``"gave_up"`` when it never
    came (unchanged for :data:`STALE_TAIL_S`), when the file was replaced, or when the reassembled
    record is not JSON (more than one foreign writer): our lines are intact either way.
    """
    size = os.fstat(fd).st_size
    if size != torn.size:
        torn.size, torn.since = size, now
    end = _line_end(fd, torn.end, size)
    if end is None:
        return "gave_up" if now - torn.since >= STALE_TAIL_S else "wait"
    begin = _line_start(fd, torn.start)
    head = os.pread(fd, torn.start - begin, begin)
    ours = os.pread(fd, torn.end - torn.start, torn.start)
    rest = os.pread(fd, end - torn.end, torn.end)
    joined = head + rest
    try:
        json.loads(joined)
    except ValueError:
        return "gave_up"
    try:
        wfd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return "gave_up"
    try:
        mine, theirs = os.fstat(fd), os.fstat(wfd)
        if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
            return "gave_up"
        data, at = joined + ours, begin
        while data:  # no O_APPEND here: pwrite lands at ``at``
            n = os.pwrite(wfd, data, at)
            data, at = data[n:], at + n
    finally:
        os.close(wfd)
    torn.ours_end = end
    return "mended"


# -- the session registry of Qwen Code ------------------------------------------------------------
@dataclass(frozen=True)
class Holder:
    """A running Qwen Code process that registered a session."""

    pid: int
    session_id: str
    cwd: str
    kind: str
    started_at_ms: float


def _boot_id() -> str | None:
    try:
        value = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return value if re.fullmatch(r"[0-9a-fA-F-]+", value) else None


def _pid_ns() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    end = raw.rfind(")")
    return raw[end + 1:].split() if end >= 0 else None


def proc_start_token(pid: int) -> str | None:
    """Qwen Code's ``procStart`` for ``pid``: ``<boot id>:<starttime>``."""
    boot = _boot_id()
    fields = _stat_fields(pid)
    if boot is None or fields is None or len(fields) < 20 or not fields[19].isdigit():
        return None
    return f"{boot}:{fields[19]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass
    except OSError:
        return False
    fields = _stat_fields(pid)
    return not (fields and fields[0] == "Z")


def holders(qwen_home: Path, session_id: str | None = None) -> list[Holder]:
    """The live registrations under ``qwen_home/sessions`` (of ``session_id`` when given)."""
    directory = qwen_home / "sessions"
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    ns, boot = _pid_ns(), _boot_id()
    out: list[Holder] = []
    for name in names:
        if not _RECORD_NAME.match(name):
            continue
        path = directory / name
        try:
            if not path.is_file() or path.stat().st_size > _MAX_RECORD_BYTES:
                continue
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict):
            continue
        pid, sid = rec.get("pid"), rec.get("sessionId")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(sid, str):
            continue
        if session_id is not None and sid != session_id:
            continue
        if str(pid) != name.split("-")[0].split(".")[0] or rec.get("pidNs") != ns:
            continue
        start = rec.get("procStart")
        if isinstance(start, str) and ":" in start and start.split(":", 1)[0] != boot:
            continue
        if not _alive(pid):
            continue
        if isinstance(start, str):
            current = proc_start_token(pid)
            if current is not None and current != start:
                continue
        kind = rec.get("kind") if isinstance(rec.get("kind"), str) and rec.get("kind") else "tui"
        started = rec.get("startedAt")
        out.append(Holder(pid, sid, str(rec.get("cwd", "")), str(kind),
                          float(started) if isinstance(started, (int, float)) else 0.0))
    return out


def held_warning(h: Holder) -> str:
    """The ``session.open`` warning for a session a running Qwen Code holds (docs/protocol.md)."""
    return (f"session is open in a running Qwen Code (pid {h.pid}, {h.kind}): records from both "
            "are kept in file order, but do not send turns from both at once")

