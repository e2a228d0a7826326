"""Handlers of the ``memory.*`` family (list, recall, save, forget in two steps, check_write,
status, extract, log; undo and dream delegate to the memory service and the background)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenctxd.agents.audit import undo_wording
from qwenctxd.memory import render
from qwenctxd.memory.outbound import OUTBOUND
from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import memory as wire
from qwenctxd.server.dispatch import handler
from qwenctxd.server.methods.instructions_methods import checked_project

if TYPE_CHECKING:
    from qwenctxd.agents.audit import AuditLog
    from qwenctxd.agents.extraction import Extractor
    from qwenctxd.memory.service import MemoryService
    from qwenctxd.project import ProjectRegistry
    from qwenctxd.server.background import Background
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.manager import SessionManager

#: how long ``memory.recall`` (a person or an agent waiting on the answer) lets the model
#: selector refine the lexical answer; later, the lexical answer stands (``tiers`` says "late")
RECALL_SELECTOR_WAIT_S = 5.0


class MemoryHandlers:
    def __init__(self, *, memory: MemoryService, audit: AuditLog, extractor: Extractor,
                 sessions: SessionManager, background: Background,
                 projects: ProjectRegistry) -> None:
        self.memory = memory
        self.projects = projects
        self.audit = audit
        self.extractor = extractor
        self.sessions = sessions
        self.background = background

    @handler(methods.MEMORY_LIST)
    async def list_docs(self, ctx: Connection, p: wire.ListParams) -> wire.ListResult:
        _cwd, project = checked_project(self.projects, p.cwd)
        docs = await self.memory.list(project, p.scope)
        proj = await self.memory.load(project)
        return wire.ListResult(
            docs=[wire.DocInfo(path=str(d.path), scope=d.scope, type=d.type,
                               name=OUTBOUND.text(d.name, escape=False),
                               description=OUTBOUND.text(d.description, escape=False),
                               age=render.age_in_words(d.mtime),
                               hits=self.memory.hits(str(d.path))) for d in docs],
            problems=[{"path": str(pp), "message": m} for pp, m in proj.problems])

    @handler(methods.MEMORY_RECALL)
    async def recall(self, ctx: Connection, p: wire.RecallParams) -> wire.RecallResult:
        _cwd, project = checked_project(self.projects, p.cwd)
        out = await self.memory.recall(project, p.query, active_tools=p.active_tools or [],
                                       limit=p.limit, selector_timeout_s=RECALL_SELECTOR_WAIT_S)
        return wire.RecallResult(
            strategy=out.strategy,  # type: ignore[arg-type]
            docs=[wire.RecalledDoc(path=str(d.path), scope=d.scope, type=d.type,
                                   name=OUTBOUND.text(d.name, escape=False),
                                   score=out.scores.get(str(d.path)),
                                   why=_why(out.why.get(str(d.path)))) for d in out.docs],
            prompt=out.prompt, fell_back=out.fell_back,
            tiers=[wire.RecallTier(**t) for t in out.tiers])

    @handler(methods.MEMORY_FORGET_CANDIDATES)
    async def forget_candidates(self, ctx: Connection, p: wire.ForgetCandidatesParams
                                ) -> wire.ForgetCandidatesResult:
        _cwd, project = checked_project(self.projects, p.cwd)
        if not p.query.strip():
            raise errors.InvalidParams("query is empty", data={"field": "query",
                                                               "message": "empty"})
        found = await self.memory.forget_candidates(project, p.query, limit=max(1, min(p.limit, 50)))
        return wire.ForgetCandidatesResult(candidates=[
            wire.Candidate(path=str(d.path), scope=d.scope,
                           name=OUTBOUND.text(d.name, escape=False), reason=why)
            for d, why in found])

    @handler(methods.MEMORY_FORGET)
    async def forget(self, ctx: Connection, p: wire.ForgetParams) -> wire.ForgetResult:
        _cwd, project = checked_project(self.projects, p.cwd)
        return wire.ForgetResult(removed=await self.memory.forget(project, p.paths))

    @handler(methods.MEMORY_SAVE)
    async def save(self, ctx: Connection, p: wire.SaveParams) -> wire.SaveResult:
        from qwenctxd.memory.save import save as save_memory

        _cwd, project = checked_project(self.projects, p.cwd)

        def write(path: Path, text: str, redacted: list[dict[str, object]]) -> None:
            self.audit.write_file(path, text, agent="memory.save", session=None,
                                  redacted=redacted or None)

        out = await save_memory(self.memory, project, mem_type=p.type, name=p.name,
                                description=p.description, body=p.body, scope=p.scope,
                                write=write)
        return wire.SaveResult(path=str(out.path), scope=out.scope, created=out.created,
                               warnings=list(out.warnings),
                               redacted=[wire.RedactedRule(rule=str(r["rule"]),
                                                           count=int(str(r["count"])))
                                         for r in out.redacted])

    @handler(methods.MEMORY_CHECK_WRITE)
    async def check_write(self, ctx: Connection, p: wire.CheckWriteParams
                          ) -> wire.CheckWriteResult:
        _cwd, project = checked_project(self.projects, p.cwd)
        if not os.path.isabs(p.path):
            raise errors.InvalidParams("path must be absolute",
                                       data={"field": "path", "message": "not absolute"})
        v = self.memory.check_write_verdict(project, Path(p.path), p.content)
        return wire.CheckWriteResult(
            allowed=v.allowed, scope=v.scope, verdict=v.verdict,  # type: ignore[arg-type]
            rules=[wire.RuleHit(id=h.rule_id, label=h.label) for h in v.rules],
            redacted=[wire.RedactedRule(rule=str(r["rule"]), count=int(str(r["count"])))
                      for r in v.redacted],
            reason=v.reason)

    @handler(methods.MEMORY_STATUS)
    async def status(self, ctx: Connection, p: wire.StatusParams) -> wire.StatusResult:
        cwd, project = checked_project(self.projects, p.cwd)
        st = await self.memory.status(project)
        st["lock"], st["sessions_since_dream"] = self.background.dream_status(project, cwd)
        return wire.StatusResult(**st)

    @handler(methods.MEMORY_EXTRACT)
    async def extract(self, ctx: Connection, p: wire.ExtractParams) -> wire.ScheduledResult:
        from qwenctxd.agents.extraction import ExtractRequest

        s = self.sessions.get(p.session_id)
        req = ExtractRequest(session_id=s.id, cwd=s.cwd, project=s.project,
                             history=list(s.history.messages),
                             wrote_memory=s.turn.memory_written_this_turn)
        scheduled, reason = self.extractor.schedule(req)
        return wire.ScheduledResult(scheduled=scheduled, reason=reason, skipped_reason=reason)

    @handler(methods.MEMORY_LOG)
    async def log(self, ctx: Connection, p: wire.LogParams) -> wire.LogResult:
        import anyio

        entries = await anyio.to_thread.run_sync(self.audit.as_dicts, max(1, p.limit))
        return wire.LogResult(entries=entries)

    @handler(methods.MEMORY_UNDO)
    async def undo(self, ctx: Connection, p: wire.UndoParams) -> wire.UndoResult:
        return await self.memory.undo(self.audit, p.id, wording=undo_wording)

    @handler(methods.MEMORY_DREAM)
    async def dream(self, ctx: Connection, p: wire.DreamParams) -> wire.DreamScheduledResult:
        cwd, project = checked_project(self.projects, p.cwd)
        return await self.background.dream_now(project, cwd, force=p.force)


def _why(why: dict[str, Any] | None) -> wire.RecallWhy | None:
    return wire.RecallWhy(**why) if why else None
