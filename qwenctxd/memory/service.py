"""MemoryService: the one entry point to auto memory for the daemon.

Per project it knows the memory roots (project / user / opt-in team), scaffolds them, keeps a
scan of the memory files and an SQLite FTS5 index in step with them (watchers on the memory
directories; changes re-sync in a background job), answers recall (model selector over headers
when a model is configured, lexical BM25 otherwise or on any model failure), renders the memory
section of the system prompt, vets writes into team memory, and forgets in two steps.

Every entry point takes the caller's resolved :class:`~qwenctxd.project.Project` (the wire edge
or the session resolved it once): its ``anchor`` keys the project's memory, its ``root`` and
``settings`` decide the roots and whether memory is on. Nothing here walks up for ``.git``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from qwenctxd.events import EventBus
from qwenctxd.fsutil import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    atomic_write,
    make_dirs,
    read_regular,
)
from qwenctxd.memory import forget_match, render, secrets, selector, store
from qwenctxd.memory import paths as mpaths
from qwenctxd.memory import recall as recall_pipeline
from qwenctxd.memory.index import rebuild_index
from qwenctxd.memory.lexical import LexicalIndex
from qwenctxd.memory.outbound import OUTBOUND
from qwenctxd.memory.prompt import memory_section
from qwenctxd.memory.recall import Corpus, RecallOutcome
from qwenctxd.memory.semantic.upkeep import SemanticUpkeep
from qwenctxd.model import ModelClient
from qwenctxd.project import Project
from qwenctxd.protocol import memory as wire
from qwenctxd.protocol.errors import InvalidParams, ModelUnavailable, PathOutsideProject
from qwenctxd.tasks import TaskRegistry
from qwenctxd.watch import Watched, WatchedCache, WatchHub

log = structlog.get_logger("qwenctxd.memory")
FORGET_LIMIT = 5
HITS_FILENAME = "recall-hits.json"
HITS_FLUSH_S = 2.0  # the recall counts file is written at most this often per project
MAX_FORGET_DELETIONS = 400


@dataclass
class CheckVerdict:
    """``memory.check_write``'s answer (see :meth:`MemoryService.check_write_verdict`)."""

    allowed: bool
    scope: str | None
    rules: list[secrets.SecretHit]
    verdict: str
    redacted: list[dict[str, object]] = field(default_factory=list)
    reason: str | None = None


@dataclass
class _Project:
    key: Path
    project: Project
    roots: mpaths.MemoryRoots
    lexical: LexicalIndex
    db_dir: Path
    docs: list[store.MemoryDoc] = field(default_factory=list)
    problems: list[tuple[Path, str]] = field(default_factory=list)
    generation: int = 0
    _by_path: tuple[int, dict[str, store.MemoryDoc]] | None = None

    def by_path(self) -> dict[str, store.MemoryDoc]:
        """The documents by path, built once per generation (10 000 ``str(path)`` calls
        were a third of a warm recall's time)."""
        if self._by_path is None or self._by_path[0] != self.generation:
            self._by_path = (self.generation, {str(d.path): d for d in self.docs})
        return self._by_path[1]


class MemoryService:
    def __init__(self, hub: WatchHub, tasks: TaskRegistry, bus: EventBus,
                 *, model: Callable[[], ModelClient],
                 environ: Mapping[str, str] | None = None,
                 semantic: SemanticUpkeep | None = None) -> None:
        self._hub = hub
        self._tasks = tasks
        self._bus = bus
        self._model = model
        self._environ = environ if environ is not None else os.environ
        self._semantic = semantic  # None: no semantic tier (lexical and selector only)
        # scan + FTS index per project; a relevant change re-syncs in the background
        self._loads: WatchedCache[Path, _Project] = WatchedCache(
            hub, tasks, "memory", on_stale=lambda _key, proj: self._schedule_refresh(proj))
        self._hits: dict[str, int] = {}
        self._hits_written: dict[Path, float] = {}  # monotonic time of the last write
        self._roots: dict[tuple[Path, Path | None, bool], mpaths.MemoryRoots] = {}
        #: id(roots) -> (roots, [(root, its index file)]): the prompt stamp's paths, built once
        self._index_paths: dict[int, tuple[mpaths.MemoryRoots, list[tuple[str, str]]]] = {}

    # -- roots ------------------------------------------------------------------------------------
    @staticmethod
    def enabled(project: Project) -> bool:
        return project.settings.memory.enable_managed_auto_memory

    def roots(self, project: Project) -> mpaths.MemoryRoots:
        s = project.settings
        key = (project.anchor, project.root, s.memory.enable_team_memory)
        cached = self._roots.get(key)
        if cached is None:
            cached = mpaths.roots_for(project.anchor, environ=self._environ,
                                      team_enabled=s.memory.enable_team_memory,
                                      git_root=project.root)
            if len(self._roots) > 1024:
                self._roots.clear()
            self._roots[key] = cached
        return cached

    async def load(self, project: Project) -> _Project:
        """The project's memory, loaded once (scan + FTS index) and shared by every caller.

        The load runs as shared work (:class:`~qwenctxd.tasks.SharedLoads`): a caller that is
        cancelled (a superseded recall prefetch) stops waiting, the load goes on, and the
        project is published only once its documents and index are both complete.
        """
        key = project.anchor
        proj = self._loads.peek(key)
        if proj is not None:
            return proj
        return await self._loads.get(key, lambda: self._open(project))

    async def _open(self, project: Project) -> Watched[_Project]:
        key = project.anchor
        roots = self.roots(project)
        await anyio.to_thread.run_sync(store.ensure_scaffold, roots)
        db_dir = roots.state or (roots.user.parent / "projects" / "_no_project")
        make_dirs(db_dir, PRIVATE_DIR_MODE)
        lexical = LexicalIndex(db_dir / "recall.sqlite")
        await lexical.open()
        try:
            proj = _Project(key=key, project=project, roots=roots, lexical=lexical,
                            db_dir=db_dir)
            await anyio.to_thread.run_sync(self._load_hits, proj)
            watched = await self._resync_watched(proj)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await lexical.close()
            raise
        return watched

    def _scoped_roots(self, roots: mpaths.MemoryRoots) -> list[tuple[str, Path]]:
        out = [("user", roots.user)]
        if roots.project is not None:
            out.append(("project", roots.project))
        if roots.team is not None:
            out.append(("team", roots.team))
        return out

    async def _refresh(self, proj: _Project) -> None:
        """Re-sync with the files on disk, as shared work that starts after any load running."""
        await self._loads.reload(proj.key, lambda: self._resync_watched(proj))

    async def _resync_watched(self, proj: _Project) -> Watched[_Project]:
        """:meth:`_resync`, and what the cache watches: ``.md`` changes in the memory dirs,
        and (once the watches are live) a directory listing that moved since the scan began."""
        dirs = self._watch_dirs(proj)
        before = await anyio.to_thread.run_sync(_fingerprint, dirs)
        await self._resync(proj)
        return Watched(proj, dirs, lambda p: p.name.endswith(".md"),
                       lambda: _fingerprint(dirs) != before)

    async def _resync(self, proj: _Project) -> _Project:
        """Re-scan every scope (worker thread), bring the FTS index in step (one transaction),
        and only then publish the new documents, so recall and listing agree."""
        def scan_all() -> tuple[list[store.MemoryDoc], list[tuple[Path, str]]]:
            docs: list[store.MemoryDoc] = []
            problems: list[tuple[Path, str]] = []
            for scope, root in self._scoped_roots(proj.roots):
                if not root.exists():
                    continue
                res = store.scan(root, scope, uncapped=True)  # type: ignore[arg-type]
                docs.extend(res.docs)
                problems.extend(res.problems)
            return docs, problems

        docs, problems = await anyio.to_thread.run_sync(scan_all)
        await proj.lexical.sync(docs)
        proj.docs, proj.problems = docs, problems
        proj.generation += 1
        if self._tasks.accepting:
            self._embed_soon(proj, first=False)  # only a project recall has used already
        return proj

    def _watch_dirs(self, proj: _Project) -> list[Path]:
        dirs: list[Path] = []
        for _, root in self._scoped_roots(proj.roots):
            dirs.append(root)
            dirs.extend(root / t for t in mpaths.MEMORY_TYPES)
        return dirs

    def _schedule_refresh(self, proj: _Project) -> None:
        if not self._tasks.accepting:
            return

        async def job() -> None:
            await self._refresh(proj)
            self._bus.publish("memory/changed", {"project": str(proj.key),
                                                 "docs": len(proj.docs)})

        self._tasks.submit("memory-sync", job, key=f"memory-sync:{proj.key}",
                           project=str(proj.key))

    async def aclose(self) -> None:
        await self._loads.aclose()
        for key, proj in list(self._loads.items()):
            await proj.lexical.close()
            self._loads.forget(key)
        if self._semantic is not None:
            await self._semantic.aclose()

    # -- listing ------------------------------------------------------------------------------------
    async def list(self, project: Project, scope: str | None = None
                   ) -> list[store.MemoryDoc]:
        proj = await self.load(project)
        return [d for d in proj.docs if scope is None or d.scope == scope]

    # -- recall -------------------------------------------------------------------------------------
    async def recall(self, project: Project, query: str, *, active_tools: Sequence[str] = (),
                     exclude: Sequence[str] = (), limit: int = render.MAX_RELEVANT_DOCS,
                     use_selector: bool = True, selector_timeout_s: float | None = None,
                     on_fused: Callable[[RecallOutcome], None] | None = None,
                     background: bool = False) -> RecallOutcome:
        """The memories for ``query`` (:func:`qwenctxd.memory.recall.recall`: lexical and
        semantic tiers fused, refined by the model selector when one is configured and
        ``use_selector`` is on). Never worse with a model than without: ``on_fused`` is handed
        the answer without the selector as soon as it exists, and a selector that fails,
        answers nothing or misses ``selector_timeout_s`` leaves that answer standing.
        ``background``: nobody waits for the semantic tier (a turn's prefetch): its query is
        embedded below the daemon's priority."""
        proj = await self.load(project)
        semantic_on = self._semantic is not None and project.settings.memory.recall.semantic
        if semantic_on:
            self._embed_soon(proj)
        corpus = Corpus(key=proj.key, docs=proj.docs, lexical=proj.lexical,
                        generation=proj.generation, semantic_on=semantic_on,
                        by_path=proj.by_path())
        outcome = await recall_pipeline.recall(
            corpus, query, model=self._model(), semantic=self._semantic,
            active_tools=active_tools, exclude=exclude, limit=limit,
            use_selector=use_selector, selector_timeout_s=selector_timeout_s,
            on_fused=on_fused, background=background)
        return self._counted(proj, outcome)

    def _embed_soon(self, proj: _Project, *, first: bool = True) -> None:
        """Bring the project's vectors in step with its documents (a background job). The
        first sync is a recall's (``first``): a project nobody recalls from starts no worker."""
        if self._semantic is None or not proj.project.settings.memory.recall.semantic:
            return
        if not first and not self._semantic.has(proj.key):
            return
        if not proj.docs and not self._semantic.has(proj.key):
            return
        self._semantic.request_sync(
            proj.key, proj.db_dir, proj.project.settings.memory.embeddings,
            lambda: (proj.docs, proj.generation))

    def semantic_status(self) -> dict[str, Any] | None:
        return self._semantic.status() if self._semantic is not None else None

    def _counted(self, proj: _Project, outcome: RecallOutcome) -> RecallOutcome:
        for d in outcome.docs:
            self._hits[str(d.path)] = self._hits.get(str(d.path), 0) + 1
        if outcome.docs:
            self._save_hits(proj)
        return outcome

    def hits(self, path: str) -> int:
        return self._hits.get(path, 0)

    def _hits_file(self, proj: _Project) -> Path | None:
        return proj.roots.state / HITS_FILENAME if proj.roots.state is not None else None

    def _load_hits(self, proj: _Project) -> None:
        path = self._hits_file(proj)
        if path is None:
            return
        try:
            data = json.loads(read_regular(path).decode("utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            for k, v in data.items():
                if isinstance(v, int):
                    self._hits[k] = max(self._hits.get(k, 0), v)

    def _save_hits(self, proj: _Project) -> None:
        """Persist recall counts (for pruning and qwenctl) in a coalesced background write."""
        path = self._hits_file(proj)
        if path is None or not self._tasks.accepting:
            return
        prefixes = [str(r) for _, r in self._scoped_roots(proj.roots)]

        async def write() -> None:
            # at most one write every HITS_FLUSH_S: a burst of recalls is one write
            wait = self._hits_written.get(proj.key, -math.inf) + HITS_FLUSH_S - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)
            self._hits_written[proj.key] = time.monotonic()
            data = {k: v for k, v in self._hits.items()
                    if any(k.startswith(p + os.sep) for p in prefixes)}
            text = json.dumps(data, indent=2, sort_keys=True) + "\n"
            await anyio.to_thread.run_sync(lambda: atomic_write(
                path, text, mode=PRIVATE_FILE_MODE, dir_mode=PRIVATE_DIR_MODE))

        self._tasks.submit("memory-hits", write, key=f"memory-hits:{proj.key}",
                           project=str(proj.key))

    # -- the system prompt section --------------------------------------------------------------------
    def prompt_section(self, project: Project) -> str:
        if not self.enabled(project):
            return ""
        roots = self.roots(project)
        indexes = []
        for scope, root in self._scoped_roots(roots):
            try:
                text = read_regular(root / mpaths.INDEX_FILENAME).decode("utf-8", errors="replace")
            except OSError:
                text = ""
            indexes.append((scope, root, OUTBOUND.text(text)))  # redacted, escaped
        return memory_section(indexes)

    def prompt_stamp(self, project: Project) -> tuple[Any, ...]:
        """Changes whenever the memory section would: the indexes' stat and the settings."""
        if not self.enabled(project):
            return ("off",)
        roots = self.roots(project)
        indexes = self._index_paths.get(id(roots))
        if indexes is None or indexes[0] is not roots:  # asked for every prompt: paths once
            indexes = (roots, [(str(root), os.fspath(root / mpaths.INDEX_FILENAME))
                               for _, root in self._scoped_roots(roots)])
            if len(self._index_paths) > 1024:
                self._index_paths.clear()
            self._index_paths[id(roots)] = indexes
        out: list[Any] = []
        for root, index in indexes[1]:
            try:
                st = os.stat(index)
                out.append((root, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((root, None))
        return tuple(out)

    # -- writes ---------------------------------------------------------------------------------------
    def check_write(self, project: Project, path: Path, content: str
                    ) -> tuple[bool, str | None, list[secrets.SecretHit]]:
        v = self.check_write_verdict(project, path, content)
        return v.allowed, v.scope, v.rules

    def check_write_verdict(self, project: Project, path: Path, content: str) -> CheckVerdict:
        """What a write of ``content`` to ``path`` would become: ``allow``, ``redact``
        (project/user memory) or ``refuse`` (team memory holding a secret, or a symlink that
        takes the bytes out of the memory directory)."""
        roots = self.roots(project)
        scope = mpaths.scope_of(path, roots)
        team_root = roots.team or (project.anchor / ".qwen" / "team-memory")
        team_roots = mpaths.MemoryRoots(project=roots.project, user=roots.user, team=team_root,
                                        state=roots.state)
        is_team = mpaths.scope_of(path, team_roots) == "team"
        escaped = mpaths.escaped_scope(path, team_roots)
        if escaped is not None:  # names a memory dir, but a symlink takes the bytes elsewhere
            return CheckVerdict(False, escaped, [], "refuse",
                                reason=f"{path} resolves outside the {escaped} memory")
        res = secrets.check_write(path, content, is_team_path=lambda _p: is_team)
        if is_team:
            return CheckVerdict(res.allowed, "team", list(res.rules),
                                "allow" if res.allowed else "refuse", reason=res.message)
        verdict = secrets.vet_document(scope, content)
        return CheckVerdict(True, scope, list(verdict.rules), verdict.action,
                            redacted=list(verdict.redacted))

    async def landed(self, project: Project, change: dict[str, Any]) -> None:
        """A write made outside the watchers' path (``memory.save``): re-scan now and tell
        subscribers, so the next recall already sees it."""
        proj = await self.load(project)
        await self._refresh(proj)
        self._bus.publish("memory/changed", {"project": str(proj.key), "docs": len(proj.docs),
                                             **change})

    # -- forget ---------------------------------------------------------------------------------------
    async def forget_candidates(self, project: Project, query: str, *,
                                limit: int = FORGET_LIMIT
                                ) -> list[tuple[store.MemoryDoc, str]]:
        proj = await self.load(project)
        docs = [d for d in proj.docs if d.scope in ("user", "project")]
        ids = {f"{d.scope}:{d.relative_path}": d for d in docs}
        model = self._model()
        if model.configured and ids:
            summaries = [(cid, OUTBOUND.text(f"scope: {d.scope}\ntopic: {d.type}\nsummary: "
                                             f"{d.name} — {d.description}", escape=False))
                         for cid, d in ids.items()]
            try:
                chosen = await selector.select_for_forget(model, query, summaries, limit=limit)
                if chosen:
                    return [(ids[c], "selected by the model") for c in chosen]
                log.info("forget: the model chose nothing; falling back to term matching")
            except ModelUnavailable as exc:
                log.info("forget fell back to term matching",
                         reason=(exc.data or {}).get("reason") if isinstance(exc.data, dict)
                         else None)
        return forget_match.term_candidates(query, docs, limit=limit)

    async def forget(self, project: Project, paths: Sequence[str]) -> list[str]:
        proj = await self.load(project)
        known = {str(d.path): d for d in proj.docs if d.scope in ("user", "project")}
        targets = []
        for raw in paths[:MAX_FORGET_DELETIONS]:
            p = str(Path(raw))
            if p not in known:
                raise PathOutsideProject(f"not a memory of this project or user: {raw}",
                                         data={"path": raw})
            targets.append(known[p])
        removed = await anyio.to_thread.run_sync(store.remove_docs, [d.path for d in targets])
        scopes = {d.scope for d in targets}

        def rebuild() -> None:
            for scope, root in self._scoped_roots(proj.roots):
                if scope in scopes:
                    rebuild_index(root, scope)  # type: ignore[arg-type]

        await anyio.to_thread.run_sync(rebuild)
        if proj.roots.state is not None:
            await anyio.to_thread.run_sync(lambda: store.write_meta(proj.roots.state))
        await self._refresh(proj)
        self._bus.publish("memory/changed", {"project": str(proj.key), "removed": len(removed)})
        return [str(p) for p in removed]

    # -- status -----------------------------------------------------------------------------------------
    async def status(self, project: Project) -> dict[str, Any]:
        proj = await self.load(project)
        counts: dict[str, int] = {}
        for d in proj.docs:
            counts[d.scope] = counts.get(d.scope, 0) + 1
        index_bytes = 0
        for _, root in self._scoped_roots(proj.roots):
            try:
                index_bytes += os.stat(root / mpaths.INDEX_FILENAME).st_size
            except OSError:
                pass
        meta: dict[str, Any] = {}
        cursor: dict[str, Any] = {}
        if proj.roots.state is not None:
            meta = await anyio.to_thread.run_sync(store.read_meta, proj.roots.state)
            cursor = await anyio.to_thread.run_sync(store.read_cursor, proj.roots.state)
        return {
            "roots": {"project": str(proj.roots.project) if proj.roots.project else None,
                      "user": str(proj.roots.user),
                      "team": str(proj.roots.team) if proj.roots.team else None},
            "counts": counts, "index_bytes": index_bytes, "cursor": cursor,
            "last_dream_at": meta.get("lastDreamAt"),
            "sessions_since_dream": None, "lock": None,
            "problems": [{"path": str(p), "message": m} for p, m in proj.problems],
        }

    def projects(self) -> list[tuple[Path, int]]:
        return [(k, len(p.docs)) for k, p in self._loads.items()]

    def loaded(self) -> list[Project]:
        """The projects whose memory is loaded (the idle dream checks walk these)."""
        return [p.project for _, p in self._loads.items()]

    async def undo(self, audit: UndoableLog, entry_id: str,
                   wording: Callable[[Any], str]) -> wire.UndoResult:
        """``memory.undo``: revert audit entry ``entry_id`` (InvalidParams naming ``id`` when it
        is unknown or the file changed since), then rebuild the MEMORY.md index of the memory
        root it was in; ``wording`` says for people what the undo did."""
        try:
            undone = await anyio.to_thread.run_sync(audit.find, entry_id)
            entry = await anyio.to_thread.run_sync(audit.undo, entry_id)
        except KeyError:
            raise InvalidParams(f"no audit entry {entry_id}",
                                data={"field": "id", "message": "unknown entry"}) from None
        except ValueError as exc:
            raise InvalidParams(str(exc), data={"field": "id", "message": str(exc)}) from None
        root = Path(entry.path).parent.parent  # <memory root>/<type>/<file>.md
        if (root / "MEMORY.md").exists():
            scope = "user" if root.name == "memories" else "project"
            await anyio.to_thread.run_sync(rebuild_index, root, scope)
        return wire.UndoResult(
            restored=entry.path, action=entry.action,
            undone=wire.UndoneEntry(id=undone.id, agent=undone.agent, action=undone.action),
            message=wording(undone))


class UndoableLog(Protocol):
    """The audit log as :meth:`MemoryService.undo` uses it (entries with ``id``, ``agent``,
    ``action`` and ``path``)."""

    def find(self, entry_id: str) -> Any: ...

    def undo(self, entry_id: str) -> Any: ...


def _fingerprint(dirs: Sequence[Path]) -> list[tuple[str, int, int]]:
    out = []
    for d in dirs:
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.endswith(".md"):
                        try:
                            st = e.stat()
                        except OSError:
                            continue
                        out.append((e.path, st.st_mtime_ns, st.st_size))
        except OSError:
            continue
    return sorted(out)
