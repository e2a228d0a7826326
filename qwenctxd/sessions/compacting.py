"""The compaction side of a turn: the triggers ``session.turn`` runs after appending (SPEC §S3
order: idle and size micro-compaction first, then image overflow, hard, auto), the hard and
failed-summary fallbacks to micro-compaction, and ``session.compress`` (``fast``: forced
micro-compaction; ``full``: a model summary with the PreCompact / PostCompact hooks around it).

Each step records what it did in the session's JSONL and adds its typed event
(``protocol.turn_events``) to the turn's list; :class:`Compression` is one full compression as
the pipeline saw it, turned into the ``session.compress`` reply by :meth:`Compression.reply`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from qwenctxd.compaction import hooks as hooks_mod
from qwenctxd.compaction import micro, post_compact
from qwenctxd.compaction.thresholds import compute_thresholds as _compute_thresholds
from qwenctxd.compaction.thresholds import level
from qwenctxd.config.schema import Settings
from qwenctxd.events import EventBus
from qwenctxd.instructions.service import InstructionsService
from qwenctxd.model import ModelClient
from qwenctxd.protocol import session as wire
from qwenctxd.protocol import turn_events as ev
from qwenctxd.sessions.agent_request import system_prompt
from qwenctxd.sessions.state import Session, SessionTable
from qwenctxd.sessions.store import SessionStore
from qwenctxd.tokens import history_tokens, system_tokens

log = structlog.get_logger("qwenctxd.turns")
compute_thresholds = functools.lru_cache(maxsize=256)(_compute_thresholds)  # same per session
Events = list[ev.Event]  # a turn's events, typed until the reply is built (ev.to_wire)


@dataclass
class Compression:
    """One full compression as the pipeline saw it: the figures of the reply, the events
    (hooks, then compressed or compression_failed) and, for a failure, its cause."""

    status: str
    tokens_before: int
    tokens_after: int
    events: Events = field(default_factory=list)
    cause: str | None = None

    def reply(self) -> wire.CompressResult:
        return wire.CompressResult(status=self.status, tokens_before=self.tokens_before,
                                   tokens_after=self.tokens_after, events=ev.to_wire(self.events))


class Compactor:
    """The compaction triggers of a turn and ``session.compress``: ``sessions`` the open
    sessions by id, ``store`` records what each step did, ``instructions`` gives the settings
    and the system prompt, ``model`` summarises, ``bus`` hears of each compression."""

    def __init__(self, *, sessions: SessionTable, store: SessionStore,
                 instructions: InstructionsService, model: Callable[[], ModelClient],
                 bus: EventBus) -> None:
        self.sessions = sessions
        self.store = store
        self.instructions = instructions
        self._model = model
        self.bus = bus

    @staticmethod
    def settings(s: Session) -> Settings:
        return s.project.settings

    async def maybe_micro(self, s: Session, events: Events, sys_tok: int) -> None:
        """The idle and size micro-compaction of a turn, when one of them is due."""
        keep = self.settings(s).context.clear_context_on_idle.tool_results_num_to_keep
        self.micro_compact(s, events, trigger=None, keep=keep)

    def micro_compact(self, s: Session, events: Events, *, trigger: str | None, keep: int,
                      strip_reasoning: bool = False) -> int:
        """Clear old tool output for ``trigger`` (None: the automatic check, idle or size when
        one is due), record it, add its event; the tokens saved (0: nothing changed)."""
        history = s.history
        if trigger is None:
            idle = self.settings(s).context.clear_context_on_idle
            r = micro.micro_compact_if_due(
                history.messages, now=time.time(),  # type: ignore[arg-type]
                last_model_reply_at=s.last_model_reply_at,
                idle_minutes=idle.tool_results_threshold_minutes, tool_chars=history.tool_chars,
                size_threshold=idle.tool_results_total_chars_threshold, keep=keep,
                image_tokens=history.image_tokens)
        else:
            r = micro.micro_compact(history.messages, keep=keep, trigger=trigger,  # type: ignore[arg-type]
                                    strip_reasoning=strip_reasoning,
                                    image_tokens=history.image_tokens)
        if r is None or not r.changed:
            return 0
        s.replace_history(r.messages, keep_anchor_delta=r.tokens_saved)
        self.store.record(s, {}, subtype="micro_compaction", payload={
            "trigger": r.trigger, "cleared": r.cleared, "tokensSaved": r.tokens_saved,
            "compressedHistory": r.messages})
        events.append(ev.MicroCompacted(trigger=str(r.trigger), cleared=r.cleared, kept=r.kept,
                                        tokens_saved=r.tokens_saved,
                                        evicted_read_paths=r.evicted_read_paths,
                                        unresolved_evicted_reads=r.unresolved_evicted_reads))
        return r.tokens_saved

    async def maybe_compress(self, s: Session, events: Events, sys_tok: int) -> None:
        cfg = self.settings(s).model.chat_compression
        tokens, _ = s.estimate(sys_tok)
        th = compute_thresholds(s.options.window_tokens, s.options.auto_compact_threshold)
        lvl = level(tokens, th)
        reason: str | None = None
        forced = False
        if cfg.enable_screenshot_trigger and s.compaction.tool_images >= cfg.screenshot_trigger_threshold:
            reason = "image_overflow"
        if lvl == "hard":
            reason, forced = "hard", True
        elif lvl == "auto" and reason is None:
            reason = "auto"
        if reason is None:
            return
        if not forced and not s.compaction.breaker.allow(False):
            events.append(ev.CompressionSkipped(reason="breaker_open", level=lvl, tokens=tokens))
            return
        result = await self.compress(s, trigger="auto", focus=None, sys_tok=sys_tok,
                                     reason=reason, forced=forced)
        events.extend(result.events)
        if reason == "image_overflow" and result.status == "compressed":
            s.compaction.tool_images = 0
        if forced and result.status != "compressed":
            # the window is about to overflow and no summary came: shed tool output instead
            keep = self.settings(s).context.clear_context_on_idle.tool_results_num_to_keep
            saved = self.micro_compact(s, events, trigger="force", keep=max(1, min(keep, 2)),
                                       strip_reasoning=True)
            events.append(ev.HardFallback(tokens_saved=saved))
        elif result.status not in ("compressed", "noop"):
            # the summary failed (its deadline passed, the endpoint failed, the output was
            # unusable): the turn goes on with micro-compaction instead, and says so
            keep = self.settings(s).context.clear_context_on_idle.tool_results_num_to_keep
            saved = self.micro_compact(s, events, trigger="force", keep=keep)
            events.append(ev.CompressionFallback(fallback="micro_compaction", status=result.status,
                                                 cause=result.cause, tokens_saved=saved))

    async def compress_now(self, p: wire.CompressParams) -> wire.CompressResult:
        """``session.compress``: ``fast`` clears old tool output at once (forced
        micro-compaction, reasoning stripped); ``full`` summarises the history with the model."""
        s = self.sessions.session(p.session_id)
        async with s.lock:
            sp = await system_prompt(self.instructions, s)
            sys_tok = system_tokens(sp.text, s.options.tools)
            if p.mode != "fast":
                compression = await self.compress(s, trigger="manual", focus=p.instructions,
                                                  sys_tok=sys_tok, reason="manual", forced=True)
                return compression.reply()
            before, _ = s.estimate(sys_tok)
            events: Events = []
            keep = self.settings(s).context.clear_context_on_idle.tool_results_num_to_keep
            saved = self.micro_compact(s, events, trigger="force", keep=keep, strip_reasoning=True)
            after, _ = s.estimate(sys_tok)
            return Compression(status="compressed" if saved else "noop", tokens_before=before,
                               tokens_after=after, events=events).reply()

    async def compress(self, s: Session, *, trigger: str, focus: str | None, sys_tok: int,
                       reason: str, forced: bool) -> Compression:
        before_total, _ = s.estimate(sys_tok)
        history_before = before_total - sys_tok
        settings = self.settings(s)
        hook_cfg = settings.hooks

        async def pre_hook() -> hooks_mod.HookRun:
            return await hooks_mod.run_pre_compact(
                hook_cfg, trigger=trigger, session_id=s.id, cwd=str(s.cwd),
                transcript_path=str(s.path), custom_instructions=focus)

        async def post_hook(summary: str) -> hooks_mod.HookRun:
            return await hooks_mod.run_post_compact(
                hook_cfg, trigger=trigger, session_id=s.id, cwd=str(s.cwd), summary=summary,
                transcript_path=str(s.path))

        result = await post_compact.compress(
            self._model(), s.history.messages, trigger=trigger, focus=focus,
            workspace_root=s.project.anchor, tokens_before=history_before,
            estimate_history=lambda h: history_tokens(h, image_tokens=s.history.image_tokens),
            pre_hook=pre_hook if hook_cfg.get("PreCompact") else None,
            post_hook=post_hook if hook_cfg.get("PostCompact") else None,
            file_tools=s.options.restoration_tools(),
            touched_paths=list(s.deliveries.touched),
            max_files=settings.model.chat_compression.max_recent_files_to_retain,
            max_images=settings.model.chat_compression.max_recent_images_to_retain,
        )
        events: Events = list(result.hook_events)
        if result.status == "compressed":
            s.replace_history(result.history)
            s.compaction.breaker.record(True)
            self.store.record(s, {}, subtype="chat_compression", payload={
                "info": {"status": result.status, "trigger": trigger, "reason": reason,
                         "originalTokenCount": before_total,
                         "newTokenCount": sys_tok + result.tokens_after},
                "compressedHistory": result.history})
            after = sys_tok + result.tokens_after
            done = ev.Compressed(status=result.status, trigger=trigger, reason=reason,
                                 tokens_before=before_total, tokens_after=after)
            events.append(done)
            self.bus.publish("session/compressed",
                               {"session_id": s.id, **ev.to_wire([done])[0]})
        else:
            s.compaction.breaker.record(False)
            after = before_total
            events.append(ev.CompressionFailed(status=result.status, trigger=trigger,
                                               reason=reason, cause=result.error))
        log.info("compression", session=s.id, status=result.status, trigger=trigger,
                 reason=reason, cause=result.error, before=before_total, after=after)
        return Compression(status=result.status, tokens_before=before_total, tokens_after=after,
                           events=events,
                           cause=None if result.status == "compressed" else result.error)

