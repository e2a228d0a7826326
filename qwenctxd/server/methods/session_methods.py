"""Handlers of the ``session.*`` family."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import MethodSpec
from qwenctxd.server.methods.instructions_methods import checked_cwd

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


def register(daemon: Daemon) -> None:
    manager = daemon.sessions
    pipeline = daemon.turns

    async def open_(ctx: Connection, p: wire.OpenParams) -> wire.OpenResult:
        return await manager.open(checked_cwd(p.cwd), p)

    async def turn(ctx: Connection, p: wire.TurnParams) -> wire.AssembledPrompt:
        return await pipeline.turn(p)

    async def record_model(ctx: Connection, p: wire.RecordModelParams) -> wire.RecordModelResult:
        return await pipeline.record_model(p)

    async def compress(ctx: Connection, p: wire.CompressParams) -> wire.CompressResult:
        s = manager.get(p.session_id)
        async with s.lock:
            sp = await manager.system_prompt(s)
            from qwenctxd.sessions.state import system_tokens

            sys_tok = system_tokens(sp.text, s.options.tools)
            if p.mode == "fast":
                before, _ = s.estimate(sys_tok)
                events: list[dict[str, object]] = []
                keep = manager.instructions.settings_for(s.cwd).context.clear_context_on_idle
                saved = pipeline._micro(s, events, trigger="force",
                                        keep=keep.tool_results_num_to_keep, strip_reasoning=True)
                after, _ = s.estimate(sys_tok)
                return wire.CompressResult(status="compressed" if saved else "noop",
                                           tokens_before=before, tokens_after=after,
                                           events=events)
            return await pipeline.compress(s, trigger="manual", focus=p.instructions,
                                           sys_tok=sys_tok, reason="manual", forced=True)

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
            free_tokens=r.free_tokens, free_pct=r.free_pct)

    async def set_title(ctx: Connection, p: wire.SetTitleParams) -> wire.SetTitleResult:
        return await manager.set_title(p.session_id, p.title)

    async def close(ctx: Connection, p: wire.SessionIdParams) -> dwire.OkResult:
        await manager.close(p.session_id)
        return dwire.OkResult()

    for spec in (
        MethodSpec("session.open", wire.OpenParams, open_),
        MethodSpec("session.turn", wire.TurnParams, turn),
        MethodSpec("session.record_model", wire.RecordModelParams, record_model),
        MethodSpec("session.compress", wire.CompressParams, compress),
        MethodSpec("session.rewind", wire.RewindParams, rewind),
        MethodSpec("session.list", wire.ListParams, list_),
        MethodSpec("session.recap", wire.SessionIdParams, recap),
        MethodSpec("session.project_summary", wire.SessionIdParams, project_summary),
        MethodSpec("session.delete", wire.SessionIdParams, delete),
        MethodSpec("session.set_title", wire.SetTitleParams, set_title),
        MethodSpec("session.close", wire.SessionIdParams, close),
        MethodSpec("session.context", wire.SessionIdParams, context),
    ):
        daemon.dispatcher.register(spec)


