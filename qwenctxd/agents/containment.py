"""The one path-containment rule of the agents: is a path inside a root, and where inside.

A path is judged where it really lands: it is normalised (``..`` folded), then resolved
through the realpath of its nearest existing ancestor (a symlink leaf is judged by its target,
a symlinked directory by where it points), and the result must lie inside the realpath of the
root. So ``..`` segments, symlinks out of the tree and absolute outside paths cannot escape,
and two spellings of one file get one key. The speculation overlay keys its copies with
:func:`contained_key`; the real tree's write scopes (:mod:`qwenctxd.agents.permissions`) and
both agent filesystems (:mod:`qwenctxd.agents.fs`) use the same function.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

__all__ = ["contained_key", "is_within", "real_location"]


def real_location(path: str | os.PathLike[str]) -> str:
    """Where ``path`` (absolute) really lands: realpath of its nearest existing ancestor
    (the leaf included when it exists), with the not-yet-existing tail appended."""
    probe = os.path.normpath(os.fspath(path))
    tail: list[str] = []
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        tail.append(os.path.basename(probe))
        probe = parent
    base = os.path.realpath(probe)
    for part in reversed(tail):
        base = os.path.join(base, part)
    return os.path.normpath(base)


def is_within(path: str, root: str) -> bool:
    """Lexically: ``path`` is ``root`` or below it (both normalised absolute strings)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def contained_key(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str | None:
    """The POSIX key of ``path`` relative to ``root`` ("" for the root itself), or None when
    ``path`` really lands outside ``root``. A relative ``path`` is taken relative to ``root``."""
    raw, base = os.fspath(path), os.path.abspath(os.fspath(root))
    full = raw if os.path.isabs(raw) else os.path.join(base, raw)
    real_root = os.path.realpath(base)
    real = real_location(full)
    if not is_within(real, real_root):
        return None
    rel = os.path.relpath(real, real_root)
    return "" if rel == "." else PurePosixPath(Path(rel)).as_posix()
