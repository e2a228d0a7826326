"""Handlers of ``skills.review.list``, ``.accept``, ``.discard`` and ``.run`` (skill review
drafts; see :mod:`qwenctxd.agents.skill_review`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from qwenctxd.agents import skill_review
from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import skills as wire
from qwenctxd.server.dispatch import bind
from qwenctxd.server.methods.instructions_methods import checked_project

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


def _info(d: skill_review.Draft) -> wire.DraftInfo:
    return wire.DraftInfo(id=d.id, name=d.name, description=d.description, path=d.path,
                          created_at=d.created_at, updates_existing=d.updates_existing,
                          session_id=d.session_id, problem=d.problem)


def register(daemon: Daemon) -> None:
    reviewer = daemon.reviewer

    def root_of(cwd_raw: str, *, required: bool) -> Path | None:
        cwd, project = checked_project(daemon.projects, cwd_raw)
        root = project.root
        if root is None and required:
            raise errors.InvalidParams(f"{cwd} is not inside a project (no project root)",
                                       data={"field": "cwd", "message": "no project root"})
        return root

    def unknown(draft_id: str) -> errors.InvalidParams:
        return errors.InvalidParams(f"no skill draft {draft_id}",
                                    data={"field": "draft_id", "message": "unknown draft"})

    async def list_(ctx: Connection, p: wire.ReviewListParams) -> wire.ReviewListResult:
        root = root_of(p.cwd, required=False)
        if root is None:
            return wire.ReviewListResult(drafts=[])
        drafts = await anyio.to_thread.run_sync(reviewer.list_drafts, root)
        return wire.ReviewListResult(drafts=[_info(d) for d in drafts])

    async def accept(ctx: Connection, p: wire.ReviewDraftParams) -> wire.ReviewAcceptResult:
        root = root_of(p.cwd, required=True)
        assert root is not None
        try:
            path = await anyio.to_thread.run_sync(
                lambda: reviewer.accept(root, p.draft_id, audit=daemon.audit))
        except KeyError:
            raise unknown(p.draft_id) from None
        except ValueError as exc:
            raise errors.InvalidParams(str(exc), data={"field": "draft_id",
                                                       "message": str(exc)}) from None
        return wire.ReviewAcceptResult(path=str(path))

    async def discard(ctx: Connection, p: wire.ReviewDraftParams) -> wire.ReviewDiscardResult:
        root = root_of(p.cwd, required=True)
        assert root is not None
        try:
            await anyio.to_thread.run_sync(reviewer.discard, root, p.draft_id)
        except KeyError:
            raise unknown(p.draft_id) from None
        return wire.ReviewDiscardResult(ok=True)

    async def run(ctx: Connection, p: wire.ReviewRunParams) -> wire.ReviewRunResult:
        s = daemon.sessions.get(p.session_id)
        job, reason = reviewer.schedule(s, daemon.tasks, daemon.model, daemon.audit,
                                        s.project.settings, force=True)
        return wire.ReviewRunResult(scheduled=job is not None, reason=reason)

    for spec in (
        bind(methods.SKILLS_REVIEW_LIST, list_),
        bind(methods.SKILLS_REVIEW_ACCEPT, accept),
        bind(methods.SKILLS_REVIEW_DISCARD, discard),
        bind(methods.SKILLS_REVIEW_RUN, run),
    ):
        daemon.dispatcher.register(spec)
