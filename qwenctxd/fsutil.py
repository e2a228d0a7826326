"""Small filesystem helpers shared by every subsystem (below all of them)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part:
    a temp file in the same directory, fsync, the old file's mode kept, then rename. Text is
    written as UTF-8 with no newline translation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o644
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        pass
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
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
