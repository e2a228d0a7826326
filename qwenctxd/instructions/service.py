"""InstructionsService: the per-project cache of instruction sets and system prompts.

A cold request discovers and reads the files (in a worker thread), registers watches on every
directory that contributed or was probed, and caches the result per cwd. Watch events are
filtered by file name, so unrelated churn in the project (a build writing 1 000 files) never
invalidates anything; a relevant change drops the entry and the next request rebuilds. Once
the watches are live, a background check compares the files' stat fingerprints with the build
and invalidates if an edit slipped in before the watch was registered. A warm request is a few
dict lookups.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.config import ConfigStore
from qwenctxd.config.schema import Settings
from qwenctxd.instructions import assemble, base_prompt, discovery, gitinfo, system_md
from qwenctxd.instructions.assemble import InstructionSet
from qwenctxd.instructions.system_prompt import PROMPT_ENV_KEYS, compose
from qwenctxd.instructions.tool_roles import ToolRoles
from qwenctxd.protocol.instructions import prefix_hash
from qwenctxd.tasks import TaskRegistry
from qwenctxd.tokens import estimate_tokens
from qwenctxd.watch import WatchHub

log = structlog.get_logger("qwenctxd.instructions")
GIT_TIMEOUT_S = 1.0
MemorySectionProvider = Callable[[Path | None, Path], str]


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
    deps: dict[Path, set[str]] = field(default_factory=dict)


def _settings_key(s: Settings) -> tuple[Any, ...]:
    c = s.context
    names = c.file_name if isinstance(c.file_name, list) else [c.file_name]
    include = tuple(c.include_directories) if c.load_from_include_directories else ()
    return (tuple(names), c.import_format, c.max_file_bytes, include)


def _matches(names: set[str], name: str) -> bool:
    return name in names or any(fnmatch.fnmatchcase(name, n) for n in names if "*" in n)


class InstructionsService:
    def __init__(
        self,
        config: ConfigStore,
        hub: WatchHub,
        tasks: TaskRegistry,
        *,
        environ: Mapping[str, str] | None = None,
        on_rebuild: Callable[[], None] | None = None,
        extension_paths: Callable[[], list[Path]] | None = None,
        memory_section: MemorySectionProvider | None = None,
        memory_stamp: Callable[[Path | None, Path], object] | None = None,
    ) -> None:
        self._config = config
        self._hub = hub
        self._tasks = tasks
        self._environ = environ if environ is not None else os.environ
        self._on_rebuild = on_rebuild or (lambda: None)
        self._extension_paths = extension_paths or (lambda: [])
        # the memory subsystem's prompt section, and what changes when it would (cheap; part
        # of the prompt cache stamp); both given by the composition (server/compose.py)
        self.memory_section = memory_section
        self.memory_stamp = memory_stamp
        self._sets: dict[Path, _SetEntry] = {}
        self._epochs: dict[Path, int] = {}
        self._git: dict[Path, _GitEntry] = {}
        self._git_epochs: dict[Path, int] = {}
        self._prompts: dict[tuple[Any, ...], tuple[tuple[Any, ...], SystemPrompt]] = {}
        self._roots: dict[Path, Path | None] = {}
        self._locks: dict[Path, anyio.Lock] = {}
        self.rebuilds = 0

    # -- paths --------------------------------------------------------------------------------
    def _home(self) -> Path:
        return Path(self._environ.get("HOME") or os.path.expanduser("~"))

    def qwen_dir(self) -> Path:
        q = self._environ.get("QWEN_HOME")
        return Path(q).expanduser() if q else self._home() / ".qwen"

    def project_root(self, cwd: Path) -> Path | None:
        if cwd not in self._roots:
            self._roots[cwd] = gitinfo.find_project_root(cwd)
        return self._roots[cwd]

    def settings_for(self, cwd: Path) -> Settings:
        root = self.project_root(cwd)
        return self._config.for_project(root) if root is not None else self._config.global_settings

    # -- instruction sets ---------------------------------------------------------------------
    async def instruction_set(self, cwd: Path) -> InstructionSet:
        settings = self.settings_for(cwd)
        key = _settings_key(settings)
        entry = self._sets.get(cwd)
        if entry is not None and entry.key == key:
            return entry.value
        lock = self._locks.setdefault(cwd, anyio.Lock())
        async with lock:
            entry = self._sets.get(cwd)
            if entry is not None and entry.key == key:
                return entry.value
            epoch = self._epochs.get(cwd, 0)
            value = await anyio.to_thread.run_sync(self._build, cwd, settings)
            self.rebuilds += 1
            self._on_rebuild()
            self._watch(cwd, value)
            if self._epochs.get(cwd, 0) == epoch:
                self._sets[cwd] = _SetEntry(key=key, value=value, epoch=epoch)
                self._schedule_verify(cwd, value)
            return value

    def _build(self, cwd: Path, settings: Settings) -> InstructionSet:
        c = settings.context
        disc = discovery.discover(
            cwd,
            filenames=c.file_name if isinstance(c.file_name, list) else [c.file_name],
            home=self._home(),
            qwen_dir=self.qwen_dir(),
            extension_paths=[*discovery.extension_context_files(
                self.qwen_dir(), self.project_root(cwd)), *self._extension_paths()],
            include_dirs=[Path(d).expanduser() for d in c.include_directories]
            if c.load_from_include_directories else [],
        )
        return assemble.build(disc, import_format=c.import_format, max_file_bytes=c.max_file_bytes)

    def _watch(self, cwd: Path, value: InstructionSet) -> None:
        deps = value.deps
        prints = value.fingerprints

        async def on_change(changes: set[tuple[Any, str]]) -> None:
            for _, raw in changes:
                p = Path(raw)
                names = deps.get(p.parent)
                if names is None or not _matches(names, p.name):
                    continue
                # a re-synced watcher may report files that were already there: only a real
                # difference from what the build saw counts
                if p in prints and assemble.fingerprint(p) == prints[p]:
                    continue
                log.debug("instructions changed", path=raw, cwd=str(cwd))
                self.invalidate_cwd(cwd)
                return

        self._hub.watch(f"instructions:{cwd}", deps.keys(), on_change)

    def _schedule_verify(self, cwd: Path, value: InstructionSet) -> None:
        """After the watches are live, catch an edit that landed before they were."""
        if not self._tasks.accepting:
            return

        async def verify() -> None:
            with anyio.move_on_after(10):
                await self._hub.wait_synced()
            for path, fp in value.fingerprints.items():
                if assemble.fingerprint(path) != fp:
                    entry = self._sets.get(cwd)
                    if entry is not None and entry.value is value:
                        self.invalidate_cwd(cwd)
                    return

        self._tasks.submit("instructions-verify", verify, key=f"instructions-verify:{cwd}",
                           project=str(value.project_root or cwd))

    def invalidate_cwd(self, cwd: Path) -> None:
        self._epochs[cwd] = self._epochs.get(cwd, 0) + 1
        self._sets.pop(cwd, None)
        self._roots.pop(cwd, None)

    def invalidate_path(self, path: Path) -> None:
        """Drop every cached set that depends on ``path`` (used after our own writes)."""
        for cwd, entry in list(self._sets.items()):
            names = entry.value.deps.get(path.parent)
            if names is not None and _matches(names, path.name):
                self.invalidate_cwd(cwd)

    # -- git ----------------------------------------------------------------------------------
    async def _git_section(self, root: Path | None) -> tuple[str, int]:
        if root is None:
            return "", 0
        entry = self._git.get(root)
        if entry is not None:
            return entry.section, entry.epoch
        epoch = self._git_epochs.get(root, 0)
        prints = {p: assemble.fingerprint(p) for p in _git_files(root)}
        status = await gitinfo.git_status(root, timeout_s=GIT_TIMEOUT_S)
        section = gitinfo.render_git_section(status)
        deps = _git_deps(root)

        async def on_change(changes: set[tuple[Any, str]]) -> None:
            for _, raw in changes:
                p = Path(raw)
                names = deps.get(p.parent)
                if names is not None and _matches(names, p.name):
                    self._git_epochs[root] = self._git_epochs.get(root, 0) + 1
                    self._git.pop(root, None)
                    return

        if deps:
            self._hub.watch(f"git:{root}", deps.keys(), on_change)
        if self._git_epochs.get(root, 0) == epoch:
            entry = _GitEntry(section=section, epoch=epoch, deps=deps)
            self._git[root] = entry
            self._schedule_git_verify(root, entry, prints)
        return section, epoch

    def _schedule_git_verify(self, root: Path, entry: _GitEntry,
                             prints: dict[Path, tuple[int, int] | None]) -> None:
        """A commit made before the git watches went live must still refresh the section."""
        if not self._tasks.accepting:
            return

        async def verify() -> None:
            with anyio.move_on_after(10):
                await self._hub.wait_synced()
            if any(assemble.fingerprint(p) != fp for p, fp in prints.items()):
                if self._git.get(root) is entry:
                    self._git_epochs[root] = self._git_epochs.get(root, 0) + 1
                    self._git.pop(root, None)

        self._tasks.submit("git-verify", verify, key=f"git-verify:{root}", project=str(root))

    # -- the system prompt --------------------------------------------------------------------
    async def system_prompt(
        self,
        cwd: Path,
        *,
        model: str | None = None,
        append: str | None = None,
        interaction_mode: str = "interactive",
        env: Mapping[str, str] | None = None,
        tool_roles: ToolRoles | None = None,
        agent: str | None = None,
    ) -> SystemPrompt:
        """The system prompt for ``cwd``; the base follows the session's declared tools
        (``tool_roles``; None: no tools declared) and the client's ``agent`` name (C5)."""
        merged = {k: self._environ[k] for k in PROMPT_ENV_KEYS if k in self._environ}
        if env:
            merged.update({k: v for k, v in env.items() if k in PROMPT_ENV_KEYS})
        env_key = tuple(sorted(merged.items()))
        pkey = (cwd, model, append, interaction_mode, env_key, tool_roles, agent)
        root_guess = self.project_root(cwd)
        if root_guess is not None and root_guess not in self._git and cwd not in self._sets:
            # cold: compute the git section while the instruction set builds in a thread
            git_result: list[tuple[str, int]] = []

            async def git_job() -> None:
                git_result.append(await self._git_section(root_guess))

            async with anyio.create_task_group() as tg:
                tg.start_soon(git_job)
                inst = await self.instruction_set(cwd)
        else:
            inst = await self.instruction_set(cwd)
        root = inst.project_root
        git_section, git_epoch = await self._git_section(root)
        sys_md_print = None
        sys_md_on, sys_md_path = system_md.resolve_path_from_env(
            merged.get("QWEN_SYSTEM_MD"), cwd=cwd, home=self._home())
        if sys_md_on and sys_md_path is not None:
            sys_md_print = (sys_md_path, assemble.fingerprint(sys_md_path))
        mem = self.memory_stamp(root, cwd) if self.memory_stamp is not None else None
        stamp = (id(inst), git_epoch, sys_md_print, mem)
        cached = self._prompts.get(pkey)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        result = self._assemble(cwd, inst, git_section, model=model, append=append,
                                interaction_mode=interaction_mode, env=merged,
                                tool_roles=tool_roles, agent=agent)
        if len(self._prompts) > 512:
            self._prompts.clear()
        self._prompts[pkey] = (stamp, result)
        return result

    def _assemble(self, cwd: Path, inst: InstructionSet, git_section: str, *, model: str | None,
                  append: str | None, interaction_mode: str, env: dict[str, str],
                  tool_roles: ToolRoles | None = None, agent: str | None = None) -> SystemPrompt:
        home = self._home()
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
            memory = self.memory_section(inst.project_root, cwd)
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


def _git_files(root: Path) -> list[Path]:
    """The files whose change means the git section is stale (HEAD, branch ref, packed-refs)."""
    gitdir = gitinfo.resolve_git_dir(root)
    if gitdir is None:
        return []
    common = gitinfo.resolve_common_dir(root) or gitdir
    files = [gitdir / "HEAD", common / "packed-refs"]
    head = gitinfo.read_head(root)
    if head and not all(c in "0123456789abcdef" for c in head):
        files.append(common / "refs" / "heads" / head)
    return files
