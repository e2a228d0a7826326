"""Small filesystem helpers shared by every subsystem (below all of them)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def _replacing(path: Path, mode: int) -> Iterator[BinaryIO]:
    """A temp file in ``path``'s directory to write; on a clean exit it is fsynced, given
    ``mode`` and renamed over ``path``; on any error it is removed and ``path`` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part:
    a temp file in the same directory, fsync, the old file's mode kept, then rename. Text is
    written as UTF-8 with no newline translation."""
    mode = 0o644
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        pass
    with _replacing(path, mode) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy ``src``'s bytes and mode to ``dst`` the same way (temp file + fsync + rename)."""
    mode = stat.S_IMODE(os.stat(src).st_mode)
    with _replacing(dst, mode) as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out)
