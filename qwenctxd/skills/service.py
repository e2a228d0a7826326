"""SkillsService: per-project skill sets kept fresh by depth-2 watches.

For each project (and the user level) the service loads the skill set once, in a
:class:`~qwenctxd.watch.WatchedCache`, and watches, with non-recursive watches on an explicit
list, every base dir and every ``<base>/<skill>`` dir —
depth 2, nothing deeper, so a ``node_modules`` inside a skill costs no kernel watch and no
refresh. Relevant events (an entry appearing or vanishing in a base dir, a SKILL.md changing
in a skill dir; never ``.git`` or artifacts) start a debounced (150 ms) refresh that reloads
all levels concurrently, bumps the refresh counter, re-syncs the watched set and publishes
``skills/changed``. Refreshes coalesce: one runs and one waits per project.

Callers bring the resolved :class:`~qwenctxd.project.Project` (its root keys the cache; its
settings, home and ``~/.qwen`` decide the levels); nothing here looks a project up.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.events import EventBus
from qwenctxd.project import Project
from qwenctxd.skills import levels
from qwenctxd.skills.model import SkillSet
from qwenctxd.tasks import TaskRegistry
from qwenctxd.watch import Watched, WatchedCache, WatchHub

log = structlog.get_logger("qwenctxd.skills")
DEBOUNCE_S = 0.15
IGNORED_NAMES = {".git", ".DS_Store"}


@dataclass
class _Entry:
    skillset: SkillSet
    generation: int
    project: Project
    cwd: Path
    dirs: set[Path] = field(default_factory=set)
    bases: set[Path] = field(default_factory=set)


class SkillsService:
    def __init__(
        self,
        hub: WatchHub,
        tasks: TaskRegistry,
        bus: EventBus,
        *,
        on_refresh: Callable[[], None] | None = None,
    ) -> None:
        self._hub = hub
        self._tasks = tasks
        self._bus = bus
        self._on_refresh = on_refresh or (lambda: None)
        # shared loads: a cancelled skills.list / turn stops waiting, the load goes on
        self._entries: WatchedCache[Path | None, _Entry] = WatchedCache(
            hub, tasks, "skills", on_stale=lambda _root, entry: self._schedule_refresh(
                entry.project, entry.cwd))
        self.refreshes = 0
        self.generation = 0

    @staticmethod
    def _bases(project: Project, cwd: Path) -> list[Any]:
        return levels.base_dirs(project.root, home=project.home,
                                settings=project.settings.skills, cwd=cwd,
                                qwen_dir=project.qwen_home)

    # -- loading --------------------------------------------------------------------------------
    async def skillset(self, project: Project, cwd: Path) -> tuple[SkillSet, int]:
        """The project's skill set and its generation (bumps on every refresh)."""
        entry = self._entries.peek(project.root)
        if entry is None:
            entry = await self._entries.get(project.root, lambda: self._load(project, cwd))
        return entry.skillset, entry.generation

    async def _load(self, project: Project, cwd: Path) -> Watched[_Entry]:
        """Read every level; the cache watches the dirs and runs the catch-up check, and
        publishes the entry once this returns."""
        bases = self._bases(project, cwd)
        user_skills = project.qwen_home / "skills"
        if not user_skills.exists():  # Qwen Code creates it when watching starts
            try:
                await anyio.to_thread.run_sync(lambda: user_skills.mkdir(parents=True,
                                                                         exist_ok=True))
            except OSError:
                pass
        own = {b.path for b in bases if b.level in ("project", "user")}
        # taken before reading: an edit made while the levels load is caught by the check
        prints = await anyio.to_thread.run_sync(_fingerprint, own)
        skillset = await levels.aload_skills(bases, settings=project.settings.skills)

        def watch_dirs_of() -> set[Path]:
            out = set(own)
            for base in own:
                out.update(_skill_dirs(base))
            return out

        watch_dirs = await anyio.to_thread.run_sync(watch_dirs_of)
        self.generation += 1
        entry = _Entry(skillset=skillset, generation=self.generation, project=project, cwd=cwd,
                       dirs=watch_dirs, bases=own)
        return Watched(entry, watch_dirs, lambda p: _relevant(p, own),
                       lambda: _fingerprint(own) != prints)

    def _schedule_refresh(self, project: Project, cwd: Path) -> None:
        if not self._tasks.accepting:
            return
        root = project.root

        async def refresh() -> None:
            await anyio.sleep(DEBOUNCE_S)
            old = self._entries.peek(root)
            entry = await self._entries.reload(root, lambda: self._load(project, cwd))
            self.refreshes += 1
            self._on_refresh()
            before = set(old.skillset.skills) if old else set()
            after = set(entry.skillset.skills)
            log.info("skills refreshed", root=str(root), skills=len(after),
                     errors=len(entry.skillset.errors))
            self._bus.publish("skills/changed", {
                "root": str(root) if root else None, "generation": entry.generation,
                "added": sorted(after - before), "removed": sorted(before - after)})

        self._tasks.submit("skills-refresh", refresh, key=f"skills-refresh:{root}",
                           project=str(root) if root else None)

    def projects(self) -> list[tuple[Path | None, int, int]]:
        """(root, skills, watched dirs) per loaded project."""
        return [(r, len(e.skillset.skills), len(e.dirs)) for r, e in self._entries.items()]


def _skill_dirs(base: Path) -> set[Path]:
    """``<base>/<name>`` directories (symlinks to directories followed): depth 2, no deeper."""
    out: set[Path] = set()
    try:
        with os.scandir(base) as it:
            for entry in it:
                if entry.name in IGNORED_NAMES or entry.name.startswith("."):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=True):
                        out.add(Path(entry.path))
                except OSError:
                    continue
    except OSError:
        pass
    return out


def _fingerprint(bases: set[Path]) -> dict[str, object]:
    """What a refresh would notice: the entries of each base, and each SKILL.md's stat."""
    out: dict[str, object] = {}
    for base in bases:
        try:
            names = sorted(os.listdir(base))
        except OSError:
            out[str(base)] = None
            continue
        out[str(base)] = names
        for name in names:
            try:
                st = os.stat(base / name / "SKILL.md")
                out[f"{base}/{name}"] = (st.st_mtime_ns, st.st_size)
            except OSError:
                out[f"{base}/{name}"] = None
    return out


def _relevant(p: Path, bases: set[Path]) -> bool:
    """A change that can alter the skill set: an entry in a base dir, or a SKILL.md in a
    skill dir. Sockets, FIFOs and ``.git`` never count."""
    if any(part in IGNORED_NAMES for part in p.parts):
        return False
    if p.parent in bases:
        return True
    if p.name != "SKILL.md" or p.parent.parent not in bases:
        return False
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return True  # deleted
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)
