"""ProjectRegistry: one :class:`Project` per project, looked up by working directory.

``get(cwd)`` resolves the git root once per cwd and hands out the same :class:`Project` for
every directory of one repository. Each resolved cwd's chain of directories (cwd up to its root,
or up to the filesystem root below ``/`` without one) is watched, non-recursively, for a
``.git`` entry appearing or vanishing: such an event drops the cwds whose answer it may change,
and the next ``get`` re-resolves. A ``.git`` created before the watch went live is caught by a
re-check once the hub is synced. Both are the :class:`~qwenctxd.watch.WatchedCache`'s work:
``get`` answers synchronously and publishes its answer there. Settings are not copied: :attr:`Project.settings` asks the
:class:`~qwenctxd.config.ConfigStore` (which watches the settings files) every time.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from qwenctxd.config import ConfigStore
from qwenctxd.config.schema import Settings
from qwenctxd.paths import project_slug
from qwenctxd.project.roots import find_project_root, home_dir, qwen_home
from qwenctxd.tasks import TaskRegistry
from qwenctxd.watch import Watched, WatchedCache, WatchHub

log = structlog.get_logger("qwenctxd.project")
MAX_CWDS = 4096


@dataclass(frozen=True, eq=False)
class Project:
    """A project as every subsystem sees it.

    ``root``: the git root (None outside a repository); ``anchor``: the root, or the working
    directory without one (what per-project state is keyed by); ``home`` / ``qwen_home``: the
    user's home and ``~/.qwen`` (``QWEN_HOME`` aware).
    """

    root: Path | None
    anchor: Path
    home: Path
    qwen_home: Path
    config: ConfigStore

    @property
    def settings(self) -> Settings:
        """The project's current settings (global ones without a root)."""
        if self.root is None:
            return self.config.global_settings
        return self.config.for_project(self.root)


@functools.lru_cache(maxsize=256)
def _root_cached(directory: Path, _second: int) -> Path | None:
    return find_project_root(directory)


def _chain(cwd: Path, root: Path | None) -> list[Path]:
    """The directories whose ``.git`` entry decides ``cwd``'s root."""
    out: list[Path] = []
    for directory in (cwd, *cwd.parents):
        if directory == directory.parent:  # the filesystem root
            break
        out.append(directory)
        if directory == root:
            break
    return out


class ProjectRegistry:
    """cwd → :class:`Project`, cached and kept right by ``.git`` watches; see the module doc."""

    def __init__(self, config: ConfigStore, *, hub: WatchHub | None = None,
                 tasks: TaskRegistry | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self._config = config
        env = os.environ if environ is None else environ
        self.home = home_dir(env)
        self.qwen_home = qwen_home(env)
        # cwd -> its project; a .git appearing or vanishing on the way up invalidates
        self._by_cwd: WatchedCache[Path, Project] = WatchedCache(
            hub, tasks, "project", project_of=lambda cwd: None)
        self._by_anchor: dict[tuple[Path | None, Path], Project] = {}
        self.resolutions = 0

    def get(self, cwd: Path) -> Project:
        """The project ``cwd`` belongs to (call from the event-loop thread)."""
        found = self._by_cwd.peek(cwd)
        if found is not None:
            return found
        norm = Path(os.path.normpath(os.path.abspath(cwd)))
        root = find_project_root(norm)
        self.resolutions += 1
        anchor = root if root is not None else norm
        project = self._by_anchor.get((root, anchor))
        if project is None:
            project = Project(root=root, anchor=anchor, home=self.home,
                              qwen_home=self.qwen_home, config=self._config)
            self._by_anchor[(root, anchor)] = project
        self._evict_oldest()
        self._by_cwd.publish(cwd, Watched(
            project, _chain(norm, root), relevant=_is_git_entry,
            # a .git made before the watch was live still counts
            changed=lambda: find_project_root(norm) != root))
        return project

    def root(self, cwd: Path) -> Path | None:
        return self.get(cwd).root

    def root_of(self, directory: Path) -> Path | None:
        """The git root of any directory (a worker thread may call this): a registered cwd's
        answer, else a lookup cached for at most a second (a build reads many files from few
        directories)."""
        found = self._by_cwd.peek(directory)
        if found is not None:
            return found.root
        return _root_cached(directory, int(time.monotonic()))

    def invalidate(self, cwd: Path) -> None:
        """Forget ``cwd``'s answer; the next :meth:`get` resolves again."""
        self._by_cwd.invalidate(cwd)

    def _evict_oldest(self) -> None:
        """Keep at most MAX_CWDS resolved working directories (and their watches)."""
        known = sum(1 for _ in self._by_cwd.items())
        if known >= MAX_CWDS:
            oldest = next(self._by_cwd.items())[0]
            log.debug("project cache full: dropping the oldest cwd", cwd=str(oldest))
            self._by_cwd.forget(oldest)


NAME_MAX = 255  # bytes of one path component (Linux)


def project_id_fits(cwd: Path) -> bool:
    """Whether the project ``cwd`` belongs to has a usable id: its state lives in ONE
    directory named after its anchor (Qwen Code's project id, ``~/.qwen/projects/<id>``), so a
    root whose id passes NAME_MAX bytes has nowhere to keep sessions or memory."""
    norm = Path(os.path.normpath(os.path.abspath(cwd)))
    return anchor_id_fits(find_project_root(norm) or norm)


def anchor_id_fits(anchor: Path) -> bool:
    """Whether a project anchored at ``anchor`` has a usable id (see :func:`project_id_fits`)."""
    return len(os.fsencode(project_slug(anchor))) <= NAME_MAX


def _is_git_entry(path: Path) -> bool:
    return path.name == ".git"
