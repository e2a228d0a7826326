"""The filesystem seam under the agent tools: the real tree, or a speculation's overlay.

:mod:`qwenctxd.agents.tools` is written once against :class:`AgentFS`; an agent run picks
its filesystem. :class:`RealTreeFS` reads the real files and writes through the agent's write
scope (:class:`~qwenctxd.agents.permissions.MemoryWriteScope`) and the audit log;
:class:`OverlayTreeFS` reads overlay-first and writes into a copy-on-write
:class:`~qwenctxd.agents.overlay.OverlayFS`, never the project. Both judge where a write lands
by the one rule in :mod:`qwenctxd.agents.containment`. Reads are confined by the same rule:
each filesystem carries a :class:`~qwenctxd.agents.permissions.ReadScope` (the run's read roots
— the project and the memory roots by default — and never a credential path,
:mod:`qwenctxd.agents.credentials`); :meth:`AgentFS.read_refusal` is the one check the tools
ask before they read, list, glob or grep, and a tree walk leaves refused files out. Every read
opens regular files only (:func:`~qwenctxd.fsutil.open_regular`: a FIFO never blocks a tool).
The real tree's writes are redacted first (:func:`~qwenctxd.memory.secrets.vet_document`):
no secret an agent pasted reaches a memory file.

Methods are synchronous; the tools run them in worker threads.
"""

from __future__ import annotations

import errno
import os
from abc import ABC, abstractmethod
from pathlib import Path

import structlog
from wcmatch import glob as wglob

from qwenctxd.agents.audit import AuditEntry, AuditLog
from qwenctxd.agents.containment import is_within, real_location
from qwenctxd.agents.overlay import OverlayFS
from qwenctxd.agents.permissions import MemoryWriteScope, ReadScope
from qwenctxd.fsutil import read_regular
from qwenctxd.memory.secrets import vet_document
from qwenctxd.secrets import COUNTERS

__all__ = ["GLOB_FLAGS", "MAX_GLOB_RESULTS", "SKIP_DIRS", "AgentFS", "OverlayTreeFS",
           "RealTreeFS"]

MAX_GLOB_RESULTS = 500
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", ".mypy_cache"}
log = structlog.get_logger("qwenctxd.agents")
GLOB_FLAGS = wglob.GLOBSTAR | wglob.BRACE | wglob.DOTGLOB


class AgentFS(ABC):
    """What the agent tools see of a project. Paths given are absolute and normalised."""

    cwd: Path
    read_scope: ReadScope

    def read_refusal(self, path: Path) -> str | None:
        """Why ``path`` may not be read (the whole ``Error:`` line), or None."""
        why = self.read_scope.refusal(path)
        return None if why is None else f"Error: {why}"

    @abstractmethod
    def locate(self, path: Path) -> Path:
        """The file to open to read ``path`` (FileNotFoundError when it does not exist)."""

    @abstractmethod
    def list(self, path: Path) -> list[tuple[str, bool]]:
        """``(name, is_dir)`` entries of directory ``path``, sorted by name."""

    @abstractmethod
    def walk(self, root: Path) -> dict[Path, Path]:
        """Every file under ``root`` (``SKIP_DIRS`` pruned): shown path → file to read."""

    @abstractmethod
    def glob(self, root: Path, pattern: str) -> list[str]:
        """Sorted paths under ``root`` matching ``pattern`` (at most ``MAX_GLOB_RESULTS``)."""

    @abstractmethod
    def write_refusal(self, path: Path) -> str | None:
        """Why ``path`` may not be written (the whole ``Error:`` line), or None."""

    @abstractmethod
    def write_text(self, path: Path, text: str) -> bool:
        """Write ``text`` to ``path``; True when the file was created."""

    @abstractmethod
    def delete(self, path: Path) -> None:
        """Delete file ``path`` (refused like a write outside the scope)."""

    def unseen_by_shell(self) -> list[Path]:
        """Changes a shell command in the real ``cwd`` cannot see (none in the real tree)."""
        return []

    def redactions(self, path: Path) -> list[dict[str, object]]:
        """``[{rule, count}]``: the secrets the last write of ``path`` had replaced."""
        return []

    def roll_back(self) -> list[str]:
        """Undo this run's writes (a failed run leaves nothing); the paths put back."""
        return []

    # -- derived ----------------------------------------------------------------------------------
    def read_bytes(self, path: Path, limit: int | None = None) -> bytes:
        """The bytes of regular file ``path`` (at most ``limit``)."""
        try:
            return read_regular(self.locate(path), limit)
        except FileNotFoundError:  # an overlay copy has another name: say which path
            raise _missing(path) from None


def _missing(path: Path) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def _scan(path: Path) -> list[tuple[str, bool]]:
    return sorted((e.name, e.is_dir()) for e in os.scandir(path))


def _through_leaf_link(path: Path) -> Path:
    """Where a write to ``path`` lands: a symlink leaf is written at its target (the place the
    containment rule judged), like the overlay does; any other path as spelled."""
    return Path(real_location(path)) if os.path.islink(path) else path


def _walk_real(root: Path) -> dict[Path, Path]:
    files: dict[Path, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            fp = Path(dirpath) / name
            files[fp] = fp
    return files


def _glob_real(root: Path, pattern: str) -> list[str]:
    if not root.is_dir():
        return []
    found = []
    for m in wglob.iglob(pattern, root_dir=str(root), flags=GLOB_FLAGS):
        found.append(str(root / m))
        if len(found) >= MAX_GLOB_RESULTS:
            break
    return sorted(found)


class RealTreeFS(AgentFS):
    """The real files; writes go through ``scope`` and are recorded in ``audit``."""

    def __init__(self, cwd: Path, scope: MemoryWriteScope, audit: AuditLog, *, agent: str,
                 session: str | None = None, read_scope: ReadScope | None = None) -> None:
        self.cwd, self.scope, self.audit = Path(cwd), scope, audit
        self.read_scope = read_scope if read_scope is not None else ReadScope.of(
            cwd, *scope.writable_roots)
        self.agent, self.session = agent, session
        self._changes: list[AuditEntry] = []  # this run's audited writes and deletes, in order
        self._redacted: dict[str, list[dict[str, object]]] = {}

    def locate(self, path: Path) -> Path:
        return path

    def list(self, path: Path) -> list[tuple[str, bool]]:
        return _scan(path)

    def walk(self, root: Path) -> dict[Path, Path]:
        return _walk_real(root)

    def glob(self, root: Path, pattern: str) -> list[str]:
        return _glob_real(root, pattern)

    def write_refusal(self, path: Path) -> str | None:
        verdict = self.scope.check_write(path)
        return None if verdict.allowed else f"Error: {verdict.reason}"

    def write_text(self, path: Path, text: str) -> bool:
        """Every secret in ``text`` is replaced by ``[redacted: <rule id>]`` first (the agent's
        writes land in project or user memory, or a skill): the file never holds it."""
        verdict = vet_document("agent", text)
        redacted = list(verdict.redacted)
        entry = self.audit.write_file(_through_leaf_link(path), verdict.text, agent=self.agent,
                                      session=self.session, mode=self.scope.file_mode,
                                      dir_mode=self.scope.dir_mode, redacted=redacted or None)
        self._redacted[str(path)] = redacted
        if redacted:
            COUNTERS.add("redacted_writes", sum(int(str(r["count"])) for r in redacted))
            log.info("agent write redacted", agent=self.agent, path=str(path),
                     rules=[r["rule"] for r in redacted])
        self._changes.append(entry)
        return entry.action == "create"

    def redactions(self, path: Path) -> list[dict[str, object]]:
        return self._redacted.get(str(path), [])

    def delete(self, path: Path) -> None:
        refusal = self.write_refusal(path)
        if refusal is not None:
            raise PermissionError(refusal.removeprefix("Error: "))
        target = _through_leaf_link(path)
        entry = self.audit.delete_file(target, agent=self.agent, session=self.session)
        if entry is None:
            raise _missing(path)
        self._changes.append(entry)

    def roll_back(self) -> list[str]:
        """Undo this run's changes newest first, through the audit log (so the log shows both);
        a file someone else changed since, or a change the log does not hold (the dream's
        in-memory plan), is left as it is."""
        restored: list[str] = []
        while self._changes:
            entry = self._changes.pop()
            try:
                self.audit.undo(entry.id, agent=self.agent)
            except (KeyError, ValueError, OSError) as exc:
                log.warning("roll back skipped a change", path=entry.path, reason=str(exc))
                continue
            restored.append(entry.path)
        return list(dict.fromkeys(restored))


class OverlayTreeFS(AgentFS):
    """A speculation's view: reads overlay-first (merged listings, deleted files hidden),
    writes into ``overlay`` (the project is untouched until the overlay is applied)."""

    def __init__(self, cwd: Path, overlay: OverlayFS, read_scope: ReadScope | None = None
                 ) -> None:
        self.cwd, self.overlay = Path(cwd), overlay
        self.read_scope = read_scope if read_scope is not None else ReadScope.of(
            overlay.project_root)

    def locate(self, path: Path) -> Path:
        return self.overlay.resolve_read(path)

    def list(self, path: Path) -> list[tuple[str, bool]]:
        if self.overlay.rel(path) is None:
            return _scan(path)
        try:
            return self.overlay.listdir(path)
        except FileNotFoundError:
            raise _missing(path) from None
        except NotADirectoryError:
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) \
                from None

    def _written_under(self, root: Path) -> list[tuple[str, Path]]:
        """(path relative to ``root``, overlay file) of the files written under ``root``."""
        key = self.overlay.rel(root)
        if key is not None:
            prefix = f"{key}/" if key else ""
            return [(k[len(prefix):], ov) for k, ov in self.overlay.iter_overlay_files(key)
                    if k.startswith(prefix)]
        project = str(self.overlay.project_root)
        if not is_within(project, str(root)):
            return []
        above = os.path.relpath(project, root)  # root is above the project
        return [(f"{above}/{k}", ov) for k, ov in self.overlay.iter_overlay_files()]

    def walk(self, root: Path) -> dict[Path, Path]:
        inside = (str(self.overlay.project_root), str(self.overlay.real_root))
        files: dict[Path, Path] = {}
        for fp in _walk_real(root):
            if not any(is_within(str(fp), r) for r in inside):
                files[fp] = fp  # not a project path: the overlay has nothing to say
            elif not self.overlay.is_deleted(fp):
                files[fp] = self.overlay.resolve_read(fp)
        for rel, ov in self._written_under(root):
            if not any(part in SKIP_DIRS for part in rel.split("/")[:-1]):
                files[root / rel] = ov
        return files

    def glob(self, root: Path, pattern: str) -> list[str]:
        created: set[str] = set()  # written files and the directories they imply
        for rel, _ov in self._written_under(root):
            parts = rel.split("/")
            created.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        found = {str(root / rel): None for rel in sorted(created)
                 if wglob.globmatch(rel, pattern, flags=GLOB_FLAGS)}
        for p in _glob_real(root, pattern):
            if not self.overlay.is_deleted(p):
                found[p] = None
        return sorted(found)[:MAX_GLOB_RESULTS]

    def write_refusal(self, path: Path) -> str | None:
        key = self.overlay.rel(path)
        if key:
            return None
        if key == "":
            return f"Error: write refused: {path} is the project root, not a file"
        return (f"Error: write refused: {path} is outside the project "
                f"{self.overlay.project_root}; only files inside the project may be written")

    def write_text(self, path: Path, text: str) -> bool:
        current = self.locate(path)
        if os.path.exists(current) and not os.path.isdir(current) \
                and not os.path.isfile(current):  # like the real tree: never over a FIFO
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        existed = self.overlay.exists(path)
        self.overlay.write(path, text)
        return not existed

    def delete(self, path: Path) -> None:
        self.overlay.delete(path)

    def unseen_by_shell(self) -> list[Path]:
        return self.overlay.changed()
