"""Handlers of ``skills.review.list``, ``.accept``, ``.discard`` and ``.run`` (skill review
drafts; see :mod:`qwenctxd.agents.skill_review`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from qwenctxd.agents import skill_review
from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import skills as wire
from qwenctxd.server.dispatch import handler
from qwenctxd.server.methods.instructions_methods import checked_project

if TYPE_CHECKING:
    from qwenctxd.agents.audit import AuditLog
    from qwenctxd.model import ModelClient
    from qwenctxd.project import ProjectRegistry
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.manager import SessionManager
    from qwenctxd.tasks import TaskRegistry


def _info(d: skill_review.Draft) -> wire.DraftInfo:
    return wire.DraftInfo(id=d.id, name=d.name, description=d.description, path=d.path,
                          created_at=d.created_at, updates_existing=d.updates_existing,
                          session_id=d.session_id, problem=d.problem)


def _unknown(draft_id: str) -> errors.InvalidParams:
    return errors.InvalidParams(f"no skill draft {draft_id}",
                                data={"field": "draft_id", "message": "unknown draft"})


class SkillReviewHandlers:
    def __init__(self, *, reviewer: skill_review.SkillReviewer, audit: AuditLog,
                 projects: ProjectRegistry, sessions: SessionManager,
                 tasks: TaskRegistry, model: ModelClient) -> None:
        self.reviewer = reviewer
        self.audit = audit
        self.projects = projects
        self.sessions = sessions
        self.tasks = tasks
        self.model = model

    def root_of(self, cwd_raw: str, *, required: bool) -> Path | None:
        cwd, project = checked_project(self.projects, cwd_raw)
        root = project.root
        if root is None and required:
            raise errors.InvalidParams(f"{cwd} is not inside a project (no project root)",
                                       data={"field": "cwd", "message": "no project root"})
        return root

    @handler(methods.SKILLS_REVIEW_LIST)
    async def list_drafts(self, ctx: Connection, p: wire.ReviewListParams
                          ) -> wire.ReviewListResult:
        root = self.root_of(p.cwd, required=False)
        if root is None:
            return wire.ReviewListResult(drafts=[])
        drafts = await anyio.to_thread.run_sync(self.reviewer.list_drafts, root)
        return wire.ReviewListResult(drafts=[_info(d) for d in drafts])

    @handler(methods.SKILLS_REVIEW_ACCEPT)
    async def accept(self, ctx: Connection, p: wire.ReviewDraftParams) -> wire.ReviewAcceptResult:
        root = self.root_of(p.cwd, required=True)
        assert root is not None
        try:
            path = await anyio.to_thread.run_sync(
                lambda: self.reviewer.accept(root, p.draft_id, audit=self.audit))
        except KeyError:
            raise _unknown(p.draft_id) from None
        except ValueError as exc:
            raise errors.InvalidParams(str(exc), data={"field": "draft_id",
                                                       "message": str(exc)}) from None
        return wire.ReviewAcceptResult(path=str(path))

    @handler(methods.SKILLS_REVIEW_DISCARD)
    async def discard(self, ctx: Connection, p: wire.ReviewDraftParams
                      ) -> wire.ReviewDiscardResult:
        root = self.root_of(p.cwd, required=True)
        assert root is not None
        try:
            await anyio.to_thread.run_sync(self.reviewer.discard, root, p.draft_id)
        except KeyError:
            raise _unknown(p.draft_id) from None
        return wire.ReviewDiscardResult(ok=True)

    @handler(methods.SKILLS_REVIEW_RUN)
    async def run(self, ctx: Connection, p: wire.ReviewRunParams) -> wire.ReviewRunResult:
        s = self.sessions.get(p.session_id)
        job, reason = self.reviewer.schedule(s, self.tasks, self.model, self.audit,
                                             s.project.settings, force=True)
        return wire.ReviewRunResult(scheduled=job is not None, reason=reason)
