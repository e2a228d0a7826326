"""Which instruction files apply to a working directory, in Qwen Code's order.

For each configured filename (default QWEN.md, then AGENTS.md): the global ``~/.qwen/<name>``;
when cwd is the home directory only ``~/<name>``; otherwise an upward scan from cwd that stops
at ``~/.qwen`` and after checking the project root's parent (the home directory's parent when
there is no project root). Then extension context files, then the local slot
``<root>/.qwen/QWEN.local.md`` — only with a real project root, never through a symlink, loaded
last. Include directories (``context.loadFromIncludeDirectories``) run the same procedure
first. Discovery only stats; reading happens in ``assemble``. Every path it looked at is
returned so watchers can notice a file that appears later.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from qwenctxd.fsutil import read_regular

LOCAL_FILENAME = "QWEN.local.md"
OUTPUT_LANGUAGE_FILENAME = "output-language.md"
FileType = Literal["user", "project", "local", "extension"]


@dataclass(frozen=True)
class InstructionFile:
    path: Path
    type: FileType


@dataclass
class Discovery:
    cwd: Path
    project_root: Path | None
    files: list[InstructionFile]
    probed: set[Path] = field(default_factory=set)  # every candidate path that was checked
    problems: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def effective_root(self) -> Path:
        return self.project_root or self.cwd


def normalize_filenames(value: str | list[str]) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    out = []
    for n in names:
        n = n.strip()
        if n and n not in out:
            out.append(n)
    return out or ["QWEN.md", "AGENTS.md"]


def _is_readable_file(path: Path, probed: set[Path]) -> bool:
    probed.add(path)
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


def _upward(cwd: Path, name: str, *, home: Path, qwen_dir: Path, root: Path | None,
            probed: set[Path]) -> list[Path]:
    stop = (root.parent if root is not None else home.parent)
    found: list[Path] = []
    current = cwd
    while current != current.parent:
        if current == qwen_dir:
            break
        candidate = current / name
        if _is_readable_file(candidate, probed):
            found.insert(0, candidate)
        if current == stop:
            break
        current = current.parent
    return found


def _for_dir(directory: Path, names: list[str], *, home: Path, qwen_dir: Path,
             root: Path | None, probed: set[Path]) -> list[InstructionFile]:
    out: list[InstructionFile] = []
    for name in names:
        global_file = qwen_dir / name
        if _is_readable_file(global_file, probed):
            out.append(InstructionFile(global_file, "user"))
        if directory == home:
            home_file = home / name
            if home_file != global_file and _is_readable_file(home_file, probed):
                out.append(InstructionFile(home_file, "user"))
            continue
        for path in _upward(directory, name, home=home, qwen_dir=qwen_dir, root=root,
                            probed=probed):
            kind: FileType = "user" if path.parent == home else "project"
            out.append(InstructionFile(path, kind))
    return out


def discover(
    cwd: Path,
    *,
    filenames: list[str],
    home: Path,
    qwen_dir: Path,
    extension_paths: list[Path] = (),  # type: ignore[assignment]
    include_dirs: list[Path] = (),  # type: ignore[assignment]
    project_root: Path | None,
    root_of: Callable[[Path], Path | None],
) -> Discovery:
    """What to load for ``cwd``, whose project root is ``project_root`` (as the caller
    resolved it); ``root_of`` maps any other directory (an include dir) to its git root (the
    daemon passes its project registry's lookup)."""
    cwd = Path(os.path.abspath(cwd))
    home = Path(os.path.abspath(home))
    qwen_dir = Path(os.path.abspath(qwen_dir))
    names = normalize_filenames(filenames)
    root = project_root
    probed: set[Path] = set()
    result = Discovery(cwd=cwd, project_root=root, files=[], probed=probed)
    seen: set[Path] = set()

    def add(f: InstructionFile) -> None:
        if f.path not in seen:
            seen.add(f.path)
            result.files.append(f)

    for directory in [*[Path(os.path.abspath(d)) for d in include_dirs], cwd]:
        dir_root = root if directory == cwd else root_of(directory)
        for f in _for_dir(directory, names, home=home, qwen_dir=qwen_dir, root=dir_root,
                          probed=probed):
            add(f)
    for ext in extension_paths:
        ext = Path(os.path.abspath(ext))
        if _is_readable_file(ext, probed):
            add(InstructionFile(ext, "extension"))
        else:
            result.problems.append((ext, "extension context file not found or not a file"))
    output_language = qwen_dir / OUTPUT_LANGUAGE_FILENAME
    if _is_readable_file(output_language, probed):
        add(InstructionFile(output_language, "user"))
    if root is not None and root != home:
        local = root / ".qwen" / LOCAL_FILENAME
        probed.add(local)
        try:
            st = os.lstat(local)
        except OSError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                result.problems.append((local, "refused: QWEN.local.md must not be a symlink"))
            elif stat.S_ISREG(st.st_mode):
                add(InstructionFile(local, "local"))
    return result


def extension_context_files(qwen_dir: Path, project_root: Path | None) -> list[Path]:
    """Context files declared by installed extensions, as Qwen Code lays them out.

    Each ``<.qwen>/extensions/<name>/qwen-extension.json`` (user level, then the project's)
    may name ``contextFileName`` (a string or a list; default ``QWEN.md``) relative to the
    extension's directory; files that exist are returned in extension-name order.
    """
    import json

    bases = [qwen_dir / "extensions"]
    if project_root is not None:
        bases.append(project_root / ".qwen" / "extensions")
    out: list[Path] = []
    for base in bases:
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            ext_dir = base / name
            try:
                manifest = json.loads(read_regular(ext_dir / "qwen-extension.json").decode("utf-8"))
            except (OSError, ValueError):
                continue
            files = manifest.get("contextFileName", "QWEN.md") if isinstance(manifest, dict) \
                else "QWEN.md"
            for f in [files] if isinstance(files, str) else list(files or []):
                if isinstance(f, str) and f.strip():
                    path = (ext_dir / f).resolve()
                    if path.is_file() and path.is_relative_to(ext_dir.resolve()):
                        out.append(path)
    return out
