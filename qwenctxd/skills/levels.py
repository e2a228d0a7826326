"""Skill discovery: which directories are scanned, in what order, and how winners are chosen.

Levels × provider directories (reference/qwen-code-facts.md §4.1):

- project: ``<root>/.qwen/skills``, ``<root>/.agents/skills`` — skipped when there is no
  project root or the root is the home directory (they would be the user dirs again);
- user: ``<qwen dir>/skills`` (``QWEN_HOME`` aware through ``qwen_dir``), ``~/.agents/skills``,
  then ``skills.directories`` (``~`` expanded, relative paths resolved against ``cwd``);
- extension: directories supplied by active extensions;
- bundled: :data:`BUNDLED_DIR`, shipped inside the package.

The same directory is scanned once (first position wins). Each base holds
``<base>/<skill-name>/SKILL.md`` one level deep. Bases are listed and read concurrently (one
worker per base), then parsed in one worker with a content-keyed cache; a base that fails
(permissions, not a directory, broken symlink) becomes a :class:`SkillError` while the others
still load. The first skill seen under a name wins; later ones are ``shadowed``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import anyio.to_thread

from qwenctxd.config.schema import SkillsSettings
from qwenctxd.fsutil import open_regular
from qwenctxd.skills.model import LEVELS, BaseDir, Level, Skill, SkillError, SkillSet
from qwenctxd.skills.parse import MAX_SKILL_BYTES, OVERSIZE_MESSAGE, parse_skill

BUNDLED_DIR = Path(__file__).parent / "bundled"
PROVIDER_DIRS = (".qwen", ".agents")
SKILL_FILE = "SKILL.md"
# Left behind by an interrupted install/update: ``<name>.backup-<pid>-<ts>`` and
# ``<name>.installing-<pid>-<ts>``. Loading them would shadow or duplicate the real skill.
_ARTIFACT_RE = re.compile(r"\.(?:backup|installing)-\d+-\d+$")
_SKIP_NAMES = frozenset({".git"})


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:  # pragma: no cover - realpath does not raise on Linux
        return os.path.abspath(a) == os.path.abspath(b)


def base_dirs(
    project_root: Path | None,
    *,
    home: Path,
    settings: SkillsSettings,
    cwd: Path,
    extension_dirs: Sequence[Path] = (),
    qwen_dir: Path | None = None,
) -> list[BaseDir]:
    """The directories to scan, most important first (``qwen_dir`` defaults to ``home/.qwen``).

    Levels named in ``skills.disabledLevels`` (any case) are left out entirely.
    """
    off = {lvl.strip().lower() for lvl in settings.disabled_levels}
    qdir = qwen_dir if qwen_dir is not None else home / ".qwen"
    wanted: list[tuple[Level, Path]] = []
    if project_root is not None and not _same(project_root, home):
        wanted += [("project", project_root / d / "skills") for d in PROVIDER_DIRS]
    wanted.append(("user", qdir / "skills"))
    wanted.append(("user", home / ".agents" / "skills"))
    for raw in settings.directories:
        s = raw.strip() if isinstance(raw, str) else ""
        if not s:
            continue
        if s == "~" or s.startswith("~/"):
            p = home / s[2:]
        else:
            p = Path(os.path.expanduser(s))  # "~other/..." or a plain path
        if not p.is_absolute():
            p = cwd / p
        wanted.append(("user", Path(os.path.normpath(p))))
    wanted += [("extension", Path(d)) for d in extension_dirs]
    wanted.append(("bundled", BUNDLED_DIR))

    out: list[BaseDir] = []
    seen: set[str] = set()
    for level, path in wanted:
        if level in off:
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        out.append(BaseDir(level=level, path=path, exists=os.path.isdir(path)))
    return out


# A read base: (SKILL.md path, text) in directory-name order, plus the problems found.
BaseRead = tuple[list[tuple[Path, str]], list[SkillError]]


def read_base(base: BaseDir) -> BaseRead:
    """List ``<base>/<name>/SKILL.md`` one level deep and read each file (I/O only)."""
    files: list[tuple[Path, str]] = []
    errors: list[SkillError] = []
    try:
        with os.scandir(base.path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        if os.path.islink(base.path):
            target = os.readlink(base.path)
            errors.append(
                SkillError(str(base.path), f"skills directory is a broken symlink to {target}")
            )
        return files, errors
    except NotADirectoryError:
        errors.append(SkillError(str(base.path), "skills directory path is not a directory"))
        return files, errors
    except OSError as exc:
        errors.append(
            SkillError(str(base.path), f"cannot list skills directory: {exc.strerror or exc}")
        )
        return files, errors

    for entry in entries:
        name = entry.name
        if name in _SKIP_NAMES or _ARTIFACT_RE.search(name):
            continue
        try:
            # Symlinked skill directories are followed even when they point outside the base
            # (seed §6.2): refusing them only protects against someone who can create a symlink
            # in the user's own skills dir but not a regular file there — an unrealistic threat
            # for a per-user directory — while it breaks the supported "one checkout of a skills
            # repo, symlinked into ~/.qwen/skills" workflow. We only require the target to be a
            # directory.
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:
            is_dir = False
        if not is_dir:
            if entry.is_symlink() and not os.path.exists(entry.path):
                errors.append(SkillError(entry.path, "skill symlink points to a missing target"))
            continue
        skill_md = Path(entry.path) / SKILL_FILE
        try:
            with open_regular(skill_md) as fh:
                raw = fh.read(MAX_SKILL_BYTES + 1)
        except FileNotFoundError:
            continue  # a directory without SKILL.md is not a skill (scratch, assets)
        except OSError as exc:
            errors.append(SkillError(str(skill_md), f"cannot read SKILL.md: {exc.strerror or exc}"))
            continue
        if len(raw) > MAX_SKILL_BYTES:
            errors.append(SkillError(str(skill_md), OVERSIZE_MESSAGE))
            continue
        files.append((skill_md, raw.decode("utf-8", errors="replace")))
    return files, errors


# Parsing is pure in (path, level, text), so results are reused across refreshes: a watch
# event that changed one SKILL.md re-parses one file, not all of them. Bounded; Skill is
# immutable, so sharing cached instances is safe.
_PARSE_CACHE: dict[tuple[str, str, str], tuple[Skill | None, tuple[SkillError, ...]]] = {}
_PARSE_CACHE_MAX = 4096


def _parse_cached(path: Path, level: Level, text: str) -> tuple[Skill | None, list[SkillError]]:
    key = (str(path), level, text)
    hit = _PARSE_CACHE.get(key)
    if hit is None:
        skill, errors = parse_skill(path, level, text=text)
        hit = (skill, tuple(errors))
        if len(_PARSE_CACHE) >= _PARSE_CACHE_MAX:
            _PARSE_CACHE.clear()
        _PARSE_CACHE[key] = hit
    return hit[0], [SkillError(e.path, e.message) for e in hit[1]]


def clear_parse_cache() -> None:
    """Forget cached parse results (tests and benchmarks measuring a cold parse)."""
    _PARSE_CACHE.clear()


def parse_base(base: BaseDir, read: BaseRead) -> tuple[list[Skill], list[SkillError]]:
    """Parse what :func:`read_base` returned; (skills in directory-name order, errors)."""
    files, read_errors = read
    skills: list[Skill] = []
    errors = list(read_errors)
    for path, text in files:
        skill, problems = _parse_cached(path, base.level, text)
        errors.extend(problems)
        if skill is not None:
            skills.append(skill)
    return skills, errors


def scan_base(base: BaseDir) -> tuple[list[Skill], list[SkillError]]:
    """Read and parse one base (see :func:`read_base`, :func:`parse_base`)."""
    return parse_base(base, read_base(base))


def _lower_set(names: Iterable[str]) -> set[str]:
    return {n.strip().lower() for n in names if isinstance(n, str)}


def is_enabled(name: str, settings: SkillsSettings) -> bool:
    """``skills.disabled`` always wins; ``defaultDisabled`` is off unless also ``enabled``."""
    low = name.lower()
    if low in _lower_set(settings.disabled):
        return False
    if low in _lower_set(settings.default_disabled):
        return low in _lower_set(settings.enabled)
    return True


def merge(
    bases: list[BaseDir],
    results: list[tuple[list[Skill], list[SkillError]]],
    settings: SkillsSettings,
) -> SkillSet:
    """Combine per-base results (same order as ``bases``) into a :class:`SkillSet`."""
    out = SkillSet(bases=list(bases))
    winners: dict[str, Skill] = {}
    for skills, errors in results:
        out.errors.extend(errors)
        for skill in skills:
            if skill.name in winners:
                out.shadowed.append(skill)
            else:
                winners[skill.name] = skill
    disabled = _lower_set(settings.disabled)
    default_off = _lower_set(settings.default_disabled) - _lower_set(settings.enabled)
    for name in sorted(winners):
        low = name.lower()
        if low in disabled or low in default_off:
            out.disabled.append(winners[name])
        else:
            out.skills[name] = winners[name]
    return out


async def aload_skills(bases: list[BaseDir], *, settings: SkillsSettings) -> SkillSet:
    """Load all bases and merge them (the main entry).

    Directory listing and file reads run concurrently, one worker thread per base, so a slow
    or hung filesystem under one level does not hold up the others' I/O. Parsing (CPU-bound,
    GIL-held YAML) then runs in a single worker: spreading it over threads only adds lock
    contention. The event loop never parses.
    """
    reads: list[BaseRead] = [([], []) for _ in bases]

    async def one(i: int, base: BaseDir) -> None:
        reads[i] = await anyio.to_thread.run_sync(_safe_read, base)

    async with anyio.create_task_group() as tg:
        for i, base in enumerate(bases):
            tg.start_soon(one, i, base)
    return await anyio.to_thread.run_sync(_parse_and_merge, bases, reads, settings)


def load_skills(bases: list[BaseDir], *, settings: SkillsSettings) -> SkillSet:
    """Synchronous :func:`aload_skills` (a thread pool for the reads; parses in this thread)."""
    if len(bases) <= 1:
        reads = [_safe_read(b) for b in bases]
    else:
        reads = list(_pool().map(_safe_read, bases))
    return _parse_and_merge(bases, reads, settings)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """A lazily created, reused pool: starting threads per call cost more than the reads."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="skills-read")
        return _POOL


def _safe_read(base: BaseDir) -> BaseRead:
    """:func:`read_base` with any unexpected failure confined to that base."""
    try:
        return read_base(base)
    except Exception as exc:  # one broken level must not take the others down
        return [], [SkillError(str(base.path), f"skills directory failed to load: {exc!r}")]


def _parse_and_merge(
    bases: list[BaseDir], reads: list[BaseRead], settings: SkillsSettings
) -> SkillSet:
    return merge(bases, [parse_base(b, r) for b, r in zip(bases, reads, strict=True)], settings)


def level_rank(level: Level) -> int:
    """0 for project … 3 for bundled (lower is more important)."""
    return LEVELS.index(level)
