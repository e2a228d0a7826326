"""``qwenctl doctor``'s memory-modes check: memory files and folders others may read.

The daemon creates memory files 0600 and memory folders 0700, but never re-modes what already
exists (a file made by an older version, by Qwen Code, or by hand keeps its mode). This check
finds the loose ones — any group or other permission bit — under the user memory
(``<base>/memories/``), every project memory (``<base>/projects/*/memory/``) and the daemon's
own per-project state next to it (``meta.json``, ``extract-cursor.json``, the recall index and
hit counts; session transcripts there belong to Qwen Code and are left alone). ``<base>`` is
``QWEN_CODE_MEMORY_BASE_DIR``, else the runtime base dir (``QWEN_RUNTIME_DIR`` or ``~/.qwen``),
as the daemon resolves it. ``--fix-modes`` takes the group and other bits away (files 0600,
folders 0700 for the usual owner bits). Symlinks are not followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from qwenctxd.paths import runtime_base_dir

ENV_BASE_DIR = "QWEN_CODE_MEMORY_BASE_DIR"  # as qwenctxd.memory.paths reads it
STATE_FILES = ("meta.json", "extract-cursor.json", "recall-hits.json", "recall.sqlite",
               "recall.sqlite-wal", "recall.sqlite-shm", "consolidation.lock")
LOOSE_BITS = 0o077


def memory_base(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    override = env.get(ENV_BASE_DIR)
    return Path(override).expanduser() if override else runtime_base_dir(env)


def _tree(root: Path) -> Iterator[Path]:
    if not root.is_dir() or root.is_symlink():
        return
    yield root
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            yield Path(dirpath) / name


def memory_paths(base: Path) -> Iterator[Path]:
    """Every memory folder and file, and the daemon's per-project state files."""
    yield from _tree(base / "memories")
    projects = base / "projects"
    try:
        slugs = sorted(p for p in projects.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return
    for state in slugs:
        yield from _tree(state / "memory")
        for name in STATE_FILES:
            if (state / name).exists():
                yield state / name


def loose_modes(base: Path) -> list[dict[str, Any]]:
    """``{path, kind, mode}`` of each memory file or folder with group/other bits set."""
    out = []
    for p in memory_paths(base):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & LOOSE_BITS:
            out.append({"path": str(p), "kind": "folder" if stat.S_ISDIR(st.st_mode) else "file",
                        "mode": f"{mode:04o}"})
    return out


def fix_modes(loose: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, str]]]:
    """Take the group/other bits off each; (fixed paths, [{path, error}])."""
    fixed, failed = [], []
    for item in loose:
        try:
            mode = stat.S_IMODE(os.lstat(item["path"]).st_mode)
            os.chmod(item["path"], mode & ~LOOSE_BITS, follow_symlinks=False)
            fixed.append(item["path"])
        except OSError as exc:
            failed.append({"path": item["path"], "error": exc.strerror or str(exc)})
    return fixed, failed


def check_memory_modes(fix: bool, environ: Mapping[str, str] | None = None
                       ) -> dict[str, Any]:
    """The doctor check: ``{name, status, summary, details}``."""
    base = memory_base(environ)
    loose = loose_modes(base)
    details: dict[str, Any] = {"base": str(base), "loose": loose, "fix": "qwenctl doctor "
                               "--fix-modes"}
    if not loose:
        return {"name": "memory-modes", "status": "ok", "details": details,
                "summary": f"memory under {base} is private (files 0600, folders 0700)"}
    if fix:
        fixed, failed = fix_modes(loose)
        details.update(fixed=fixed, failed=failed)
        if not failed:
            return {"name": "memory-modes", "status": "ok", "details": details,
                    "summary": f"fixed {len(fixed)} memory file(s)/folder(s) others could "
                               "read (group/other permissions removed)"}
        return {"name": "memory-modes", "status": "warn", "details": details,
                "summary": f"fixed {len(fixed)}, could not fix {len(failed)}: "
                           f"{failed[0]['path']} ({failed[0]['error']})"}
    first = loose[0]
    return {"name": "memory-modes", "status": "warn", "details": details,
            "summary": f"{len(loose)} memory file(s)/folder(s) others can read (e.g. "
                       f"{first['path']} {first['mode']}); fix: qwenctl doctor --fix-modes"}
