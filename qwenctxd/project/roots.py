"""The pure lookups behind a project: its git root, and (from :mod:`qwenctxd.paths`, where
they are resolved for daemon and clients alike) the user's home and ``~/.qwen``.

Only :class:`~qwenctxd.project.registry.ProjectRegistry` (and standalone helpers with no
registry at hand) call these; the subsystems receive a resolved
:class:`~qwenctxd.project.registry.Project` instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from qwenctxd.paths import home as home_dir
from qwenctxd.paths import qwen_home

__all__ = ["find_project_root", "home_dir", "qwen_home"]


def _has_git_marker(directory: Path) -> bool:
    marker = directory / ".git"
    return marker.is_dir() or marker.is_file()


def find_project_root(start: Path) -> Path | None:
    """The nearest directory from ``start`` upwards (inclusive) that holds ``.git`` (a
    directory, or a file as in worktrees and submodules). Pure path checks, no subprocess."""
    current = Path(os.path.normpath(os.path.abspath(start)))
    for directory in (current, *current.parents):
        if _has_git_marker(directory):
            return directory
    return None
