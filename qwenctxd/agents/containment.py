"""The one path-containment rule of the agents: is a path inside a root, and where inside.

A path is judged where it really lands: it is normalised (``..`` folded), then resolved
through the realpath of its nearest existing ancestor (a symlink leaf is judged by its target,
a symlinked directory by where it points), and the result must lie inside the realpath of the
root. So ``..`` segments, symlinks out of the tree and absolute outside paths cannot escape,
and two spellings of one file get one key. The speculation overlay keys its copies with
:func:`contained_key`; the real tree's write scopes (:mod:`qwenctxd.agents.permissions`) and
both agent filesystems (:mod:`qwenctxd.agents.fs`) use the same function. The primitives
(:func:`real_location`, :func:`is_within`) live in :mod:`qwenctxd.fsutil`, where memory's scope
classification uses them too.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from qwenctxd.fsutil import is_within, real_location

__all__ = ["contained_key", "is_within", "real_location"]


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
