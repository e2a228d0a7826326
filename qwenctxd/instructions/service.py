"""InstructionsService: the per-project cache of instruction sets and system prompts.

A cold request discovers and reads the files (in a worker thread) and caches the result per
cwd in a :class:`~qwenctxd.watch.WatchedCache`, which watches every directory that contributed
or was probed. Watch events are filtered by file name, so unrelated churn in the project (a
build writing 1 000 files) never invalidates anything; a relevant change drops the entry and the
next request rebuilds. Once the watches are live, the cache compares the files' stat
fingerprints with the build and invalidates if an edit slipped in before the watch was
registered. The git section is a second watched cache, per root. Every request brings its
resolved :class:`~qwenctxd.project.Project` (root, settings, home, ``~/.qwen``); the shared
:class:`~qwenctxd.project.ProjectRegistry` is only asked for the git root of the other
directories a build reads (include dirs, imports). A warm request is a few dict lookups.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.config.schema import Settings
from qwenctxd.instructions import assemble, base_prompt, discovery, gitinfo, system_md
from qwenctxd.instructions.assemble import InstructionSet
from qwenctxd.instructions.system_prompt import PROMPT_ENV_KEYS, compose
from qwenctxd.instructions.tool_roles import ToolRoles
from qwenctxd.project import Project, ProjectRegistry
from qwenctxd.protocol.instructions import prefix_hash
from qwenctxd.tasks import TaskRegistry
from qwenctxd.tokens import estimate_tokens
from qwenctxd.watch import Watched, WatchedCache, WatchHub

log = structlog.get_logger("qwenctxd.instructions")
GIT_TIMEOUT_S = 1.0
#: a new session reuses the git snapshot an earlier one took this recently, while HEAD, the
#: branch ref, packed-refs, the index and the project root directory are unchanged: agents
#: open sessions in bursts (a proxy's new conversations, subagents), and each fresh snapshot
#: is three git processes on the first-byte path
GIT_SNAPSHOT_REUSE_S = 5.0
MemorySectionProvider = Callable[[Project], str]


@dataclass
class SystemPrompt:
    text: str
    # name, chars, est_tokens; a base section left out (its tools are not declared) is listed
    # after the others with 0 chars and 0 tokens
    sections: list[tuple[str, int, int]]
    files: list[tuple[str, str]]  # path, type
    prefix_hash: str
    project_root: Path | None
    problems: list[assemble.Problem]


@dataclass
class _SetEntry:
    key: tuple[Any, ...]
    value: InstructionSet
    epoch: int


@dataclass
class _GitEntry:
    section: str
    epoch: int


def _settings_key(s: Settings) -> tuple[Any, ...]:
    c = s.context
    names = c.file_name if isinstance(c.file_name, list) else [c.file_name]
    include = tuple(c.include_directories) if c.load_from_include_directories else ()
    return (tuple(names), c.import_format, c.max_file_bytes, include)


def _matches(names: set[str], name: str) -> bool:
    return name in names or any(fnmatch.fnmatchcase(name, n) for n in names if "*" in n)


class _SnapshotFlight:
    """A session's git query under way, for the sessions starting beside it."""

    def __init__(self, prints: tuple[Any, ...]) -> None:
        self.prints = prints
        self.done = anyio.Event()
        self.section: str | None = None  # None: it failed or was cancelled


class InstructionsService:
    def __init__(
        self,
        hub: WatchHub,
        tasks: TaskRegistry,
        *,
        projects: ProjectRegistry,
        environ: Mapping[str, str] | None = None,
        on_rebuild: Callable[[], None] | None = None,
        extension_paths: Callable[[], list[Path]] | None = None,
        memory_section: MemorySectionProvider | None = None,
        memory_stamp: Callable[[Project], object] | None = None,
    ) -> None:
        self._projects = projects
        self._hub = hub
        self._tasks = tasks
        self._environ = environ if environ is not None else os.environ
        self._on_rebuild = on_rebuild or (lambda: None)
        self._extension_paths = extension_paths or (lambda: [])
        # the memory subsystem's prompt section, and what changes when it would (cheap; part
        # of the prompt cache stamp); both given by the composition (server/compose.py)
        self.memory_section = memory_section
        self.memory_stamp = memory_stamp
        # shared loads (a cancelled prompt.system stops waiting; the build goes on)
        self._sets: WatchedCache[Path, _SetEntry] = WatchedCache(hub, tasks, "instructions")
        self._git: WatchedCache[Path, _GitEntry] = WatchedCache(hub, tasks, "git")
        #: root -> (taken at, git files' fingerprints, section): see GIT_SNAPSHOT_REUSE_S
        self._snapshots: dict[Path, tuple[float, tuple[Any, ...], str]] = {}
        self._snapshot_flights: dict[Path, _SnapshotFlight] = {}  # git queries under way
        self._prompts: dict[tuple[Any, ...], tuple[tuple[Any, ...], SystemPrompt]] = {}
        self.rebuilds = 0

    # -- instruction sets ---------------------------------------------------------------------
    async def instruction_set(self, project: Project, cwd: Path) -> InstructionSet:
        """The instruction set for ``cwd`` in ``project`` (cached per cwd)."""
        settings = project.settings
        key = (project.root, *_settings_key(settings))
        entry = self._sets.peek(cwd)
        if entry is not None and entry.key == key:
            return entry.value
        if entry is not None:  # the settings that shape it changed
            self._sets.invalidate(cwd)
        entry = await self._sets.get(cwd, lambda: self._load_set(project, cwd, settings, key))
        return entry.value

    async def _load_set(self, project: Project, cwd: Path, settings: Settings,
                        key: tuple[Any, ...]) -> Watched[_SetEntry]:
        epoch = self._sets.epoch(cwd)
        value = await anyio.to_thread.run_sync(self._build, project, cwd, settings)
        self.rebuilds += 1
        self._on_rebuild()
        deps, prints = value.deps, value.fingerprints

        def relevant(p: Path) -> bool:
            names = deps.get(p.parent)
            if names is None or not _matches(names, p.name):
                return False
            # a re-synced watcher may report files that were already there: only a real
            # difference from what the build saw counts
            return not (p in prints and assemble.fingerprint(p) == prints[p])

        def changed() -> bool:
            return any(assemble.fingerprint(p) != fp for p, fp in prints.items())

        return Watched(_SetEntry(key=key, value=value, epoch=epoch), deps.keys(), relevant,
                       changed)

    def _build(self, project: Project, cwd: Path, settings: Settings) -> InstructionSet:
        c = settings.context
        disc = discovery.discover(
            cwd,
            filenames=c.file_name if isinstance(c.file_name, list) else [c.file_name],
            home=project.home,
            qwen_dir=project.qwen_home,
            extension_paths=[*discovery.extension_context_files(
                project.qwen_home, project.root), *self._extension_paths()],
            include_dirs=[Path(d).expanduser() for d in c.include_directories]
            if c.load_from_include_directories else [],
            project_root=project.root,
            root_of=self._projects.root_of,
        )
        return assemble.build(disc, import_format=c.import_format, max_file_bytes=c.max_file_bytes,
                              root_of=self._projects.root_of)

    def invalidate_cwd(self, cwd: Path) -> None:
        self._sets.invalidate(cwd)

    def invalidate_path(self, path: Path) -> None:
        """Drop every cached set that depends on ``path`` (used after our own writes)."""
        for cwd, entry in list(self._sets.items()):
            names = entry.value.deps.get(path.parent)
            if names is not None and _matches(names, path.name):
                self.invalidate_cwd(cwd)

    # -- git ----------------------------------------------------------------------------------
    async def git_snapshot(self, project: Project) -> str:
        """A fresh git section for a session starting now in ``project`` ("" outside a
        repository).

        Queried now, not taken from the project's cache (the status lines must be the ones at
        start) — unless a session began in the same project within ``GIT_SNAPSHOT_REUSE_S``
        and no git file or the root directory changed since."""
        root = project.root
        if root is None:
            return ""
        prints = tuple(assemble.fingerprint(p) for p in (*_git_files(root, index=True), root))
        now = time.monotonic()
        hit = self._snapshots.get(root)
        if hit is not None and now - hit[0] <= GIT_SNAPSHOT_REUSE_S and hit[1] == prints:
            return hit[2]
        flight = self._snapshot_flights.get(root)
        if flight is not None and flight.prints == prints:
            # a burst of sessions (32 conversations, a fan of subagents) starting at once:
            # one git query, the others take its answer (the same git files, the same moment)
            await flight.done.wait()
            if flight.section is not None:
                return flight.section
        flight = _SnapshotFlight(prints)
        self._snapshot_flights[root] = flight
        try:
            section = gitinfo.render_git_section(
                await gitinfo.git_status(root, timeout_s=GIT_TIMEOUT_S))
            flight.section = section
        finally:
            flight.done.set()
            if self._snapshot_flights.get(root) is flight:
                del self._snapshot_flights[root]
        if len(self._snapshots) > 256:
            self._snapshots.clear()
        self._snapshots[root] = (now, prints, section)
        return section

    async def _git_section(self, root: Path | None) -> tuple[str, int]:
        if root is None:
            return "", 0
        entry = self._git.peek(root)
        if entry is None:
            entry = await self._git.get(root, lambda: self._load_git(root))
        return entry.section, entry.epoch

    async def _load_git(self, root: Path) -> Watched[_GitEntry]:
        epoch = self._git.epoch(root)
        prints = {p: assemble.fingerprint(p) for p in _git_files(root)}
        status = await gitinfo.git_status(root, timeout_s=GIT_TIMEOUT_S)
        section = gitinfo.render_git_section(status)
        deps = _git_deps(root)

        def relevant(p: Path) -> bool:
            names = deps.get(p.parent)
            return names is not None and _matches(names, p.name)

        def changed() -> bool:  # a commit made before the git watches went live
            return any(assemble.fingerprint(p) != fp for p, fp in prints.items())

        return Watched(_GitEntry(section=section, epoch=epoch), deps.keys(), relevant, changed)

    # -- the system prompt --------------------------------------------------------------------
    async def system_prompt(
        self,
        project: Project,
        cwd: Path,
        *,
        model: str | None = None,
        append: str | None = None,
        interaction_mode: str = "interactive",
        env: Mapping[str, str] | None = None,
        tool_roles: ToolRoles | None = None,
        agent: str | None = None,
        git_snapshot: str | None = None,
    ) -> SystemPrompt:
        """The system prompt for ``cwd`` in ``project``; the base follows the session's
        declared tools (``tool_roles``; None: no tools declared) and the client's ``agent``
        name (C5). ``git_snapshot`` (a session's, taken when it began, see
        :meth:`git_snapshot`) replaces the project's current git section, so a session's
        prompt prefix does not move when files change or commits land mid-conversation."""
        merged = {k: self._environ[k] for k in PROMPT_ENV_KEYS if k in self._environ}
        if env:
            merged.update({k: v for k, v in env.items() if k in PROMPT_ENV_KEYS})
        env_key = tuple(sorted(merged.items()))
        pkey = (cwd, model, append, interaction_mode, env_key, tool_roles, agent, git_snapshot)
        root_guess = project.root
        if git_snapshot is not None:
            root_guess = None  # the session brought its own: no git query
        if root_guess is not None and self._git.peek(root_guess) is None \
                and self._sets.peek(cwd) is None:
            # cold: compute the git section while the instruction set builds in a thread
            git_result: list[tuple[str, int]] = []

            async def git_job() -> None:
                git_result.append(await self._git_section(root_guess))

            async with anyio.create_task_group() as tg:
                tg.start_soon(git_job)
                inst = await self.instruction_set(project, cwd)
        else:
            inst = await self.instruction_set(project, cwd)
        root = inst.project_root
        if git_snapshot is not None:
            git_section, git_epoch = git_snapshot, -1
        else:
            git_section, git_epoch = await self._git_section(root)
        sys_md_print = None
        sys_md_on, sys_md_path = system_md.resolve_path_from_env(
            merged.get("QWEN_SYSTEM_MD"), cwd=cwd, home=project.home)
        if sys_md_on and sys_md_path is not None:
            sys_md_print = (sys_md_path, assemble.fingerprint(sys_md_path))
        mem = self.memory_stamp(project) if self.memory_stamp is not None else None
        # the set itself, not id(inst): a rebuilt set may reuse a freed one's address
        stamp = (inst, git_epoch, sys_md_print, mem)
        cached = self._prompts.get(pkey)
        if cached is not None and cached[0][0] is inst and cached[0][1:] == stamp[1:]:
            return cached[1]
        result = self._assemble(project, cwd, inst, git_section, model=model, append=append,
                                interaction_mode=interaction_mode, env=merged,
                                tool_roles=tool_roles, agent=agent)
        if len(self._prompts) > 512:
            self._prompts.clear()
        self._prompts[pkey] = (stamp, result)
        return result

    def _assemble(self, project: Project, cwd: Path, inst: InstructionSet, git_section: str, *,
                  model: str | None, append: str | None, interaction_mode: str,
                  env: dict[str, str], tool_roles: ToolRoles | None = None,
                  agent: str | None = None) -> SystemPrompt:
        home = project.home
        override = system_md.load_system_md(env, cwd, home)
        omitted: list[str] = []
        if override is not None:
            base = [("custom_system_md", override.strip())]
        else:
            inputs = base_prompt.BasePromptInputs(
                model=model,
                sandbox=env.get("SANDBOX"),
                in_git_repo=inst.project_root is not None,
                interaction_mode=interaction_mode,  # type: ignore[arg-type]
                tool_call_style_env=env.get("QWEN_CODE_TOOL_CALL_STYLE"),
                identity_text=system_md.load_identity(env, home, cwd=cwd),
                tools=tool_roles,
                agent_name=agent,
            )
            base = base_prompt.base_sections(inputs)
            omitted = base_prompt.omitted_sections(inputs)
            system_md.write_system_md(env, cwd, home, "\n\n".join(t for _, t in base).strip())
        memory = ""
        if self.memory_section is not None:
            memory = self.memory_section(project)
        composed = compose(base, instructions=inst.text, memory_section=memory, append=append,
                           git_section=git_section)
        text = composed.text
        sized: list[tuple[str, int, int]] = []
        offset = 0
        for name, chars in composed.sections:  # token estimate per section, CJK-aware
            sized.append((name, chars, estimate_tokens(text[offset:offset + chars])))
            offset += chars
        sized.extend((name, 0, 0) for name in omitted)  # left out: no declared tool for them
        return SystemPrompt(
            text=text,
            sections=sized,
            files=[(str(f.path), f.type) for f in inst.files],
            prefix_hash=prefix_hash(text, []),
            project_root=inst.project_root,
            problems=list(inst.problems),
        )

    # -- status -------------------------------------------------------------------------------
    def projects(self) -> list[tuple[Path, int]]:
        """(root, watched directories) for every project with a cached instruction set."""
        out: dict[Path, set[Path]] = {}
        for cwd, entry in self._sets.items():
            root = entry.value.project_root or cwd
            out.setdefault(root, set()).update(entry.value.deps)
        return sorted(((r, len(d)) for r, d in out.items()), key=lambda x: str(x[0]))


def _git_deps(root: Path) -> dict[Path, set[str]]:
    """What to watch so a branch switch or a new commit refreshes the git section: the HEAD
    of the (work tree's) git dir, and the branch refs and packed-refs of the common dir."""
    gitdir = gitinfo.resolve_git_dir(root)
    if gitdir is None:
        return {}
    common = gitinfo.resolve_common_dir(root) or gitdir
    deps: dict[Path, set[str]] = {gitdir: {"HEAD"}}
    deps.setdefault(common, set()).add("packed-refs")
    deps[common / "refs" / "heads"] = {"*"}
    if (root / ".git").is_file():
        deps.setdefault(root, set()).add(".git")
    return deps


def _git_files(root: Path, *, index: bool = False) -> list[Path]:
    """The files whose change means the git section is stale (HEAD, branch ref, packed-refs);
    with ``index``, the work tree's index too (staging or a checkout moves it)."""
    gitdir = gitinfo.resolve_git_dir(root)
    if gitdir is None:
        return []
    common = gitinfo.resolve_common_dir(root) or gitdir
    files = [gitdir / "HEAD", common / "packed-refs", *([gitdir / "index"] if index else [])]
    head = gitinfo.read_head(root)
    if head and not all(c in "0123456789abcdef" for c in head):
        files.append(common / "refs" / "heads" / head)
    return files
