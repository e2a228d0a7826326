"""The turn pipeline: append → triggers (micro / full compaction) → reminders → AssembledPrompt.

``session.turn`` appends the user input or tool results, runs the compaction checks in the
order SPEC §S3 gives (image overflow, hard, auto, warn; idle and size micro-compaction first),
delivers reminders inside the new messages (so they stay in history and the message prefix
stays cache-stable), and returns a prompt whose ``system + tools + messages`` are a valid
chat-completions body. ``session.record_model`` appends the reply and re-anchors the token
count on the API's figure. The turn's new messages come from ``sessions.incoming``; the
compaction steps and ``session.compress`` live in ``sessions.compacting``; a turn's events are
typed (``protocol.turn_events``) until the reply is built.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog

from qwenctxd.compaction.thresholds import context_left_pct, level
from qwenctxd.config.schema import Settings
from qwenctxd.events import EventBus
from qwenctxd.instructions.rules import relative_to_root, rule_reminder
from qwenctxd.instructions.service import InstructionsService
from qwenctxd.memory.outbound import render_outbound as render_memories
from qwenctxd.memory.service import MemoryService
from qwenctxd.model import ModelClient
from qwenctxd.model.scheduler import shares_local_server
from qwenctxd.protocol import errors
from qwenctxd.protocol import session as wire
from qwenctxd.protocol import turn_events as ev
from qwenctxd.protocol.instructions import prefix_hash
from qwenctxd.sessions import records
from qwenctxd.sessions.agent_request import begin_foreground, end_foreground, system_prompt
from qwenctxd.sessions.compacting import Compactor, Events, compute_thresholds
from qwenctxd.sessions.environment import EnvironmentReminders
from qwenctxd.sessions.incoming import incoming_messages
from qwenctxd.sessions.state import REASONING_KEYS, Session, SessionTable
from qwenctxd.sessions.store import SessionStore
from qwenctxd.sessions.titles import auto_title
from qwenctxd.skills import listing
from qwenctxd.skills.service import SkillsService
from qwenctxd.tasks import TaskRegistry
from qwenctxd.tokens import system_tokens

log = structlog.get_logger("qwenctxd.turns")
MAX_TOUCHED = 2000
#: the longest a user turn waits for its recall's lexical answer (it is under a millisecond;
#: this bounds a stalled SQLite thread, not the normal case)
LEXICAL_WAIT_S = 0.05
EXTENSION_FIELDS = ("is_error",)  # kept in history for micro-compaction, never sent


class TurnPipeline:
    """``session.turn``, ``session.record_model``, ``session.rewind`` and ``session.compress``
    over the collaborators each step needs: ``sessions`` the open sessions by id, ``store``
    records and indexes, the instructions, skills and memory services give the reminders and
    the system prompt, ``model`` is the daemon's model client (its scheduler, its side-query
    endpoint), ``tasks`` runs the memory prefetch, ``bus`` hears of usage warnings and
    ``compactor`` runs the compaction triggers. ``user_turn_hooks`` run when a user turn
    begins (what it interrupts: dream, speculation); ``turn_complete_hooks`` after a completed
    user turn (background work, reported as ``scheduled``)."""

    def __init__(
        self,
        *,
        sessions: SessionTable,
        store: SessionStore,
        instructions: InstructionsService,
        model: Callable[[], ModelClient],
        tasks: TaskRegistry,
        bus: EventBus,
        compactor: Compactor,
        skills: SkillsService | None = None,
        memory: MemoryService | None = None,
        user_turn_hooks: Sequence[Callable[[Session], None]] = (),
        turn_complete_hooks: Sequence[Callable[[Session], list[str]]] = (),
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.instructions = instructions
        self._model = model
        self.tasks = tasks
        self.bus = bus
        self.compaction = compactor
        self.skills = skills
        self.memory = memory
        self.user_turn_hooks = tuple(user_turn_hooks)
        self.turn_complete_hooks = tuple(turn_complete_hooks)
        self._prefix: dict[tuple[str, int], str] = {}
        #: a new session's date, OS, cwd and folder tree (shared by sessions starting together)
        self.environments = EnvironmentReminders(tasks)

    # -- session.turn ---------------------------------------------------------------------------
    async def turn(self, p: wire.TurnParams) -> wire.AssembledPrompt:
        s = self.sessions.session(p.session_id)
        if p.known is not None and p.known.count < 0:
            raise errors.InvalidParams("known.count must be 0 or more",
                                       data={"field": "known.count", "message": "negative"})
        async with s.lock:
            events: Events = []
            reminders: list[wire.Reminder] = []
            first_turn = not s.history.messages and p.kind == "user"
            turn_at = len(s.history.messages)
            before = s.deliveries.snapshot() if p.kind == "user" else None
            new_msgs, merged_into = incoming_messages(s, p, events)
            if before is not None and merged_into is None:
                s.mark_deliveries(turn_at, before)
            if p.kind == "user" and s.title is None and p.text:
                title = auto_title(p.text)
                if title is not None:
                    self.store.record_title(s, title, source="auto")
            if p.kind == "user":
                for hook in self.user_turn_hooks:
                    hook(s)
            if p.kind == "user" and p.text:
                self._start_prefetch(s, p.text, p.active_tools or [])
            reminders.extend(await self._skill_reminders(s, p.touched_paths or []))
            if first_turn:  # date, OS, cwd, folder tree: once, into history (Qwen Code's order)
                text = await self.environments.get(s.cwd)
                reminders.append(wire.Reminder(kind="environment", text=text))
            reminders.extend(await self._rule_reminders(s, p.touched_paths or []))
            memory = await self._take_prefetch(s, wait=p.kind == "user")
            if memory is not None:
                # the user turn carries it first (unshift); a later tool-results turn at the end
                if p.kind == "user":
                    reminders.insert(0, memory)
                else:
                    reminders.append(memory)
            self._attach_reminders(s, p.kind, new_msgs, reminders)
            for msg in new_msgs:
                if merged_into is not None and msg is new_msgs[-1]:
                    # recorded as the delta (Qwen Code's mid-turn user message: resume appends
                    # its parts to the user message before); held as the whole merged message
                    self.store.record(s, msg, subtype=records.SUBTYPE_MID_TURN)
                    s.append(records.merged_user(merged_into, msg))
                    continue
                s.append(msg)
                self.store.record(s, msg)
            sp = await system_prompt(self.instructions, s)
            sys_tok = system_tokens(sp.text, s.options.tools)
            await self.compaction.maybe_micro(s, events, sys_tok)
            await self.compaction.maybe_compress(s, events, sys_tok)
            prompt = self._assemble(s, sp.text, sp.prefix_hash, sys_tok, reminders, events,
                                    known=p.known)
            begin_foreground(self._model(), s)  # the agent's request goes out now: side queries yield
            return prompt

    async def _rule_reminders(self, s: Session, touched: list[str]) -> list[wire.Reminder]:
        if not touched:
            return []
        inst = await self.instructions.instruction_set(s.project, s.cwd)
        root = inst.project_root or s.cwd
        out = []
        for rule in inst.rules.conditional:
            key = str(rule.path)
            if key in s.deliveries.delivered_rules:
                continue
            for raw in touched:
                rel = relative_to_root(raw if raw.startswith("/") else s.cwd / raw, root)
                if rel is not None and rule.matches(rel):
                    s.deliveries.delivered_rules.add(key)
                    out.append(wire.Reminder(kind="rule",
                                             text=rule_reminder(rule.path, root, rule.body)))
                    break
        return out

    # -- memory prefetch ---------------------------------------------------------------------------
    def _start_prefetch(self, s: Session, query: str, active_tools: list[str]) -> None:
        memory = self.memory
        tasks = self.tasks
        d = s.deliveries
        if d.prefetch is not None:
            old = d.prefetch
            if not d.prefetch_delivered and old.outcome is not None and old.result is not None \
                    and old.outcome.value == "completed":
                d.carried = [doc for doc in old.result.docs if str(doc.path) not in d.surfaced]
            tasks.cancel(old)  # a newer user turn supersedes the old recall
            d.prefetch = None
        if memory is None or not tasks.accepting or not memory.enabled(s.project):
            return
        exclude = sorted(d.surfaced)
        answered = anyio.Event()  # the lexical answer exists, or the recall is over
        early: dict[str, Any] = {"answered": answered}

        def on_fused(outcome: Any) -> None:
            early["outcome"] = outcome
            answered.set()

        use_selector = self._selector_on(s)
        # the turn waits for the lexical answer only (no prefetchGraceMs): the query's
        # embedding then runs below the daemon's priority, after the turns being served
        background = self._settings(s).memory.prefetch_grace_ms == 0

        async def recall() -> Any:
            try:
                return await memory.recall(s.project, query, active_tools=active_tools,
                                           exclude=exclude, use_selector=use_selector,
                                           on_fused=on_fused, background=background)
            finally:
                answered.set()

        d.prefetch_early = early
        d.prefetch = tasks.submit("recall", recall, project=str(s.project.anchor),
                                  description=f"memory recall for session {s.id[:8]}")
        d.prefetch_delivered = False

    def _selector_on(self, s: Session) -> bool:
        """Whether this turn's recall asks the model selector: ``memory.recallSelector`` "on"
        or "off"; "auto" (the default) is off when the side-query endpoint is the local server
        the session's own agent talks to (one slot: the selector would only delay the user)."""
        mode = self._settings(s).memory.recall_selector
        if mode != "auto":
            return mode == "on"
        return not shares_local_server(s.model_base_url, self._model().endpoint.base_url)

    async def _take_prefetch(self, s: Session, *, wait: bool) -> wire.Reminder | None:
        """The memory reminder of this turn: the best recall answer available — the whole
        recall's when it has settled, else the lexical tier's (never worse with a model than
        without) — and on later turns what the semantic tier and the selector found beyond it.

        A user turn waits for the lexical answer only (SQLite FTS in this process, under a
        millisecond; at most :data:`LEXICAL_WAIT_S`), never for the embedding worker or the
        model selector, unless ``memory.prefetchGraceMs`` asks it to wait that long for the
        whole recall."""
        d = s.deliveries
        rec = d.prefetch
        docs: list[Any] = []
        if wait and d.carried:
            docs, d.carried = list(d.carried), []
        if rec is not None and not d.prefetch_delivered:
            if wait and rec.outcome is None:
                grace = self._settings(s).memory.prefetch_grace_ms / 1000
                answered = d.prefetch_early.get("answered")
                if grace > 0 or answered is None:
                    with anyio.move_on_after(grace):
                        await rec.done.wait()
                else:
                    with anyio.move_on_after(LEXICAL_WAIT_S):
                        await answered.wait()
            if rec.outcome is None:
                early = d.prefetch_early.get("outcome")
                if wait and early is not None and not d.prefetch_early.get("delivered"):
                    d.prefetch_early["delivered"] = True  # the selector, still out, refines later
                    docs.extend(early.docs)
            else:
                d.prefetch_delivered = True
                result = rec.result
                if rec.outcome.value == "completed" and result is not None:
                    docs.extend(result.docs)
        fresh: list[Any] = []
        for doc in docs:
            key = str(doc.path)
            if key not in d.surfaced:
                d.surfaced.add(key)
                fresh.append(doc)
        if not fresh:
            return None
        return wire.Reminder(kind="memory",
                             text=f"<system-reminder>\n{render_memories(fresh)}\n</system-reminder>")

    async def _skill_reminders(self, s: Session, touched: list[str]) -> list[wire.Reminder]:
        skills = self.skills
        if skills is None:
            return []
        ss, generation = await skills.skillset(s.project, s.cwd)
        root = s.project.anchor
        fresh = []
        for raw in touched:
            rel = relative_to_root(raw if raw.startswith("/") else s.cwd / raw, root)
            if rel is not None and rel not in s.deliveries.touched:
                fresh.append(rel)
                s.deliveries.touched[rel] = None
                if len(s.deliveries.touched) > MAX_TOUCHED:
                    s.deliveries.touched.pop(next(iter(s.deliveries.touched)))
        candidates = fresh
        if generation != s.deliveries.skills_generation:  # a refresh resets activation: re-match
            s.deliveries.skills_generation = generation
            s.deliveries.skills_activated = set()
            candidates = list(s.deliveries.touched)
        for skill in ss.skills.values():
            if skill.conditional and skill.name not in s.deliveries.skills_activated and any(
                    skill.matches(rel) for rel in candidates):
                s.deliveries.skills_activated.add(skill.name)
        shown = listing.visible(ss, s.deliveries.skills_activated)
        names = {k.name for k in shown}
        if s.deliveries.skills_delivered is None:
            text, _rendered = listing.render_snapshot(shown)
            s.deliveries.skills_delivered = names  # left-out ones stay listed by skills.list, not re-sent
            return [wire.Reminder(kind="skills", text=text)]
        added = [k for k in shown if k.name not in s.deliveries.skills_delivered]
        removed = sorted(s.deliveries.skills_delivered - names)
        s.deliveries.skills_delivered = names
        text = listing.render_delta([k for k in added if not k.conditional], removed,
                                    [k for k in added if k.conditional])
        return [wire.Reminder(kind="skills_delta", text=text)] if text else []

    @staticmethod
    def _attach_reminders(s: Session, kind: str, new_msgs: list[dict[str, Any]],
                          reminders: list[wire.Reminder]) -> None:
        if not reminders:
            return
        parts = [{"type": "text", "text": r.text} for r in reminders]
        last = new_msgs[-1] if new_msgs else None
        if last is not None and last.get("role") == "user":
            content = last["content"]
            body = [{"type": "text", "text": content}] if isinstance(content, str) else content
            last["content"] = parts + body  # unshift: reminders before the user's words
        else:
            new_msgs.append({"role": "user", "content": parts})  # after tool results

    # -- compaction --------------------------------------------------------------------------------
    @staticmethod
    def _settings(s: Session) -> Settings:
        return s.project.settings

    async def compress_now(self, p: wire.CompressParams) -> wire.CompressResult:
        """``session.compress`` (see :meth:`Compactor.compress_now`)."""
        return await self.compaction.compress_now(p)

    # -- the prompt -------------------------------------------------------------------------------
    def _assemble(self, s: Session, system: str, sys_hash: str, sys_tok: int,
                  reminders: list[wire.Reminder], events: Events,
                  known: wire.KnownHistory | None = None) -> wire.AssembledPrompt:
        tokens, anchored = s.estimate(sys_tok)
        s.usage.prompt_tokens = tokens
        s.usage.last_system_tokens = sys_tok
        th = compute_thresholds(s.options.window_tokens, s.options.auto_compact_threshold)
        lvl = level(tokens, th)
        usage = wire.Usage(prompt_tokens=tokens, window_tokens=s.options.window_tokens,
                           thresholds=wire.Thresholds(warn=th.warn, auto=th.auto, hard=th.hard),
                           level=lvl, context_left_pct=context_left_pct(tokens, s.options.window_tokens),
                           anchored=anchored)
        if lvl != "ok":
            events.append(ev.UsageWarning(level=lvl, prompt_tokens=tokens))
            self.bus.publish("session/usage", {"session_id": s.id, "prompt_tokens": tokens,
                                               "window_tokens": s.options.window_tokens, "level": lvl})
        s.compaction.last_level = lvl
        key = (sys_hash, id(s.options.tools))
        phash = self._prefix.get(key)
        if phash is None:
            phash = prefix_hash(system, s.options.tools)
            if len(self._prefix) > 1024:
                self._prefix.clear()
            self._prefix[key] = phash
        self.store.schedule_touch(s)
        keep = s.options.keep_reasoning
        start = (s.history.reply_start(keep, known.epoch, known.count) if known is not None
                 else s.history.reply_start(keep))
        if s.history.ext_count or (s.history.reasoning_count and s.options.keep_reasoning != "all"):
            messages = wire_messages(s.history.messages, s.options.keep_reasoning, start=start,
                                     cut=s.history.last_user if s.history.last_user > 0 else 0)
        else:
            messages = s.history.messages[start:]
        return wire.AssembledPrompt(system=system, messages=messages,
                                    tools=s.options.tools, reminders=reminders, usage=usage,
                                    events=ev.to_wire(events), prefix_hash=phash, session_id=s.id,
                                    epoch=s.history.epoch, messages_from=start)

    # -- session.record_model ----------------------------------------------------------------------
    async def record_model(self, p: wire.RecordModelParams) -> wire.RecordModelResult:
        s = self.sessions.session(p.session_id)
        end_foreground(self._model(), s)
        async with s.lock:
            msg = dict(p.message)
            if msg.get("role") != "assistant":
                raise errors.InvalidParams("message.role must be \"assistant\"",
                                           data={"field": "message.role", "message": "not assistant"})
            if s.history.messages and s.history.messages[-1].get("role") == "assistant":
                raise errors.InvalidParams(
                    "a model reply must follow a turn (the last message is already a reply)",
                    data={"field": "message", "message": "reply without a turn"})
            calls = msg.get("tool_calls") or []
            for i, c in enumerate(calls):
                if not isinstance(c, dict) or not c.get("id") or not isinstance(
                        c.get("function"), dict) or not c["function"].get("name"):
                    raise errors.InvalidParams(
                        f"message.tool_calls[{i}] needs an id and function.name",
                        data={"field": f"message.tool_calls[{i}]", "message": "malformed"})
                c.setdefault("type", "function")
            if msg.get("content") is None:
                msg["content"] = ""  # C4: never content null, also when it only carries calls
            if calls and self.memory is not None:
                from qwenctxd.agents.extraction import wrote_memory

                roots = self.memory.roots(s.project)
                if wrote_memory(msg, [r for r in (roots.project, roots.user) if r]):
                    s.turn.wrote_memory()
            s.append(msg)
            usage = None
            if p.usage is not None:
                usage = {"prompt_tokens": p.usage.prompt_tokens,
                         "completion_tokens": p.usage.completion_tokens}
                sys_tok = s.usage.last_system_tokens
                if sys_tok is None:
                    sp = await system_prompt(self.instructions, s)
                    sys_tok = system_tokens(sp.text, s.options.tools)
                s.set_anchor(p.usage.prompt_tokens, p.usage.completion_tokens, sys_tok)
            self.store.record(s, msg, usage=usage)
            answered = await self._answer_own_calls(s, calls)
            s.last_model_reply_at = time.time()
            complete = not calls
            scheduled: list[str] = []
            if complete and s.turn.finish_user_turn():
                for hook in self.turn_complete_hooks:
                    scheduled.extend(hook(s))
            self.store.schedule_touch(s)
            return wire.RecordModelResult(turn_complete=complete, scheduled=scheduled,
                                          answered=answered)

    async def _answer_own_calls(self, s: Session, calls: list[dict[str, Any]]
                                ) -> list[wire.AnsweredCall]:
        """Answer the reply's calls to the daemon's own ``skill`` tool (as ``skills.load``)."""
        if not s.options.own_skill:
            return []
        out: list[wire.AnsweredCall] = []
        for c in calls:
            if c["function"].get("name") != listing.SKILL_NAME:
                continue
            content, is_error = await self._load_skill(s, c["function"].get("arguments"))
            msg: dict[str, Any] = {"role": "tool", "tool_call_id": c["id"],
                                   "name": listing.SKILL_NAME, "content": content}
            if is_error:
                msg["is_error"] = True
            s.append(msg)
            self.store.record(s, msg)
            s.turn.answered_by_daemon(c["id"], limit=MAX_TOUCHED)
            out.append(wire.AnsweredCall(tool_call_id=c["id"], name=listing.SKILL_NAME,
                                         content=content))
        return out

    async def _load_skill(self, s: Session, raw_args: Any) -> tuple[str, bool]:
        args = raw_args
        if isinstance(raw_args, str):
            try:
                args = json.loads(raw_args) if raw_args.strip() else {}
            except ValueError:
                return "Error: the skill call's arguments are not valid JSON.", True
        name = args.get("skill") if isinstance(args, dict) else None
        if not isinstance(name, str) or not name.strip():
            return "Error: the skill tool needs a `skill` argument naming a listed skill.", True
        skills = self.skills
        if skills is None:
            return "Error: skills are not available in this session.", True
        ss, _gen = await skills.skillset(s.project, s.cwd)
        skill = ss.skills.get(name.strip())
        if skill is None:
            known = ", ".join(sorted(ss.skills)) or "none"
            return f"Error: no skill named {name.strip()!r}. Available skills: {known}.", True
        s.deliveries.skills_used.add(skill.name)
        text = listing.load_text(skill)
        extra = args.get("args") if isinstance(args, dict) else None
        if isinstance(extra, str) and extra.strip():
            text += f"\nARGUMENTS: {extra.strip()}\n"
        return text, False

    # -- session.rewind ----------------------------------------------------------------------------
    async def rewind(self, p: wire.RewindParams) -> wire.RewindResult:
        s = self.sessions.session(p.session_id)
        async with s.lock:
            if p.turns < 1:
                raise errors.InvalidParams("turns must be at least 1",
                                           data={"field": "turns", "message": "below 1"})
            starts = s.history.user_turn_starts()
            if p.turns > len(starts):
                raise errors.InvalidParams(
                    f"turns {p.turns} is more than the {len(starts)} user turns in the history",
                    data={"field": "turns", "message": "more than the history",
                          "turns_available": len(starts)})
            cut = starts[-p.turns]
            removed = len(s.history.messages) - cut
            while len(s.history.messages) > cut:
                s.pop_last()
            s.rewind_deliveries(cut)
            s.turn.rewound()
            self.store.record(s, {}, subtype=records.SUBTYPE_REWIND, payload={
                "reason": "rewind", "turns": p.turns, "removedMessages": removed,
                "compressedHistory": s.history.messages})
            self.store.schedule_touch(s)
            log.info("rewind", session=s.id, turns=p.turns, removed=removed)
            return wire.RewindResult(removed_messages=removed, messages=len(s.history.messages))


def wire_messages(messages: list[dict[str, Any]], keep_reasoning: str = "all", *,
                  start: int = 0, cut: int | None = None) -> list[dict[str, Any]]:
    """The history from ``start`` on as POSTed: our extension fields removed, and reasoning
    fields kept only as ``keep_reasoning`` says (C4: "current_turn" keeps them after the latest
    user message only, at ``cut`` when the caller knows it; only the changed messages are
    copied)."""
    if keep_reasoning == "current_turn":
        if cut is None:
            cut = next((i for i in range(len(messages) - 1, -1, -1)
                        if messages[i].get("role") == "user"), 0)
    elif keep_reasoning == "all":
        cut = 0
    else:
        cut = len(messages)  # reasoning is dropped before this index
    out = []
    for i in range(start, len(messages)):
        m = messages[i]
        if "is_error" in m:
            m = {k: v for k, v in m.items() if k not in EXTENSION_FIELDS}
        if i < cut and m.get("role") == "assistant" and any(k in m for k in REASONING_KEYS):
            m = {k: v for k, v in m.items() if k not in REASONING_KEYS}
        out.append(m)
    return out
