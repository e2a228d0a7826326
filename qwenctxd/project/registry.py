"""ProjectRegistry: one :class:`Project` per project, looked up by working directory.

``get(cwd)`` resolves the git root once per cwd and hands out the same :class:`Project` for
every directory of one repository. Each resolved cwd's chain of directories (cwd up to its root,
or up to the filesystem root below ``/`` without one) is watched, non-recursively, for a
``.git`` entry appearing or vanishing: such an event drops the cwds whose answer it may change,
and the next ``get`` re-resolves. A ``.git`` created before the watch went live is caught by a
re-check once the hub is synced. Settings are not copied: :attr:`Project.settings` asks the
:class:`~qwenctxd.config.ConfigStore` (which watches the settings files) every time.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.config import ConfigStore
from qwenctxd.config.schema import Settings
from qwenctxd.project.roots import find_project_root, home_dir, qwen_home
from qwenctxd.tasks import TaskRegistry
from qwenctxd.watch import FileChange, WatchHub

log = structlog.get_logger("qwenctxd.project")
WATCH_KEY = "projects"


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
        self._hub = hub
        self._tasks = tasks
        env = os.environ if environ is None else environ
        self.home = home_dir(env)
        self.qwen_home = qwen_home(env)
        self._by_cwd: dict[Path, Project] = {}
        self._chains: dict[Path, list[Path]] = {}
        self._by_anchor: dict[tuple[Path | None, Path], Project] = {}
        self.resolutions = 0

    def get(self, cwd: Path) -> Project:
        """The project ``cwd`` belongs to (call from the event-loop thread)."""
        found = self._by_cwd.get(cwd)
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
        if len(self._by_cwd) > 4096:
            self._by_cwd.clear()
            self._chains.clear()
        self._by_cwd[cwd] = project
        self._chains[cwd] = _chain(norm, root)
        self._subscribe(cwd)
        return project

    def root(self, cwd: Path) -> Path | None:
        return self.get(cwd).root

    def root_of(self, directory: Path) -> Path | None:
        """The git root of any directory (a worker thread may call this): a registered cwd's
        answer, else a lookup cached for at most a second (a build reads many files from few
        directories)."""
        found = self._by_cwd.get(directory)
        if found is not None:
            return found.root
        return _root_cached(directory, int(time.monotonic()))

    def invalidate(self, cwd: Path) -> None:
        """Forget ``cwd``'s answer; the next :meth:`get` resolves again."""
        self._by_cwd.pop(cwd, None)
        self._chains.pop(cwd, None)

    # -- watching ---------------------------------------------------------------------------
    def _subscribe(self, new_cwd: Path) -> None:
        hub = self._hub
        if hub is None:
            return
        dirs = {d for chain in self._chains.values() for d in chain}
        hub.watch(WATCH_KEY, dirs, self._on_changes)
        if self._tasks is None or not self._tasks.accepting:
            return
        expected = self._by_cwd[new_cwd]

        async def recheck() -> None:  # a .git made before the watch was live still counts
            with anyio.move_on_after(10):
                await hub.wait_synced()
            if self._by_cwd.get(new_cwd) is expected and await anyio.to_thread.run_sync(
                    find_project_root, new_cwd) != expected.root:
                self.invalidate(new_cwd)

        self._tasks.submit("project-verify", recheck, key=f"project-verify:{new_cwd}",
                           project=str(expected.anchor))

    async def _on_changes(self, changes: set[FileChange] | set[tuple[Any, str]]) -> None:
        touched = {Path(raw).parent for _, raw in changes if Path(raw).name == ".git"}
        if not touched:
            return
        for cwd, chain in list(self._chains.items()):
            if touched.intersection(chain):
                log.debug("project root may have changed", cwd=str(cwd))
                self.invalidate(cwd)
