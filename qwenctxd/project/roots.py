"""The pure lookups behind a project: its git root and the user's home and ``~/.qwen``.

Only :class:`~qwenctxd.project.registry.ProjectRegistry` (and standalone helpers with no
registry at hand) call these; the subsystems receive a resolved
:class:`~qwenctxd.project.registry.Project` instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


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


def home_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$HOME`` (else the password database's idea of it)."""
    env = os.environ if environ is None else environ
    return Path(env.get("HOME") or os.path.expanduser("~"))


def qwen_home(environ: Mapping[str, str] | None = None) -> Path:
    """``~/.qwen`` (``QWEN_HOME`` overrides, as Qwen Code allows)."""
    env = os.environ if environ is None else environ
    q = env.get("QWEN_HOME")
    return Path(q).expanduser() if q else home_dir(env) / ".qwen"
