"""Handlers of the ``memory.*`` family (list, recall, save, forget in two steps, check_write,
status)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from qwenctxd.memory import render
from qwenctxd.memory.outbound import OUTBOUND
from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import memory as wire
from qwenctxd.server.dispatch import bind
from qwenctxd.server.methods.instructions_methods import checked_project

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection

#: how long ``memory.recall`` (a person or an agent waiting on the answer) lets the model
#: selector refine the lexical answer; later, the lexical answer stands (``tiers`` says "late")
RECALL_SELECTOR_WAIT_S = 5.0


def register(daemon: Daemon) -> None:
    service = daemon.memory
    projects = daemon.projects

    async def list_(ctx: Connection, p: wire.ListParams) -> wire.ListResult:
        _cwd, project = checked_project(projects, p.cwd)
        docs = await service.list(project, p.scope)
        proj = await service.load(project)
        return wire.ListResult(
            docs=[wire.DocInfo(path=str(d.path), scope=d.scope, type=d.type,
                               name=OUTBOUND.text(d.name, escape=False),
                               description=OUTBOUND.text(d.description, escape=False),
                               age=render.age_in_words(d.mtime),
                               hits=service.hits(str(d.path))) for d in docs],
            problems=[{"path": str(pp), "message": m} for pp, m in proj.problems])

    async def recall(ctx: Connection, p: wire.RecallParams) -> wire.RecallResult:
        _cwd, project = checked_project(projects, p.cwd)
        out = await service.recall(project, p.query, active_tools=p.active_tools or [],
                                   selector_timeout_s=RECALL_SELECTOR_WAIT_S)
        return wire.RecallResult(
            strategy=out.strategy,  # type: ignore[arg-type]
            docs=[wire.RecalledDoc(path=str(d.path), scope=d.scope, type=d.type,
                                   name=OUTBOUND.text(d.name, escape=False),
                                   score=out.scores.get(str(d.path))) for d in out.docs],
            prompt=out.prompt, fell_back=out.fell_back,
            tiers=[wire.RecallTier(**t) for t in out.tiers])

    async def forget_candidates(ctx: Connection, p: wire.ForgetCandidatesParams
                                ) -> wire.ForgetCandidatesResult:
        _cwd, project = checked_project(projects, p.cwd)
        if not p.query.strip():
            raise errors.InvalidParams("query is empty", data={"field": "query",
                                                               "message": "empty"})
        found = await service.forget_candidates(project, p.query, limit=max(1, min(p.limit, 50)))
        return wire.ForgetCandidatesResult(candidates=[
            wire.Candidate(path=str(d.path), scope=d.scope,
                           name=OUTBOUND.text(d.name, escape=False), reason=why)
            for d, why in found])

    async def forget(ctx: Connection, p: wire.ForgetParams) -> wire.ForgetResult:
        _cwd, project = checked_project(projects, p.cwd)
        return wire.ForgetResult(removed=await service.forget(project, p.paths))

    async def save(ctx: Connection, p: wire.SaveParams) -> wire.SaveResult:
        from qwenctxd.memory.save import save as save_memory

        _cwd, project = checked_project(projects, p.cwd)

        def write(path: Path, text: str, redacted: list[dict[str, object]]) -> None:
            daemon.audit.write_file(path, text, agent="memory.save", session=None,
                                    redacted=redacted or None)

        out = await save_memory(service, project, mem_type=p.type, name=p.name,
                                description=p.description, body=p.body, scope=p.scope,
                                write=write)
        return wire.SaveResult(path=str(out.path), scope=out.scope, created=out.created,
                               warnings=list(out.warnings),
                               redacted=[wire.RedactedRule(rule=str(r["rule"]),
                                                           count=int(str(r["count"])))
                                         for r in out.redacted])

    async def check_write(ctx: Connection, p: wire.CheckWriteParams) -> wire.CheckWriteResult:
        _cwd, project = checked_project(projects, p.cwd)
        if not os.path.isabs(p.path):
            raise errors.InvalidParams("path must be absolute",
                                       data={"field": "path", "message": "not absolute"})
        v = service.check_write_verdict(project, Path(p.path), p.content)
        return wire.CheckWriteResult(
            allowed=v.allowed, scope=v.scope, verdict=v.verdict,  # type: ignore[arg-type]
            rules=[wire.RuleHit(id=h.rule_id, label=h.label) for h in v.rules],
            redacted=[wire.RedactedRule(rule=str(r["rule"]), count=int(str(r["count"])))
                      for r in v.redacted],
            reason=v.reason)

    async def status(ctx: Connection, p: wire.StatusParams) -> wire.StatusResult:
        cwd, project = checked_project(projects, p.cwd)
        st = await service.status(project)
        st["lock"], st["sessions_since_dream"] = daemon.background.dream_status(project, cwd)
        return wire.StatusResult(**st)

    async def extract(ctx: Connection, p: wire.ExtractParams) -> wire.ScheduledResult:
        from qwenctxd.agents.extraction import ExtractRequest

        s = daemon.sessions.get(p.session_id)
        req = ExtractRequest(session_id=s.id, cwd=s.cwd, project=s.project,
                             history=list(s.history.messages),
                             wrote_memory=s.turn.memory_written_this_turn)
        scheduled, reason = daemon.extractor.schedule(req)
        return wire.ScheduledResult(scheduled=scheduled, reason=reason, skipped_reason=reason)

    async def log(ctx: Connection, p: wire.LogParams) -> wire.LogResult:
        import anyio

        entries = await anyio.to_thread.run_sync(daemon.audit.as_dicts, max(1, p.limit))
        return wire.LogResult(entries=entries)

    async def undo(ctx: Connection, p: wire.UndoParams) -> wire.UndoResult:
        import anyio

        try:
            undone = await anyio.to_thread.run_sync(daemon.audit.find, p.id)
            entry = await anyio.to_thread.run_sync(daemon.audit.undo, p.id)
        except KeyError:
            raise errors.InvalidParams(f"no audit entry {p.id}",
                                       data={"field": "id", "message": "unknown entry"}) from None
        except ValueError as exc:
            raise errors.InvalidParams(str(exc), data={"field": "id", "message": str(exc)}
                                       ) from None
        from qwenctxd.memory.index import rebuild_index

        root = Path(entry.path).parent.parent  # <memory root>/<type>/<file>.md
        if (root / "MEMORY.md").exists():
            scope = "user" if root.name == "memories" else "project"
            await anyio.to_thread.run_sync(rebuild_index, root, scope)
        from qwenctxd.agents.audit import undo_wording

        return wire.UndoResult(
            restored=entry.path, action=entry.action,
            undone=wire.UndoneEntry(id=undone.id, agent=undone.agent, action=undone.action),
            message=undo_wording(undone))

    async def dream(ctx: Connection, p: wire.DreamParams) -> wire.DreamScheduledResult:
        cwd, project = checked_project(projects, p.cwd)
        await service.load(project)  # scaffold
        scheduled, reason = daemon.background.schedule_dream(project, cwd, session_id=None,
                                                             force=p.force)
        if scheduled or reason is None:
            return wire.DreamScheduledResult(scheduled=scheduled, reason=reason,
                                             skipped_reason=reason)
        from qwenctxd.agents.dream import FORCE_SKIPS

        roots = daemon.memory.roots(project)
        return wire.DreamScheduledResult(
            scheduled=False, reason=reason, skipped_reason=reason,
            retry_at=daemon.background.dreamer.retry_at(roots, reason),
            force_skips=(reason in FORCE_SKIPS) or None)

    for spec in (
        bind(methods.MEMORY_DREAM, dream),
        bind(methods.MEMORY_EXTRACT, extract),
        bind(methods.MEMORY_LOG, log),
        bind(methods.MEMORY_UNDO, undo),
        bind(methods.MEMORY_LIST, list_),
        bind(methods.MEMORY_RECALL, recall),
        bind(methods.MEMORY_FORGET_CANDIDATES, forget_candidates),
        bind(methods.MEMORY_FORGET, forget),
        bind(methods.MEMORY_SAVE, save),
        bind(methods.MEMORY_CHECK_WRITE, check_write),
        bind(methods.MEMORY_STATUS, status),
    ):
        daemon.dispatcher.register(spec)
