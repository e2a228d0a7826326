"""SessionManager: open, resume, list, recap, summarise, delete and close sessions.

Sessions live in the daemon, not in a connection: any client may continue a session by id, and
a session survives its client disconnecting. Each session records to
``~/.qwen/projects/<slug>/chats/<uuid>.jsonl`` (Qwen Code's ChatRecord field names); a small
SQLite index serves ``session.list`` without parsing every file and is re-synced from the files
at start. The turn pipeline itself lives in ``sessions.turns``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd import __version__
from qwenctxd.compaction import recap as recap_mod
from qwenctxd.config import ConfigStore
from qwenctxd.events import EventBus
from qwenctxd.instructions import tool_roles
from qwenctxd.instructions.service import InstructionsService
from qwenctxd.memory.service import MemoryService
from qwenctxd.model import ModelClient
from qwenctxd.paths import runtime_base_dir
from qwenctxd.project import Project
from qwenctxd.protocol import errors
from qwenctxd.protocol import session as wire
from qwenctxd.sessions import jsonl_writer, records, titles
from qwenctxd.sessions.index import SessionIndex
from qwenctxd.sessions.state import History, Session, SessionOptions
from qwenctxd.sessions.window import session_window
from qwenctxd.skills.listing import SKILL_NAME, SKILL_TOOL
from qwenctxd.skills.service import SkillsService
from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.sessions")
PROJECT_SUMMARY_NAME = "PROJECT_SUMMARY.md"
FSYNC_INTERVAL_S = 1.0
KEEP_REASONING = ("none", "current_turn", "all")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


class SessionManager:
    def __init__(
        self,
        *,
        config: ConfigStore,
        instructions: InstructionsService,
        model: Callable[[], ModelClient],
        tasks: TaskRegistry,
        bus: EventBus,
        index_path: Path,
        skills: SkillsService | None = None,
        memory: MemoryService | None = None,
        environ: Mapping[str, str] | None = None,
        turn_complete_hooks: Sequence[Callable[[Session], list[str]]] = (),
        user_turn_hooks: Sequence[Callable[[Session], None]] = (),
        record_hooks: Sequence[Callable[[Path], None]] = (),
    ) -> None:
        self.config = config
        # background work after a completed user-query turn (its names are reported as
        # ``scheduled``), and what a new user turn interrupts (dream, speculation)
        self.turn_complete_hooks = tuple(turn_complete_hooks)
        self.user_turn_hooks = tuple(user_turn_hooks)
        self.record_hooks = tuple(record_hooks)  # a record was appended to this file (search)
        self.instructions = instructions
        self._model = model
        self.tasks = tasks
        self.bus = bus
        self.index = SessionIndex(index_path)
        self.sessions: dict[str, Session] = {}
        self.skills: SkillsService | None = skills
        self.memory: MemoryService | None = memory
        self._environ = environ if environ is not None else os.environ
        self._opened_at: dict[str, float] = {}  # wall time each session was opened here

    @property
    def model(self) -> ModelClient:
        return self._model()

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.index.open()
        if self.tasks.accepting:
            self.tasks.submit("index-sync", self._sync_index, description="sync session index")

    async def _sync_index(self) -> None:
        await self.index.sync(runtime_base_dir() / "projects")

    async def aclose(self) -> None:
        for s in list(self.sessions.values()):
            s.writer.close()
        self.sessions.clear()
        await self.index.close()

    def get(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            raise errors.SessionNotFound(f"unknown session {session_id}",
                                         data={"session_id": session_id})
        return s

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
        resumed = False
        state: records.ResumeState | None = None
        if p.resume or p.session_id:
            found = await self._find_file(session_id, cwd)
            if found is not None:
                path = found
                state = await anyio.to_thread.run_sync(records.resume, path)
                resumed = True
            elif p.resume:
                raise errors.SessionNotFound(f"no recorded session {session_id}",
                                             data={"session_id": session_id})
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
            # fsync happens in a background job (at most once a second), never on the turn path;
            # close() still fsyncs
            writer=jsonl_writer.JsonlWriter(path, fsync="interval", fsync_interval=float("inf")),
            history=History(image_tokens=int(self._environ.get("QWEN_IMAGE_TOKEN_ESTIMATE", 0))
                            or settings.model.chat_compression.image_token_estimate),
        )
        options = {"windowTokens": window, "windowSource": window_source, "tools": client_tools,
                   "agent": agent, "keepReasoning": keep, "autoCompactThreshold": pct}
        if options != saved:
            self.record(s, {}, subtype=records.SUBTYPE_OPTIONS, payload=options)
        warnings: list[str] = []
        torn: list[int] = []
        if state is not None:
            s.replace_history(state.messages)
            s.writer.remember_tool_calls(state.messages)
            s.title = state.title
            s.started_at = _parse_iso(state.started_at) or s.started_at
            s.updated_at = _parse_iso(state.updated_at) or s.updated_at
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

        for holder in await anyio.to_thread.run_sync(shared_file.holders, project.qwen_home,
                                                     session_id):
            warnings.append(shared_file.held_warning(holder))
        s.git_snapshot = await self.instructions.git_snapshot(project)
        self.sessions[session_id] = s
        self._opened_at[session_id] = time.time()
        sp = await self.system_prompt(s)
        from qwenctxd.sessions.state import system_tokens

        sys_tok = system_tokens(sp.text, s.options.tools)
        if s.usage.anchor is not None and s.usage.anchor.system_tokens == 0:
            s.usage.anchor.system_tokens = sys_tok
        tokens, _ = s.estimate(sys_tok)
        s.usage.prompt_tokens = tokens
        if not resumed:
            await self._index_upsert(s)
        log.info("session opened", session=session_id, resumed=resumed, messages=len(s.history.messages),
                 torn=len(torn))
        return wire.OpenResult(session_id=session_id, resumed=resumed, messages=len(s.history.messages),
                               prompt_tokens=tokens, window_tokens=window,
                               window_source=window_source, path=str(path),
                               torn_lines=torn, warnings=warnings)

    async def system_prompt(self, s: Session) -> Any:
        """The system prompt of ``s``: its model, env, declared tools, agent identity and the
        git snapshot taken when it opened."""
        return await self.instructions.system_prompt(
            s.project, s.cwd, model=s.model, env=s.env, tool_roles=s.options.tool_roles,
            agent=(s.options.agent or {}).get("name"), git_snapshot=s.git_snapshot)

    async def _find_file(self, session_id: str, cwd: Path) -> Path | None:
        row = await self.index.get(session_id)
        hint = Path(row["path"]) if row and row.get("path") else None
        return await anyio.to_thread.run_sync(_locate, session_id, cwd, hint)

    async def _index_upsert(self, s: Session) -> None:
        summary = records.SessionSummary(
            session_id=s.id, path=str(s.path), cwd=str(s.cwd), started_at=iso(s.started_at),
            updated_at=iso(s.updated_at), messages=len(s.history.messages), title=s.title,
            size=_size(s.path), mtime_ns=_mtime(s.path))
        await self.index.upsert(summary, project=str(s.project.anchor))

    def schedule_index_touch(self, s: Session) -> None:
        if not self.tasks.accepting:
            return

        async def touch() -> None:
            await self.index.touch(s.id, updated_at=iso(s.updated_at), messages=len(s.history.messages),
                                   size=_size(s.path), mtime_ns=_mtime(s.path), title=s.title)

        self.tasks.submit("index", touch, key=f"index:{s.id}", project=str(s.project.anchor))

    # -- list / recap / summary / delete / close ----------------------------------------------
    async def list(self, cwd: Path | None) -> wire.ListResult:
        # sessions Qwen Code recorded meanwhile appear too (only changed files are rescanned)
        await self.index.sync(runtime_base_dir() / "projects")
        rows = await self.index.list(project=str(cwd) if cwd else None)
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
        path: Path | None = None
        if s is not None:
            s.writer.close()
            path = s.path
        else:
            row = await self.index.get(session_id)
            path = Path(row["path"]) if row and row.get("path") else None
            if path is None:
                path = await self._find_file(session_id, Path("/"))
        deleted = False
        if path is not None:
            try:
                path.unlink()
                deleted = True
            except FileNotFoundError:
                pass
        await self.index.delete(session_id)
        return wire.DeleteResult(deleted=deleted or s is not None)

    # -- titles -------------------------------------------------------------------------------
    def apply_title(self, s: Session, title: str, *, source: str) -> None:
        """Set ``s.title`` and record it (a ``custom_title`` record) in the session's JSONL."""
        s.title = title
        self.record(s, {}, subtype=records.SUBTYPE_TITLE,
                    payload={"customTitle": title, "titleSource": source})

    async def set_title(self, session_id: str, raw: str) -> wire.SetTitleResult:
        """The user's title for an open or a recorded session; never replaced by an auto one."""
        checked_id(session_id)
        title = titles.manual_title(raw)
        s = self.sessions.get(session_id)
        if s is not None:
            async with s.lock:
                self.apply_title(s, title, source="manual")
            await self._index_upsert(s)
            return wire.SetTitleResult(session_id=session_id, title=title)
        row = await self.index.get(session_id)
        hint = Path(row["path"]) if row and row.get("path") else None
        path = await anyio.to_thread.run_sync(_locate, session_id, Path("/"), hint)
        if path is None:
            raise errors.SessionNotFound(f"unknown session {session_id}",
                                         data={"session_id": session_id})

        def append() -> records.SessionSummary:
            writer = jsonl_writer.JsonlWriter(path, session_id=session_id, version=__version__,
                                         fsync="always")
            try:
                writer.append_title(title, source="manual")
            finally:
                writer.close()
            return records.scan_summary(path)

        summary = await anyio.to_thread.run_sync(append)
        await self.index.upsert(summary, project=None)
        return wire.SetTitleResult(session_id=session_id, title=title)

    async def close(self, session_id: str) -> None:
        s = self.get(session_id)
        if s.deliveries.prefetch is not None:
            self.tasks.cancel(s.deliveries.prefetch)
        self.end_foreground(s)
        async with s.lock:
            s.writer.close()
            self.sessions.pop(session_id, None)
            self._opened_at.pop(session_id, None)
        await self._index_upsert(s)

    # -- foreground marks (model/scheduler.py) --------------------------------------------------
    def begin_foreground(self, s: Session) -> None:
        """``s``'s agent is about to send the prompt just assembled to its model server."""
        sched = self.model.scheduler
        if sched is not None and s.model_base_url:
            sched.begin_foreground(s.model_base_url, s.id)

    def end_foreground(self, s: Session) -> None:
        """``s``'s agent has its answer (or gave up)."""
        sched = self.model.scheduler
        if sched is not None:
            sched.end_foreground(s.id)

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
                self.record(s, m)
            s.turn.adopted(complete=complete)

    def on_user_turn_complete(self, s: Session) -> list[str]:
        """Hook for background work after a user-query turn (extraction, dream: issue 7)."""
        scheduled: list[str] = []
        for hook in self.turn_complete_hooks:
            scheduled.extend(hook(s))
        return scheduled

    def summaries(self) -> list[dict[str, Any]]:
        from qwenctxd.compaction.thresholds import compute_thresholds, level

        out = []
        for s in self.sessions.values():
            th = compute_thresholds(s.options.window_tokens, s.options.auto_compact_threshold)
            out.append({"session_id": s.id, "cwd": str(s.cwd), "model": s.model,
                        "messages": len(s.history.messages), "prompt_tokens": s.usage.prompt_tokens,
                        "window_tokens": s.options.window_tokens, "level": level(s.usage.prompt_tokens, th)})
        return out

    def record(self, s: Session, msg: dict[str, Any], *, usage: dict[str, int] | None = None,
               subtype: str | None = None, payload: dict[str, Any] | None = None) -> None:
        """Append one ChatRecord for ``msg`` (or a system record) to the session's JSONL."""
        role = msg.get("role") if msg else None
        rtype = {"user": "user", "assistant": "assistant", "tool": "tool_result"}.get(
            role or "", "system")
        rec = records.ChatRecord(
            uuid=str(uuid.uuid4()), parentUuid=None, sessionId=s.id, timestamp=iso(time.time()),
            type=rtype if payload is None else "system", subtype=subtype, cwd=str(s.cwd),
            version=__version__, message=msg if payload is None else None, usage=usage,
            model=s.model if rtype == "assistant" else None, systemPayload=payload,
            contextWindowSize=s.options.window_tokens if payload is not None else None,
        )
        try:
            s.writer.append(rec)
        except OSError as exc:
            log.error("session record write failed", session=s.id, error=exc.strerror)
            return
        for hook in self.record_hooks:
            hook(s.path)
        now = time.monotonic()
        if now - s.last_flush >= FSYNC_INTERVAL_S and self.tasks.accepting:
            s.last_flush = now
            writer = s.writer
            self.tasks.submit("jsonl-flush", lambda: anyio.to_thread.run_sync(_fsync, writer),
                              key=f"jsonl-flush:{s.id}", project=str(s.project.anchor))


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


def _fsync(writer: jsonl_writer.JsonlWriter) -> None:
    try:
        writer.sync()
    except (OSError, ValueError):  # closed meanwhile: close() fsynced it
        pass


def _parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _locate(session_id: str, cwd: Path, hint: Path | None) -> Path | None:
    """The JSONL of ``session_id``: under cwd's project dir, where the index says, or in any
    project's chats dir (a session may be continued from another directory)."""
    direct = records.session_path(cwd, session_id)
    if direct.exists():
        return direct
    if hint is not None and hint.exists():
        return hint
    projects = runtime_base_dir() / "projects"
    try:
        slugs = os.listdir(projects)
    except FileNotFoundError:
        return None
    for slug in slugs:
        cand = projects / slug / "chats" / f"{session_id}.jsonl"
        if cand.exists():
            return cand
    return None
