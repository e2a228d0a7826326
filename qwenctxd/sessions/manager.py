"""SessionManager: the table of open sessions — open, resume, list, recap, summarise, delete
and close them, and close idle ones.

Sessions live in the daemon, not in a connection: any client may continue a session by id, and
a session survives its client disconnecting. How a session is persisted (its JSONL, the fsync
policy, the index) is :class:`~qwenctxd.sessions.store.SessionStore`'s; the turn pipeline lives
in ``sessions.turns``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.compaction import recap as recap_mod
from qwenctxd.config import ConfigStore
from qwenctxd.instructions import tool_roles
from qwenctxd.instructions.service import InstructionsService
from qwenctxd.model import ModelClient
from qwenctxd.project import Project
from qwenctxd.protocol import errors
from qwenctxd.protocol import session as wire
from qwenctxd.sessions import agent_request, records, titles
from qwenctxd.sessions.state import History, Session, SessionOptions, SessionTable
from qwenctxd.sessions.store import SessionStore
from qwenctxd.sessions.window import session_window
from qwenctxd.skills.listing import SKILL_NAME, SKILL_TOOL
from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.sessions")
PROJECT_SUMMARY_NAME = "PROJECT_SUMMARY.md"
KEEP_REASONING = ("none", "current_turn", "all")


class SessionManager:
    def __init__(
        self,
        *,
        config: ConfigStore,
        instructions: InstructionsService,
        model: Callable[[], ModelClient],
        tasks: TaskRegistry,
        store: SessionStore,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.instructions = instructions
        self._model = model
        self.tasks = tasks
        self.store = store
        self.sessions = SessionTable()
        self._environ = environ if environ is not None else os.environ
        self._opened_at: dict[str, float] = {}  # wall time each session was opened here

    @property
    def model(self) -> ModelClient:
        return self._model()

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.start()

    async def aclose(self) -> None:
        for s in list(self.sessions.values()):
            self.store.close_writer(s)
        self.sessions.clear()
        await self.store.aclose()

    def get(self, session_id: str) -> Session:
        return self.sessions.session(session_id)

    # -- open / resume ------------------------------------------------------------------------
    async def open(self, project: Project, cwd: Path, p: wire.OpenParams) -> wire.OpenResult:
        """Open (or resume, or join) a session in ``cwd``; ``project`` is ``cwd``'s, resolved
        at the wire edge, and stays on the session."""
        if p.session_id and p.session_id in self.sessions:
            s = self.sessions[p.session_id]  # another client continues the same session
            self._opened_at[s.id] = time.time()
            if p.model_base_url is not None:
                s.model_base_url = p.model_base_url
            tokens = s.usage.prompt_tokens or s.estimate(0)[0]
            return wire.OpenResult(session_id=s.id, resumed=True, messages=len(s.history.messages),
                                   prompt_tokens=tokens, window_tokens=s.options.window_tokens,
                                   window_source=s.options.window_source, path=str(s.path))
        if p.session_id is not None:
            checked_id(p.session_id)
        settings = project.settings
        session_id = p.session_id or str(uuid.uuid4())
        path = records.session_path(cwd, session_id)
        files = await self.store.open_files(
            session_id, cwd, path, find=bool(p.resume or p.session_id),
            must_exist=bool(p.resume), qwen_home=project.qwen_home)
        if files is None:
            raise errors.SessionNotFound(f"no recorded session {session_id}",
                                         data={"session_id": session_id})
        path, state, writer = files.path, files.state, files.writer
        resumed = state is not None
        try:
            saved = (state.options or {}) if state is not None else {}
            window, window_source = session_window(p.window_tokens, p.window_source, saved, settings)
            pct = (p.auto_compact_threshold or _float(saved.get("autoCompactThreshold"))
                   or settings.context.auto_compact_threshold)
            env = dict(p.env or {})
            client_tools = p.tools if p.tools is not None else _tools(saved.get("tools"))
            agent = ({"name": p.agent.name, **({"version": p.agent.version} if p.agent.version
                                                else {})} if p.agent is not None
                     else _agent(saved.get("agent")))
            keep = p.keep_reasoning or saved.get("keepReasoning")
            keep = keep if keep in KEEP_REASONING else "current_turn"
            tools = with_skill_tool(client_tools)
            opts = SessionOptions(
                window_tokens=window, window_source=window_source, auto_compact_threshold=pct,
                tools=tools,
                tool_roles=tool_roles.classify(tools), agent=agent, keep_reasoning=keep,
                own_skill=not any(tool_roles.tool_name(t) == SKILL_NAME for t in client_tools))
            s = Session(
                id=session_id, cwd=cwd, project=project, model=p.model, options=opts, env=env,
                path=path, model_base_url=p.model_base_url,
                writer=writer,
                history=History(image_tokens=int(self._environ.get("QWEN_IMAGE_TOKEN_ESTIMATE", 0))
                                or settings.model.chat_compression.image_token_estimate),
            )
            options = {"windowTokens": window, "windowSource": window_source, "tools": client_tools,
                       "agent": agent, "keepReasoning": keep, "autoCompactThreshold": pct}
            if options != saved:
                self.store.record(s, {}, subtype=records.SUBTYPE_OPTIONS, payload=options)
            warnings: list[str] = []
            torn: list[int] = []
            if state is not None:
                s.replace_history(state.messages)
                self.store.resumed(s, state.messages)
                s.title = state.title
                s.started_at = records.parse_time(state.started_at) or s.started_at
                s.updated_at = records.parse_time(state.updated_at) or s.updated_at
                if state.last_usage and state.anchor_index is not None:
                    from qwenctxd.sessions.state import Anchor

                    u = state.last_usage
                    s.usage.anchor = Anchor(total=int(u.get("prompt_tokens", 0))
                                      + int(u.get("completion_tokens", 0)),
                                      index=state.anchor_index, system_tokens=0)
                torn = [t.line_no for t in state.torn]
                for t in state.torn:
                    warnings.append(f"skipped unreadable line {t.line_no} of {path.name}: {t.reason}")
            from qwenctxd.sessions import shared_file

            warnings.extend(shared_file.held_warning(h) for h in files.holders)
            s.git_snapshot = await self.instructions.git_snapshot(project)
            self.sessions[session_id] = s
        except BaseException:  # not registered: nobody else would close it
            writer.close()
            raise
        self._opened_at[session_id] = time.time()
        sp = await self.system_prompt(s)
        from qwenctxd.tokens import system_tokens

        sys_tok = system_tokens(sp.text, s.options.tools)
        if s.usage.anchor is not None and s.usage.anchor.system_tokens == 0:
            s.usage.anchor.system_tokens = sys_tok
        tokens, _ = s.estimate(sys_tok)
        s.usage.prompt_tokens = tokens
        if not resumed:  # its index row: written by the project's next index batch
            self.store.schedule_touch(s, new=True)
        log.info("session opened", session=session_id, resumed=resumed, messages=len(s.history.messages),
                 torn=len(torn))
        return wire.OpenResult(session_id=session_id, resumed=resumed, messages=len(s.history.messages),
                               prompt_tokens=tokens, window_tokens=window,
                               window_source=window_source, path=str(path),
                               torn_lines=torn, warnings=warnings)

    async def system_prompt(self, s: Session) -> Any:
        """The system prompt of ``s`` (see :func:`agent_request.system_prompt`)."""
        return await agent_request.system_prompt(self.instructions, s)

    # -- list / recap / summary / delete / close ----------------------------------------------
    async def list(self, cwd: Path | None) -> wire.ListResult:
        # sessions Qwen Code recorded meanwhile appear too (only changed files are rescanned)
        rows = await self.store.rows(str(cwd) if cwd else None)
        out = [
            wire.SessionInfo(session_id=r["session_id"], cwd=r.get("cwd") or "",
                             started_at=r.get("started_at"), updated_at=r.get("updated_at"),
                             messages=int(r.get("messages") or 0), title=r.get("title"),
                             open=r["session_id"] in self.sessions)
            for r in rows
        ]
        return wire.ListResult(sessions=out)

    async def recap(self, session_id: str) -> wire.RecapResult:
        s = self.get(session_id)
        r = await recap_mod.recap(self.model, list(s.history.messages))
        return wire.RecapResult(text=r.text, status=r.status, reason=r.reason)

    async def project_summary(self, session_id: str) -> wire.ProjectSummaryResult:
        s = self.get(session_id)
        text = await recap_mod.project_summary(self.model, list(s.history.messages))
        target = s.project.anchor / ".qwen" / PROJECT_SUMMARY_NAME
        from qwenctxd.fsutil import atomic_write

        await anyio.to_thread.run_sync(atomic_write, target, text.rstrip() + "\n")
        return wire.ProjectSummaryResult(path=str(target), text=text)

    async def delete(self, session_id: str) -> wire.DeleteResult:
        checked_id(session_id)
        s = self.sessions.pop(session_id, None)
        self._opened_at.pop(session_id, None)
        if s is not None:
            self.store.close_writer(s)
        deleted = await self.store.delete(session_id, s.path if s is not None else None)
        return wire.DeleteResult(deleted=deleted or s is not None)

    # -- titles -------------------------------------------------------------------------------

    async def set_title(self, session_id: str, raw: str) -> wire.SetTitleResult:
        """The user's title for an open or a recorded session; never replaced by an auto one."""
        checked_id(session_id)
        title = titles.manual_title(raw)
        s = self.sessions.get(session_id)
        if s is not None:
            async with s.lock:
                self.store.record_title(s, title, source="manual")
            await self.store.upsert(s)
            return wire.SetTitleResult(session_id=session_id, title=title)
        await self.store.title_recorded(session_id, title)
        return wire.SetTitleResult(session_id=session_id, title=title)

    async def close(self, session_id: str) -> None:
        s = self.get(session_id)
        if s.deliveries.prefetch is not None:
            self.tasks.cancel(s.deliveries.prefetch)
        agent_request.end_foreground(self.model, s)
        async with s.lock:
            self.store.close_writer(s)
            self.sessions.pop(session_id, None)
            self._opened_at.pop(session_id, None)
        await self.store.upsert(s)

    # -- idle close ---------------------------------------------------------------------------
    def idle_for(self, s: Session, now: float) -> float:
        """Seconds since the session's last activity (opened, continued by a client, or a
        message added)."""
        last = max(self._opened_at.get(s.id, 0.0), s.updated_at, s.last_model_reply_at or 0.0)
        return max(0.0, now - last)

    async def close_idle(self, idle_s: float, *, now: float | None = None) -> list[str]:
        """Close every open session idle for ``idle_s`` or longer (not one mid-turn); they stay
        recorded and resumable (``session.open {session_id}``). The ids closed."""
        now = time.time() if now is None else now
        closed: list[str] = []
        for s in list(self.sessions.values()):
            if s.lock.locked() or self.idle_for(s, now) < idle_s:
                continue
            try:
                await self.close(s.id)
            except errors.SessionNotFound:
                continue  # closed meanwhile
            closed.append(s.id)
            log.info("session closed after idle", session=s.id,
                     idle_minutes=round(self.idle_for(s, now) / 60, 1))
        return closed

    async def idle_close_loop(self) -> None:
        """Forever: close sessions idle past ``sessions.idle_close_minutes`` (read each round,
        so a config reload applies; 0 turns it off)."""
        while True:
            minutes = self.config.global_settings.sessions.idle_close_minutes
            if minutes <= 0:
                await anyio.sleep(60.0)
                continue
            await anyio.sleep(min(60.0, max(0.2, minutes * 60 / 4)))
            if self.tasks.accepting:
                await self.close_idle(minutes * 60)

    async def adopt_messages(self, session_id: str, messages: list[dict[str, Any]], *,
                             complete: bool) -> None:
        """Append messages produced elsewhere (an accepted speculation) to a live session and
        its transcript; the user turn stays open unless they completed it. A session closed
        meanwhile is left alone."""
        if session_id not in self.sessions:
            return
        s = self.get(session_id)
        async with s.lock:
            for m in messages:
                s.append(m)
                self.store.record(s, m)
            s.turn.adopted(complete=complete)

    def summaries(self) -> list[dict[str, Any]]:
        from qwenctxd.compaction.thresholds import compute_thresholds, level

        out = []
        for s in self.sessions.values():
            th = compute_thresholds(s.options.window_tokens, s.options.auto_compact_threshold)
            out.append({"session_id": s.id, "cwd": str(s.cwd), "model": s.model,
                        "messages": len(s.history.messages), "prompt_tokens": s.usage.prompt_tokens,
                        "window_tokens": s.options.window_tokens, "level": level(s.usage.prompt_tokens, th)})
        return out


def checked_id(session_id: str) -> str:
    """``session_id`` when it has a session id's form (a UUID); else InvalidParams naming it."""
    try:
        ok = bool(records.SESSION_ID_RE.match(session_id)) and bool(uuid.UUID(session_id))
    except ValueError:
        ok = False
    if not ok:
        raise errors.InvalidParams(
            f"session_id {session_id[:80]!r} is not a session id (a UUID)",
            data={"field": "session_id", "message": "not a UUID"})
    return session_id


def with_skill_tool(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The client's tools plus the daemon's constant ``skill`` tool (unless the client
    declares a tool of that name itself: then calls to it are the client's)."""
    names = {tool_roles.tool_name(t) for t in tools if isinstance(t, dict)}
    return list(tools) if SKILL_NAME in names else [*tools, SKILL_TOOL]


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def _tools(v: Any) -> list[dict[str, Any]]:
    return [t for t in v if isinstance(t, dict)] if isinstance(v, list) else []


def _agent(v: Any) -> dict[str, Any] | None:
    return dict(v) if isinstance(v, dict) and isinstance(v.get("name"), str) else None


