"""Small filesystem helpers shared by every subsystem (below all of them): atomic writes (a new
file gets the caller's mode — 0600 for memory — an existing one keeps its own; missing
folders are made with the caller's folder mode — 0700 for memory), and reads that refuse
anything but a regular file (a FIFO named QWEN.md would block a worker thread forever; a
device would never end)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@contextmanager
def open_regular(path: str | os.PathLike[str], buffering: int = -1) -> Iterator[BinaryIO]:
    """Open ``path`` (symlinks followed) for binary reading if it is a regular file.

    The open never blocks (``O_NONBLOCK``: a FIFO without a writer opens at once) and the type
    is checked on the open descriptor, so a swap between check and read cannot slip through.
    A directory raises IsADirectoryError; a FIFO, socket or device OSError(EINVAL,
    "not a regular file")."""
    fd = os.open(path, _READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        f = os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of a regular file (at most ``limit``); see :func:`open_regular`."""
    with open_regular(path) as f:
        return f.read() if limit is None else f.read(limit)


PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def make_dirs(path: Path, mode: int | None = None) -> None:
    """``mkdir -p path``; with ``mode``, every folder this call creates gets exactly ``mode``
    (whatever the umask), and folders that already exist are left as they are."""
    if mode is None:
        path.mkdir(parents=True, exist_ok=True)
        return
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, as they made it
        os.chmod(directory, mode)
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)  # raises the right error (a file in the way)


#: bytes of the target's name kept in a temp file's name: "." + stem + "." + 8 random + ".tmp"
#: stays under NAME_MAX (255) whatever the target's name (which the rename then checks itself).
_TEMP_STEM_BYTES = 200


def _temp_stem(name: str) -> str:
    """``name`` cut to _TEMP_STEM_BYTES bytes of the file system encoding, at a character."""
    raw = os.fsencode(name)
    if len(raw) <= _TEMP_STEM_BYTES:
        return name
    return os.fsdecode(raw[:_TEMP_STEM_BYTES].decode("utf-8", errors="ignore").encode())


@contextmanager
def _replacing(path: Path, mode: int, dir_mode: int | None = None) -> Iterator[BinaryIO]:
    """A temp file in ``path``'s directory to write; on a clean exit it is fsynced, given
    ``mode`` and renamed over ``path``; on any error it is removed and ``path`` is untouched."""
    make_dirs(path.parent, dir_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{_temp_stem(path.name)}.", suffix=".tmp",
                               dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o644,
                 dir_mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part:
    a temp file in the same directory, fsync, the old file's mode kept (``mode`` only for a
    file that does not exist yet; missing folders made with ``dir_mode``), then rename. Text
    is written as UTF-8 with no newline translation."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        pass
    with _replacing(path, mode, dir_mode) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy ``src``'s bytes and mode to ``dst`` the same way (temp file + fsync + rename)."""
    mode = stat.S_IMODE(os.stat(src).st_mode)
    with _replacing(dst, mode) as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out)


# -- where a path really lands: the one containment rule (agents' write scopes, their overlay,
#    memory's scope classification)
def real_location(path: str | os.PathLike[str]) -> str:
    """Where ``path`` (absolute) really lands: ``..`` folded, then the realpath of its nearest
    existing ancestor (the leaf included when it exists, a dangling leaf link followed to its
    target), with the not-yet-existing tail appended."""
    probe = os.path.normpath(os.path.abspath(os.fspath(path)))
    tail: list[str] = []
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        tail.append(os.path.basename(probe))
        probe = parent
    base = os.path.realpath(probe)  # non-strict: a dangling link still resolves to its target
    for part in reversed(tail):
        base = os.path.join(base, part)
    return os.path.normpath(base)


def is_within(path: str, root: str) -> bool:
    """Lexically: ``path`` is ``root`` or below it (both normalised absolute strings), compared
    component-wise, never as a bare string prefix."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
