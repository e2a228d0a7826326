"""A copy-on-write overlay over a project directory, for speculative agent runs (§8).

Writes never touch the project: they land in ``overlay_dir/tree/<rel>`` (the original is
copied in first, so its mode is kept, then the new content is written atomically). Reads go
overlay-first: :meth:`OverlayFS.resolve_read` returns the overlay copy when there is one, else
the real path. :meth:`OverlayFS.delete` records a whiteout, after which the path reads as
missing. :meth:`OverlayFS.apply` copies every change back (atomically per file; whiteouts
delete) and :meth:`OverlayFS.discard` removes the overlay directory; until ``apply`` the real
project is byte-identical to what it was.

Paths are keyed by :func:`~qwenctxd.agents.containment.contained_key` (the agents' one
containment rule): their location relative to the *real* project root, from the realpath of
the nearest existing ancestor, so ``..`` segments and symlinked directories cannot escape the
project (:class:`~qwenctxd.protocol.errors.PathOutsideProject`) and two spellings of one file
share one overlay copy. A symlink leaf is judged by its target.

Thread-safe: tools run in worker threads, so every mutation holds one lock, and after
``discard``/``apply`` the overlay is closed (later writes raise :class:`OverlayClosed`), which
makes an abort racing a tool call in a worker thread safe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from qwenctxd.agents.containment import contained_key, is_within, real_location
from qwenctxd.fsutil import atomic_copy, atomic_write, open_regular
from qwenctxd.protocol.errors import PathOutsideProject

__all__ = ["OverlayClosed", "OverlayFS", "default_overlay_dir"]


class OverlayClosed(RuntimeError):
    """The overlay was applied or discarded; it takes no more writes."""


def default_overlay_dir() -> Path:
    """``$XDG_RUNTIME_DIR/qwenctxd/speculation/<pid>/<8-hex>``, else the same under
    ``<tmp>/qwenctxd-<uid>/``. Not created here."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base: Path | None = None
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        base = Path(runtime) / "qwenctxd"
    if base is None:
        base = Path(tempfile.gettempdir()) / f"qwenctxd-{os.getuid()}"
    return base / "speculation" / str(os.getpid()) / uuid.uuid4().hex[:8]


def _sha256(path: Path) -> str | None:
    try:
        with open_regular(path) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


class OverlayFS:
    """Copy-on-write view of ``project_root`` whose changes live in ``overlay_dir``.

    ``overlay_dir`` (default :func:`default_overlay_dir`) is created 0700 and must not lie
    inside the project; ``remove_empty_parent`` (default: only for the default directory)
    removes its parent too when that is left empty. Relative paths given to the methods are
    taken relative to the project.
    """

    def __init__(self, project_root: Path, overlay_dir: Path | None = None, *,
                 remove_empty_parent: bool | None = None) -> None:
        self.project_root = Path(os.path.normpath(os.path.abspath(project_root)))
        self.real_root = Path(os.path.realpath(self.project_root))
        if not self.real_root.is_dir():
            raise NotADirectoryError(f"project root {project_root} is not a directory")
        # the <pid> level of the default layout goes away with its last overlay
        self._remove_parent = overlay_dir is None if remove_empty_parent is None \
            else remove_empty_parent
        self.overlay_dir = Path(os.path.abspath(overlay_dir or default_overlay_dir()))
        if is_within(real_location(self.overlay_dir), str(self.real_root)):
            raise ValueError("the overlay directory must not be inside the project")
        self.overlay_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.overlay_dir, 0o700)
        self.tree = self.overlay_dir / "tree"
        self.tree.mkdir(mode=0o700, exist_ok=True)
        self._whiteouts: set[str] = set()
        self._written: set[str] = set()
        self._base_hash: dict[str, str | None] = {}  # real content hash at first change
        self._lock = threading.RLock()
        self._closed = False

    # -- path handling --------------------------------------------------------------------------
    def rel(self, path: str | os.PathLike[str]) -> str | None:
        """The project-relative key (POSIX, no ``..``) of ``path``, or None when it is outside
        the project (after normalisation and realpath of the nearest existing ancestor)."""
        return contained_key(path, self.project_root)

    def _require_rel(self, path: str | os.PathLike[str]) -> str:
        rel = self.rel(path)
        if rel is None:
            raise PathOutsideProject(f"{os.fspath(path)} is outside the project "
                                     f"{self.project_root}", data={"path": os.fspath(path)})
        if rel == "":
            raise IsADirectoryError(f"{os.fspath(path)} is the project root")
        return rel

    def _ov(self, rel: str) -> Path:
        return self.tree / rel if rel else self.tree

    def _real(self, rel: str) -> Path:
        return self.real_root / rel if rel else self.real_root

    def _hidden(self, rel: str) -> bool:
        """Whether the *real* counterpart of ``rel`` is deleted (it or an ancestor whited out).
        The overlay's own entries are never hidden."""
        parts = rel.split("/")
        return any("/".join(parts[:i]) in self._whiteouts for i in range(1, len(parts) + 1))

    def _real_visible(self, rel: str) -> bool:
        return not self._hidden(rel) and os.path.lexists(self._real(rel))

    # -- reading ---------------------------------------------------------------------------------
    def is_deleted(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` was deleted in the overlay (and not written again)."""
        rel = self.rel(path)
        if rel is None or rel == "":
            return False
        with self._lock:
            return self._hidden(rel) and not os.path.lexists(self._ov(rel))

    def resolve_read(self, path: str | os.PathLike[str]) -> Path:
        """Where to read ``path``: its overlay copy when there is one, else the real path.

        A deleted (whited-out) path resolves to its missing overlay location, so reading it
        fails with FileNotFoundError; a path outside the project is returned as it is; a
        directory present on both sides resolves to the real one (use :meth:`listdir`).
        """
        raw = os.fspath(path)
        p = Path(raw if os.path.isabs(raw) else os.path.join(self.project_root, raw))
        rel = self.rel(p)
        if rel is None or rel == "":
            return p
        with self._lock:
            ov = self._ov(rel)
            if os.path.lexists(ov):
                if ov.is_dir() and self._real_visible(rel) and self._real(rel).is_dir():
                    return p
                return ov
            if self._hidden(rel):
                return ov
        return p

    def overlay_dir_for(self, path: str | os.PathLike[str]) -> Path | None:
        """The overlay directory mirroring directory ``path`` (None when outside the project)."""
        rel = self.rel(path)
        return None if rel is None else self._ov(rel)

    def listdir(self, path: str | os.PathLike[str]) -> list[tuple[str, bool]]:
        """Merged ``(name, is_dir)`` entries of directory ``path``, sorted by name.

        Raises FileNotFoundError / NotADirectoryError like ``os.scandir``.
        """
        raw = os.fspath(path)
        p = Path(raw if os.path.isabs(raw) else os.path.join(self.project_root, raw))
        rel = self.rel(p)
        if rel is None:
            return sorted((e.name, e.is_dir()) for e in os.scandir(p))
        with self._lock:
            entries: dict[str, bool] = {}
            found = False
            real, ov = self._real(rel), self._ov(rel)
            real_ok = rel == "" or self._real_visible(rel)
            prefix = f"{rel}/" if rel else ""
            if real_ok and real.is_dir():
                found = True
                for e in os.scandir(real):
                    if prefix + e.name not in self._whiteouts:
                        entries[e.name] = e.is_dir()
            if ov.is_dir():
                found = True
                for e in os.scandir(ov):
                    entries[e.name] = e.is_dir()
            if not found:
                if os.path.lexists(ov) or (real_ok and os.path.lexists(real)):
                    raise NotADirectoryError(f"Not a directory: {raw}")
                raise FileNotFoundError(f"No such file or directory: {raw}")
            return sorted(entries.items())

    def _exists(self, rel: str) -> bool:
        return os.path.lexists(self._ov(rel)) or self._real_visible(rel)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` exists in the merged view."""
        rel = self.rel(path)
        if rel is None:
            return os.path.lexists(path)
        with self._lock:
            return rel == "" or self._exists(rel)

    # -- writing ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise OverlayClosed("the speculation overlay is closed")

    def _check_parents(self, rel: str) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            anc = "/".join(parts[:i])
            ov = self._ov(anc)
            if os.path.lexists(ov):
                if not ov.is_dir():
                    raise NotADirectoryError(f"Not a directory: {anc}")
            elif self._real_visible(anc) and not self._real(anc).is_dir():
                raise NotADirectoryError(f"Not a directory: {anc}")

    def _remember_base(self, rel: str) -> None:
        if rel not in self._base_hash:
            self._base_hash[rel] = _sha256(self._real(rel))

    def write(self, path: str | os.PathLike[str], text: str) -> Path:
        """Write ``text`` (UTF-8) to ``path`` inside the overlay; returns the overlay file.

        PathOutsideProject when ``path`` escapes the project; IsADirectoryError /
        NotADirectoryError when the merged view makes the write impossible; OverlayClosed
        after apply/discard.
        """
        rel = self._require_rel(path)
        with self._lock:
            self._check_open()
            self._check_parents(rel)
            ov, real = self._ov(rel), self._real(rel)
            if ov.is_dir() or (not os.path.lexists(ov) and self._real_visible(rel)
                               and real.is_dir()):
                raise IsADirectoryError(f"Is a directory: {os.fspath(path)}")
            self._remember_base(rel)
            if not os.path.lexists(ov) and self._real_visible(rel) and real.is_file():
                ov.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(real, ov)  # copy-on-write: keep the original's mode
            self._whiteouts.discard(rel)  # a file replaces the deleted file
            atomic_write(ov, text)
            self._written.add(rel)
            return ov

    def delete(self, path: str | os.PathLike[str]) -> None:
        """Delete file ``path`` in the merged view (a whiteout; the real file stays until apply).

        FileNotFoundError when it does not exist; IsADirectoryError for a directory.
        """
        rel = self._require_rel(path)
        with self._lock:
            self._check_open()
            if not self._exists(rel):
                raise FileNotFoundError(f"No such file: {os.fspath(path)}")
            ov = self._ov(rel)
            if ov.is_dir() or (not os.path.lexists(ov) and self._real(rel).is_dir()):
                raise IsADirectoryError(f"Is a directory: {os.fspath(path)}")
            self._remember_base(rel)
            if os.path.lexists(ov):
                ov.unlink()
            self._written.discard(rel)
            if self._real_visible(rel):
                self._whiteouts.add(rel)
            elif rel not in self._whiteouts:
                self._base_hash.pop(rel, None)  # created then deleted: no change at all

    # -- inspection ------------------------------------------------------------------------------
    def changed(self) -> list[Path]:
        """Project-relative paths written or deleted in the overlay, sorted."""
        with self._lock:
            return [Path(r) for r in sorted(self._written | self._whiteouts)]

    def deleted(self) -> list[Path]:
        with self._lock:
            return [Path(r) for r in sorted(self._whiteouts)]

    def conflicts(self) -> list[Path]:
        """Changed paths whose real file changed since the overlay first touched them."""
        with self._lock:
            return [Path(r) for r in sorted(self._written | self._whiteouts)
                    if _sha256(self._real(r)) != self._base_hash.get(r)]

    def iter_overlay_files(self, under: str = "") -> Iterator[tuple[str, Path]]:
        """(project-relative key, overlay file) of the written files under key ``under``."""
        with self._lock:
            keys = sorted(self._written)
        prefix = f"{under}/" if under else ""
        for k in keys:
            if k.startswith(prefix):
                yield k, self._ov(k)

    # -- apply / discard -------------------------------------------------------------------------
    def apply(self) -> list[Path]:
        """Copy every change back to the project (atomic per file; whiteouts delete) and close
        the overlay. Returns the applied project-relative paths. A path that now escapes the
        project (e.g. a directory was replaced by a symlink meanwhile) is skipped."""
        with self._lock:
            self._check_open()
            self._closed = True
            applied: list[Path] = []
            for rel in sorted(self._whiteouts):
                target = self._real(rel)
                if self.rel(target) != rel or (target.is_dir() and not target.is_symlink()):
                    continue
                target.unlink(missing_ok=True)
                applied.append(Path(rel))
            for rel in sorted(self._written):
                target = self._real(rel)
                if self.rel(target) != rel:
                    continue
                if target.is_symlink():
                    target.unlink()  # replace the link itself, never write through it
                atomic_copy(self._ov(rel), target)
                applied.append(Path(rel))
            self._remove_dir()
            return sorted(set(applied))

    def discard(self) -> None:
        """Remove the overlay directory (rm -rf) and close the overlay. Idempotent."""
        with self._lock:
            self._closed = True
            self._remove_dir()

    @property
    def closed(self) -> bool:
        return self._closed

    def _remove_dir(self) -> None:
        shutil.rmtree(self.overlay_dir, ignore_errors=True)
        if self._remove_parent:
            try:
                self.overlay_dir.parent.rmdir()  # the <pid> directory, when now empty
            except OSError:
                pass
