"""Handlers of ``speculation.start/accept/abort/status``: a forked agent works ahead on a
copy-on-write overlay; accept applies its writes and appends its messages to the session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import speculation as wire
from qwenctxd.server.dispatch import bind

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


def register(daemon: Daemon) -> None:
    manager = daemon.speculation

    async def start(ctx: Connection, p: wire.StartParams) -> wire.StartResult:
        s = daemon.sessions.get(p.session_id)
        if not daemon.tasks.accepting:
            raise errors.Busy()
        if not daemon.model.configured:
            raise errors.ModelUnavailable("speculation needs a model endpoint",
                                          data={"reason": "not_configured"})
        sp = await daemon.sessions.system_prompt(s)
        spec_id = manager.start(daemon.model, session_history=list(s.history.messages), cwd=s.cwd,
                                project_root=s.project.anchor, suggestion=p.suggestion,
                                session_id=s.id, system=sp.text, fast=True)
        daemon.tasks.submit("speculation", lambda: manager.run(spec_id),
                            project=str(s.project.anchor), description=spec_id[:8])
        return wire.StartResult(speculation_id=spec_id)

    async def accept(ctx: Connection, p: wire.IdParams) -> wire.AcceptResult:
        spec = manager.get(p.speculation_id)
        session_id = spec.session_id
        res = await manager.accept(p.speculation_id)
        if session_id is not None:
            await daemon.sessions.adopt_messages(session_id, res.messages, complete=res.complete)
        return wire.AcceptResult(applied=[str(a) for a in res.applied], complete=res.complete,
                                 outcome=res.outcome, conflicts=[str(c) for c in res.conflicts],
                                 messages=len(res.messages))

    async def abort(ctx: Connection, p: wire.IdParams) -> wire.AbortResult:
        return wire.AbortResult(ok=manager.abort(p.speculation_id))

    async def status(ctx: Connection, p: wire.IdParams) -> wire.StatusResult:
        return wire.StatusResult(status=manager.status(p.speculation_id))

    for spec_ in (
        bind(methods.SPECULATION_START, start),
        bind(methods.SPECULATION_ACCEPT, accept),
        bind(methods.SPECULATION_ABORT, abort, allowed_while_stopping=True),
        bind(methods.SPECULATION_STATUS, status, allowed_while_stopping=True),
    ):
        daemon.dispatcher.register(spec_)
