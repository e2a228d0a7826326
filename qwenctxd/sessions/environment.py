"""The environment reminder of a session's first user message: date, OS, cwd, a folder tree.

Qwen Code 0.24 opens every conversation with a startup context in the first user message:
today's date in words, the operating system, the working directory and a folder structure of
about 20 entries. The daemon writes the same facts once into history (a ``<system-reminder>``
part of the first user message of a new session), so they never change the cached prefix.

The tree is gathered breadth-first up to :data:`MAX_TREE_ITEMS` entries (files before folders
in each directory, names sorted case-insensitively); folders that are never worth listing
(``.git``, ``node_modules``, virtualenvs, caches) appear as ``name/...`` and are not entered,
and a directory whose entries did not fit ends with ``...``. Only ``os.scandir``: no file is
opened, symlinked directories are not followed.

:class:`EnvironmentReminders` gathers it in a worker thread for a session starting now, and
shares it with the sessions that start in the same directory within :data:`REUSE_S` while the
directory's own mtime is unchanged (a burst of 32 proxied conversations, a fan of subagents:
one walk, not 32 threads walking the same tree at once).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import anyio.to_thread

from qwenctxd.tasks import SharedLoads, TaskRegistry

MAX_TREE_ITEMS = 20
SKIPPED_DIRS = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", ".tox", "dist", "build", ".next"})
MAX_DIR_ENTRIES = 2_000  # a huge directory is sampled, never read whole
REUSE_S = 2.0  # sessions starting in one directory this close together share its reminder


@dataclass
class _Node:
    name: str
    is_dir: bool
    skipped: bool = False
    children: list[_Node] = field(default_factory=list)
    truncated: bool = False


def _entries(path: Path) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                out.append((entry.name, is_dir))
                if len(out) >= MAX_DIR_ENTRIES:
                    break
    except OSError:
        return []
    files = sorted((e for e in out if not e[1]), key=lambda e: e[0].lower())
    dirs = sorted((e for e in out if e[1]), key=lambda e: e[0].lower())
    return files + dirs


def folder_tree(root: Path, max_items: int = MAX_TREE_ITEMS) -> str:
    """``root`` and up to ``max_items`` entries below it, drawn as a tree."""
    top = _Node(name=str(root).rstrip("/") + "/", is_dir=True)
    queue: deque[tuple[_Node, Path]] = deque([(top, root)])
    count = 0
    while queue:
        node, path = queue.popleft()
        entries = _entries(path)
        for name, is_dir in entries:
            if count >= max_items:
                node.truncated = True
                break
            child = _Node(name=name, is_dir=is_dir, skipped=is_dir and name in SKIPPED_DIRS)
            node.children.append(child)
            count += 1
            if is_dir and not child.skipped:
                queue.append((child, path / name))
        if count >= max_items and queue:
            for pending, pending_path in queue:  # folders never listed: their entries are cut
                pending.truncated = _entries_exist(pending_path)
            break
    lines = [top.name]
    _draw(top, "", lines)
    return "\n".join(lines)


def _entries_exist(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is not None
    except OSError:
        return False


def _draw(node: _Node, indent: str, lines: list[str]) -> None:
    items: list[_Node | None] = [*node.children, *([None] if node.truncated else [])]
    for i, child in enumerate(items):
        last = i == len(items) - 1
        branch = "└───" if last else "├───"
        if child is None:
            lines.append(f"{indent}{branch}...")
            continue
        suffix = "/..." if child.skipped else "/" if child.is_dir else ""
        lines.append(f"{indent}{branch}{child.name}{suffix}")
        if child.is_dir and not child.skipped:
            _draw(child, indent + ("    " if last else "│   "), lines)


def date_in_words(now: datetime) -> str:
    """``Tuesday, December 1, 2026`` (English, locale-independent)."""
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    months = ("January", "February", "March", "April", "May", "June", "July", "August",
              "September", "October", "November", "December")
    return f"{days[now.weekday()]}, {months[now.month - 1]} {now.day}, {now.year}"


def environment_reminder(cwd: Path, *, now: datetime | None = None) -> str:
    """The ``<system-reminder>`` with the session's startup context."""
    when = now or datetime.now().astimezone()
    return (
        "<system-reminder>\n"
        "Context of this session, gathered when it started.\n"
        f"Today's date: {date_in_words(when)}.\n"
        f"Operating system: {sys.platform}\n"
        f"Working directory: {cwd}\n"
        f"Folder structure of the working directory (at most {MAX_TREE_ITEMS} entries):\n\n"
        f"{folder_tree(cwd)}\n"
        "</system-reminder>"
    )


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class EnvironmentReminders:
    """The environment reminder of sessions starting now (see the module docstring): one
    gathering per directory at a time, shared through :class:`~qwenctxd.tasks.SharedLoads`
    (it runs in the daemon's task group, so a cancelled session does not abort it for the
    others)."""

    def __init__(self, tasks: TaskRegistry | None = None, *, reuse_s: float = REUSE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reuse_s = reuse_s
        self._clock = clock
        #: cwd -> (gathered at, the directory's mtime then, the reminder)
        self._loads: SharedLoads[Path, tuple[float, int | None, str]] = SharedLoads(
            tasks, "environment")
        self.walks = 0  # folder walks made (the rest were shared)

    async def get(self, cwd: Path) -> str:
        hit = self._loads.peek(cwd)
        if hit is not None:
            if self._clock() - hit[0] <= self.reuse_s and _mtime(cwd) == hit[1]:
                return hit[2]
            self._loads.invalidate(cwd)  # stale: the next get gathers afresh

        async def gather() -> tuple[float, int | None, str]:
            at = self._clock()
            mtime, text = await anyio.to_thread.run_sync(
                lambda: (_mtime(cwd), environment_reminder(cwd)))
            self.walks += 1
            return at, mtime, text

        return (await self._loads.get(cwd, gather))[2]
