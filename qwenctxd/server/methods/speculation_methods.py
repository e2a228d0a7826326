"""Handlers of ``speculation.start/accept/abort/status``: a forked agent works ahead on a
copy-on-write overlay; accept applies its writes and appends its messages to the session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import speculation as wire
from qwenctxd.server.dispatch import handler

if TYPE_CHECKING:
    from qwenctxd.agents.speculation import SpeculationManager
    from qwenctxd.model import ModelClient
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.manager import SessionManager
    from qwenctxd.tasks import TaskRegistry


class SpeculationHandlers:
    def __init__(self, *, speculation: SpeculationManager, sessions: SessionManager,
                 tasks: TaskRegistry, model: ModelClient) -> None:
        self.speculation = speculation
        self.sessions = sessions
        self.tasks = tasks
        self.model = model

    @handler(methods.SPECULATION_START)
    async def start(self, ctx: Connection, p: wire.StartParams) -> wire.StartResult:
        manager = self.speculation
        s = self.sessions.get(p.session_id)
        if not self.tasks.accepting:
            raise errors.Busy()
        if not self.model.configured:
            raise errors.ModelUnavailable("speculation needs a model endpoint",
                                          data={"reason": "not_configured"})
        sp = await self.sessions.system_prompt(s)
        spec_id = manager.start(self.model, session_history=list(s.history.messages), cwd=s.cwd,
                                project_root=s.project.anchor, suggestion=p.suggestion,
                                session_id=s.id, system=sp.text, fast=True)
        self.tasks.submit("speculation", lambda: manager.run(spec_id),
                          project=str(s.project.anchor), description=spec_id[:8])
        return wire.StartResult(speculation_id=spec_id)

    @handler(methods.SPECULATION_ACCEPT)
    async def accept(self, ctx: Connection, p: wire.IdParams) -> wire.AcceptResult:
        spec = self.speculation.get(p.speculation_id)
        session_id = spec.session_id
        res = await self.speculation.accept(p.speculation_id)
        if session_id is not None:
            await self.sessions.adopt_messages(session_id, res.messages, complete=res.complete)
        return wire.AcceptResult(applied=[str(a) for a in res.applied], complete=res.complete,
                                 outcome=res.outcome, conflicts=[str(c) for c in res.conflicts],
                                 messages=len(res.messages))

    @handler(methods.SPECULATION_ABORT, allowed_while_stopping=True)
    async def abort(self, ctx: Connection, p: wire.IdParams) -> wire.AbortResult:
        return wire.AbortResult(ok=self.speculation.abort(p.speculation_id))

    @handler(methods.SPECULATION_STATUS, allowed_while_stopping=True)
    async def status(self, ctx: Connection, p: wire.IdParams) -> wire.StatusResult:
        return wire.StatusResult(status=self.speculation.status(p.speculation_id))
