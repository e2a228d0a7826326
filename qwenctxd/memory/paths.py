"""Where auto memory lives, as Qwen Code lays it out, and which scope a path belongs to.

* project memory — ``<base>/projects/<slug(gitRoot)>/memory/`` (``<projectRoot>/.qwen/memory/``
  with ``QWEN_CODE_MEMORY_LOCAL=1``); its parent is the *state dir* holding ``meta.json``,
  ``extract-cursor.json`` and ``consolidation.lock``. The git root is the nearest ancestor with a
  ``.git`` directory or file; linked worktrees are not collapsed, so each gets its own memory.
* user memory — ``<base>/memories/``, shared by every project.
* team memory — ``<gitRoot>/.qwen/team-memory/``, inside the repository, opt-in.

``<base>`` is ``QWEN_CODE_MEMORY_BASE_DIR`` when set, else :func:`qwenctxd.paths.runtime_base_dir`.
Every topic directory holds one memory per ``.md`` file under ``user/ feedback/ project/
reference/`` plus a ``MEMORY.md`` index.

:func:`scope_of` classifies a path by where its bytes would actually land — the daemon's one
containment rule, :func:`qwenctxd.fsutil.real_location` (a leaf symlink followed even when
dangling, the nearest existing ancestor realpath-ed), on both the path and the roots, so a decoy link pointing into team memory is classified as team.
:func:`escaped_scope` catches the reverse: a path that names a memory root but whose bytes
would land outside it (a topic directory that is a symlink out of the tree).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from qwenctxd.fsutil import is_within, real_location
from qwenctxd.paths import project_slug, runtime_base_dir

Scope = Literal["project", "user", "team"]
MemoryType = Literal["user", "feedback", "project", "reference"]

SCOPES: tuple[Scope, ...] = ("project", "user", "team")
MEMORY_TYPES: tuple[MemoryType, ...] = ("user", "feedback", "project", "reference")

QWEN_DIRNAME = ".qwen"
MEMORY_DIRNAME = "memory"
PROJECTS_DIRNAME = "projects"
USER_MEMORY_DIRNAME = "memories"
TEAM_MEMORY_DIRNAME = "team-memory"
PINNED_DIRNAME = "pinned"
INDEX_FILENAME = "MEMORY.md"
META_FILENAME = "meta.json"
CURSOR_FILENAME = "extract-cursor.json"
LOCK_FILENAME = "consolidation.lock"

ENV_BASE_DIR = "QWEN_CODE_MEMORY_BASE_DIR"
ENV_LOCAL = "QWEN_CODE_MEMORY_LOCAL"



@dataclass(frozen=True, slots=True)
class MemoryRoots:
    """The memory directories for one working directory.

    ``project`` is None only when built by hand without a project; ``roots_for`` always sets
    it (falling back to the working directory when there is no git root). ``state`` is the
    project memory's parent. ``team`` is None unless team memory is enabled and a git root
    exists. ``git_root`` is the anchor found for the working directory, if any.
    """

    project: Path | None
    user: Path
    team: Path | None
    state: Path | None
    git_root: Path | None = None

    def for_scope(self, scope: str) -> Path | None:
        """The root of ``scope`` (None when that scope is not available)."""
        return {"project": self.project, "user": self.user, "team": self.team}.get(scope)


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(path)))))


def memory_base_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``QWEN_CODE_MEMORY_BASE_DIR`` (``~`` expanded, made absolute) else the runtime base dir."""
    override = _environ(environ).get(ENV_BASE_DIR)
    if override:
        return _absolute(override)
    return _absolute(runtime_base_dir())


def local_memory(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``QWEN_CODE_MEMORY_LOCAL=1``: project memory lives in the project's ``.qwen``."""
    return _environ(environ).get(ENV_LOCAL) == "1"


def project_memory_root(project_root: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Project memory for ``project_root`` (a git root, or the working directory without one)."""
    anchor = _absolute(project_root)
    if local_memory(environ):
        return anchor / QWEN_DIRNAME / MEMORY_DIRNAME
    return memory_base_dir(environ) / PROJECTS_DIRNAME / project_slug(anchor) / MEMORY_DIRNAME


def user_memory_root(environ: Mapping[str, str] | None = None) -> Path:
    return memory_base_dir(environ) / USER_MEMORY_DIRNAME


def team_memory_root(git_root: Path) -> Path:
    return _absolute(git_root) / QWEN_DIRNAME / TEAM_MEMORY_DIRNAME


def roots_for(
    cwd: Path, *, git_root: Path | None, environ: Mapping[str, str] | None = None,
    team_enabled: bool = False,
) -> MemoryRoots:
    """The memory roots for a session started in ``cwd``; ``git_root`` is its project's root
    as the daemon's project registry resolved it (None outside a repository; never looked up
    here)."""
    start = _absolute(cwd)
    anchor = git_root if git_root is not None else start
    project = project_memory_root(anchor, environ)
    team = team_memory_root(git_root) if team_enabled and git_root is not None else None
    return MemoryRoots(
        project=project,
        user=user_memory_root(environ),
        team=team,
        state=project.parent,
        git_root=git_root,
    )


def index_path(root: Path) -> Path:
    return root / INDEX_FILENAME


def meta_path(state: Path) -> Path:
    return state / META_FILENAME


def cursor_path(state: Path) -> Path:
    return state / CURSOR_FILENAME


def lock_path(state: Path) -> Path:
    return state / LOCK_FILENAME


def _by_precedence(roots: MemoryRoots) -> list[tuple[Scope, Path | None]]:
    """The scopes' roots in classification order: team first, so a link from a private root
    into team memory counts as team."""
    return [("team", roots.team), ("project", roots.project), ("user", roots.user)]


def scope_of(path: str | os.PathLike[str], roots: MemoryRoots) -> Scope | None:
    """The memory scope ``path`` writes into, or None when it is outside every root.

    Team is checked first, so a link from a private root into team memory counts as team.
    """
    real = real_location(path)
    for scope, root in _by_precedence(roots):
        if root is not None and is_within(real, real_location(root)):
            return scope
    return None


def escaped_scope(path: str | os.PathLike[str], roots: MemoryRoots) -> Scope | None:
    """The scope whose root ``path`` names literally while its bytes would land outside that
    root (a symlinked topic directory or file pointing out of the tree); None when ``path`` is
    outside every root by name or really lands inside the root it names."""
    literal = os.path.normpath(os.path.abspath(os.fspath(path)))
    real = real_location(path)
    for scope, root in _by_precedence(roots):
        if root is None:
            continue
        if is_within(literal, os.path.normpath(os.path.abspath(root))):
            return None if is_within(real, real_location(root)) else scope
    return None
