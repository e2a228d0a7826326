"""Handlers of the ``session.*`` family."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import bind
from qwenctxd.server.methods.instructions_methods import checked_cwd, checked_project

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


def register(daemon: Daemon) -> None:
    manager = daemon.sessions
    pipeline = daemon.turns

    async def open_(ctx: Connection, p: wire.OpenParams) -> wire.OpenResult:
        cwd, project = checked_project(daemon.projects, p.cwd)
        return await manager.open(project, cwd, p)

    async def turn(ctx: Connection, p: wire.TurnParams) -> wire.AssembledPrompt:
        return await pipeline.turn(p)

    async def record_model(ctx: Connection, p: wire.RecordModelParams) -> wire.RecordModelResult:
        return await pipeline.record_model(p)

    async def compress(ctx: Connection, p: wire.CompressParams) -> wire.CompressResult:
        return await pipeline.compress_now(p)

    async def rewind(ctx: Connection, p: wire.RewindParams) -> wire.RewindResult:
        return await pipeline.rewind(p)

    async def list_(ctx: Connection, p: wire.ListParams) -> wire.ListResult:
        return await manager.list(checked_cwd(p.cwd) if p.cwd else None)

    async def recap(ctx: Connection, p: wire.SessionIdParams) -> wire.RecapResult:
        return await manager.recap(p.session_id)

    async def project_summary(ctx: Connection, p: wire.SessionIdParams
                              ) -> wire.ProjectSummaryResult:
        return await manager.project_summary(p.session_id)

    async def delete(ctx: Connection, p: wire.SessionIdParams) -> wire.DeleteResult:
        return await manager.delete(p.session_id)

    async def context(ctx: Connection, p: wire.SessionIdParams) -> wire.ContextResult:
        from qwenctxd.sessions.context import context_report

        s = manager.get(p.session_id)
        async with s.lock:
            sp = await manager.system_prompt(s)
            r = context_report(s, sp, s.options.tools)
        return wire.ContextResult(
            session_id=r.session_id, window_tokens=r.window_tokens,
            prompt_tokens=r.prompt_tokens, anchored=r.anchored,
            thresholds=wire.Thresholds(warn=r.thresholds.warn, auto=r.thresholds.auto,
                                       hard=r.thresholds.hard),
            level=r.level,  # type: ignore[arg-type]
            parts=[wire.ContextPart(name=x.name, tokens=x.tokens, pct=x.pct) for x in r.parts],
            free_tokens=r.free_tokens, free_pct=r.free_pct, window_source=r.window_source)

    async def set_title(ctx: Connection, p: wire.SetTitleParams) -> wire.SetTitleResult:
        return await manager.set_title(p.session_id, p.title)

    async def close(ctx: Connection, p: wire.SessionIdParams) -> dwire.OkResult:
        await manager.close(p.session_id)
        return dwire.OkResult()

    for spec in (
        bind(methods.SESSION_OPEN, open_),
        bind(methods.SESSION_TURN, turn),
        bind(methods.SESSION_RECORD_MODEL, record_model),
        bind(methods.SESSION_COMPRESS, compress),
        bind(methods.SESSION_REWIND, rewind),
        bind(methods.SESSION_LIST, list_),
        bind(methods.SESSION_RECAP, recap),
        bind(methods.SESSION_PROJECT_SUMMARY, project_summary),
        bind(methods.SESSION_DELETE, delete),
        bind(methods.SESSION_SET_TITLE, set_title),
        bind(methods.SESSION_CLOSE, close),
        bind(methods.SESSION_CONTEXT, context),
    ):
        daemon.dispatcher.register(spec)


