"""Handlers of the ``session.*`` family: each a delegation to the session manager or the turn
pipeline (``session.open`` with ``first_turn``: to both, the turn only on a session with no
messages yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import handler
from qwenctxd.server.methods.instructions_methods import checked_cwd, checked_project
from qwenctxd.sessions.context import session_context

if TYPE_CHECKING:
    from qwenctxd.project import ProjectRegistry
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.manager import SessionManager
    from qwenctxd.sessions.turns import TurnPipeline


class SessionHandlers:
    def __init__(self, *, sessions: SessionManager, turns: TurnPipeline,
                 projects: ProjectRegistry) -> None:
        self.sessions = sessions
        self.turns = turns
        self.projects = projects

    @handler(methods.SESSION_OPEN)
    async def open_session(self, ctx: Connection, p: wire.OpenParams) -> wire.OpenResult:
        cwd, project = checked_project(self.projects, p.cwd)
        opened = await self.sessions.open(project, cwd, p)
        if p.first_turn is not None and opened.messages == 0:
            opened.prompt = await self.turns.turn(p.first_turn.turn_params(opened.session_id))
        return opened

    @handler(methods.SESSION_TURN, quiet=True)
    async def turn(self, ctx: Connection, p: wire.TurnParams) -> wire.AssembledPrompt:
        return await self.turns.turn(p)

    @handler(methods.SESSION_RECORD_MODEL, quiet=True)
    async def record_model(self, ctx: Connection, p: wire.RecordModelParams
                           ) -> wire.RecordModelResult:
        return await self.turns.record_model(p)

    @handler(methods.SESSION_COMPRESS)
    async def compress(self, ctx: Connection, p: wire.CompressParams) -> wire.CompressResult:
        return await self.turns.compress_now(p)

    @handler(methods.SESSION_REWIND)
    async def rewind(self, ctx: Connection, p: wire.RewindParams) -> wire.RewindResult:
        return await self.turns.rewind(p)

    @handler(methods.SESSION_LIST)
    async def list_sessions(self, ctx: Connection, p: wire.ListParams) -> wire.ListResult:
        return await self.sessions.list(checked_cwd(p.cwd) if p.cwd else None)

    @handler(methods.SESSION_RECAP)
    async def recap(self, ctx: Connection, p: wire.SessionIdParams) -> wire.RecapResult:
        return await self.sessions.recap(p.session_id)

    @handler(methods.SESSION_PROJECT_SUMMARY)
    async def project_summary(self, ctx: Connection, p: wire.SessionIdParams
                              ) -> wire.ProjectSummaryResult:
        return await self.sessions.project_summary(p.session_id)

    @handler(methods.SESSION_DELETE)
    async def delete(self, ctx: Connection, p: wire.SessionIdParams) -> wire.DeleteResult:
        return await self.sessions.delete(p.session_id)

    @handler(methods.SESSION_SET_TITLE)
    async def set_title(self, ctx: Connection, p: wire.SetTitleParams) -> wire.SetTitleResult:
        return await self.sessions.set_title(p.session_id, p.title)

    @handler(methods.SESSION_CLOSE)
    async def close(self, ctx: Connection, p: wire.SessionIdParams) -> dwire.OkResult:
        await self.sessions.close(p.session_id)
        return dwire.OkResult()

    @handler(methods.SESSION_CONTEXT)
    async def context(self, ctx: Connection, p: wire.SessionIdParams) -> wire.ContextResult:
        return await session_context(self.sessions, p.session_id)
