"""Extraction: after a user-query turn, a background agent saves what is durable.

Gates, in order: memory disabled → ``disabled``; no model → ``no_model``; the main agent
itself wrote memory this turn → ``memory_tool``; no new non-empty user message since the
project's cursor → ``no_new_messages``. Runs are jobs keyed per project in the task registry:
one runs and one waits, a newer request replacing the waiting one. The agent works on a copy
of the session's history with read tools, read-only shell and writes scoped to the project and
user memory roots (team never), every write audited. Afterwards the touched topics are derived
from the written paths, meta.json records the run, the project index is rebuilt (a failure
keeps the cursor so the next run retries) and the user index too (a failure only warns); the
cursor moves to the end of the history. A cancelled run writes nothing.

After a turn (not for ``memory.extract``) a run first waits until the project's turns pause for
``memory.extractionQuietMs`` (1 s; at most :data:`MAX_DEFER_S`; a drain hurries it) and then
takes its session's newest history, so a burst of an agent's requests costs one extraction
after it instead of one beside each of them (tasks/quiet.py; the run it made redundant
returns ``skipped``/``merged`` and records nothing). Unless the setting is given: when the
session's agent uses the same local model server as the daemon's side queries
(``shares_local_server``: often one slot), the pause is :data:`SHARED_SERVER_QUIET_S` and the
bound :data:`SHARED_SERVER_MAX_DEFER_S`, since a run there evicts the agent's cached prompt
and the agent's next request reads its whole prompt again (minutes on a laptop's CPU for
Qwen Code's 17k tokens).

The request carries the session's resolved :class:`~qwenctxd.project.Project`: its settings
gate and time the run, its anchor keys the job, its root bounds what the agent may read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.extraction_prompts import SYSTEM, TASK
from qwenctxd.agents.permissions import MemoryWriteScope, ReadScope
from qwenctxd.agents.runner import AgentOutcome, AgentSpec, run_agent
from qwenctxd.agents.tools import ToolContext
from qwenctxd.memory import store
from qwenctxd.memory.index import rebuild_index
from qwenctxd.memory.outbound import OUTBOUND
from qwenctxd.memory.service import MemoryService
from qwenctxd.model import ModelClient
from qwenctxd.model.scheduler import shares_local_server
from qwenctxd.project import Project
from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.extract")
WRITE_TOOLS = {"write_file", "edit", "replace", "create_file"}
PATH_ARGS = ("file_path", "path", "target_file")
MAX_TOPIC_SUMMARY = 280
DEFAULT_QUIET_S = 1.0  # the pause a run after a turn waits for, unless settings say
MAX_DEFER_S = 30.0  # a project whose turns never pause is extracted at least this often
#: on a local model server the session's agent uses too: the pause a run waits for, and the
#: longest it defers (each run there evicts the agent's cached prompt, see the module doc)
SHARED_SERVER_QUIET_S = 20.0
SHARED_SERVER_MAX_DEFER_S = 300.0


def turns_key(project: Project) -> str:
    """The quiet-period key of a project's turns (tasks/quiet.py)."""
    return f"turns:{project.anchor}"


@dataclass
class ExtractRequest:
    session_id: str
    cwd: Path
    project: Project
    history: list[dict[str, Any]]
    wrote_memory: bool = False
    #: after a turn: wait for a quiet gap in the project's turns first (see the module doc);
    #: ``memory.extract`` asks for a run now
    after_turn: bool = False
    #: an earlier run of the same session took this request's history (its own run is a no-op)
    taken: bool = False
    #: the server the session's agent sends its requests to (``session.open``
    #: ``model_base_url``), if it declared one
    agent_base_url: str | None = None


@dataclass
class ExtractResult:
    status: str  # skipped | completed | noop | failed | cancelled
    reason: str | None = None
    files: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)


def user_texts(history: Sequence[dict[str, Any]], start: int = 0) -> list[tuple[int, str]]:
    """(index, text) of user messages from ``start`` on with non-empty text (reminders
    excluded)."""
    out = []
    for i in range(max(0, start), len(history)):
        m = history[i]
        if m.get("role") != "user":
            continue
        c = m.get("content")
        parts = [c] if isinstance(c, str) else [
            p["text"] for p in (c if isinstance(c, list) else [])
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)]
        text = " ".join(p for p in parts if not p.lstrip().startswith("<system-reminder>"))
        if text.strip():
            out.append((i, " ".join(text.split())))
    return out


def has_user_text(history: Sequence[dict[str, Any]], start: int = 0) -> bool:
    """Whether a user message from ``start`` on has text (reminders excluded): the gate
    asked after every turn, answered from the newest message back (a completed turn
    ends with its own user message near the end) instead of reading the whole history."""
    for i in range(len(history) - 1, max(0, start) - 1, -1):
        if history[i].get("role") == "user" and user_texts(history[i:i + 1]):
            return True
    return False


def wrote_memory(message: dict[str, Any], roots: Sequence[Path]) -> bool:
    """Whether an assistant message calls a write tool on a path inside a memory root."""
    import json

    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        if fn.get("name") not in WRITE_TOOLS:
            continue
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            continue
        for key in PATH_ARGS:
            raw = args.get(key) if isinstance(args, dict) else None
            if isinstance(raw, str) and any(str(Path(raw)).startswith(str(r) + "/")
                                            for r in roots):
                return True
    return False


class Extractor:
    def __init__(self, memory: MemoryService, audit: AuditLog, tasks: TaskRegistry,
                 model: Callable[[], ModelClient]) -> None:
        self.memory = memory
        self.audit = audit
        self.tasks = tasks
        self._model = model
        self.last: dict[str, ExtractResult] = {}
        #: the newest after-turn request per project anchor (one per project: bounded), taken
        #: by its session's run when the quiet period ends
        self._latest: dict[Path, ExtractRequest] = {}

    def start_offset(self, state: Path | None, session_id: str, history_len: int) -> int:
        if state is None:
            return 0
        cursor = store.read_cursor(state)
        if cursor.get("sessionId") != session_id:
            return 0
        offset = int(cursor.get("processedOffset") or 0)
        return 0 if offset > history_len else offset  # a compression shortened the history

    def gate(self, req: ExtractRequest) -> str | None:
        if not self.memory.enabled(req.project):
            return "disabled"
        if not self._model().configured:
            return "no_model"
        if req.wrote_memory:
            return "memory_tool"
        roots = self.memory.roots(req.project)
        start = self.start_offset(roots.state, req.session_id, len(req.history))
        if not has_user_text(req.history, start):
            return "no_new_messages"
        return None

    def schedule(self, req: ExtractRequest) -> tuple[bool, str | None]:
        """Queue an extraction for the request's project; (scheduled, skipped_reason)."""
        reason = self.gate(req)
        if reason is not None:
            self.last[str(req.cwd)] = ExtractResult(status="skipped", reason=reason)
            return False, reason
        if not self.tasks.accepting:
            return False, "shutting_down"
        anchor = req.project.anchor
        if req.after_turn:
            self.tasks.quiet.touch(turns_key(req.project))
            self._latest[anchor] = req
        self.tasks.submit("extract", lambda: self.run(req), key=f"extract:{anchor}",
                          project=str(anchor), description=f"session {req.session_id[:8]}")
        return True, None

    def _pause(self, req: ExtractRequest) -> tuple[float, float]:
        """(the pause in the project's turns a run after a turn waits for, the longest it
        waits): ``memory.extractionQuietMs`` when set, else :data:`DEFAULT_QUIET_S`, or on the
        local server the session's agent uses too the longer shared-server pause."""
        set_ms = req.project.settings.memory.extraction_quiet_ms
        if set_ms is not None:
            return set_ms / 1000, MAX_DEFER_S
        if shares_local_server(req.agent_base_url, self._model().endpoint.base_url):
            return SHARED_SERVER_QUIET_S, SHARED_SERVER_MAX_DEFER_S
        return DEFAULT_QUIET_S, MAX_DEFER_S

    async def run(self, req: ExtractRequest) -> ExtractResult:
        if req.taken:
            return ExtractResult(status="skipped", reason="merged")
        if req.after_turn:
            quiet_s, max_defer_s = self._pause(req)
            await self.tasks.quiet.wait(turns_key(req.project), quiet_s, max_defer_s)
            # the session's newest history: the turns made while this run waited (the newest
            # request of another session is its own queued run's)
            latest = self._latest.get(req.project.anchor)
            if latest is not None and latest.session_id == req.session_id:
                req = self._latest.pop(req.project.anchor)
                req.taken = True
        reason = self.gate(req)  # the cursor may have moved while this run waited
        if reason is not None:
            return self._done(req, ExtractResult(status="skipped", reason=reason))
        proj = await self.memory.load(req.project)
        roots = proj.roots
        writable = [r for r in (roots.project, roots.user) if r is not None]
        scope = MemoryWriteScope.memory(writable, team_root=roots.team)
        reads = ReadScope.of(req.project.root, req.cwd, roots.project,
                             roots.user, roots.team)
        ctx = ToolContext.real_tree(req.cwd, scope, self.audit, agent="extraction",
                                    session=req.session_id, read_scope=reads)
        existing = OUTBOUND.text("\n".join(  # what the model sees of memory: redacted
            f"- [{d.name}]({d.relative_path}) — {d.description}\n  scope={d.scope} "
            f"topic={d.type} path={d.path}\n  current={' '.join(d.body.split())[:MAX_TOPIC_SUMMARY]}"
            for d in proj.docs if d.scope in ("project", "user")), escape=False) or "(none yet)"
        minutes = req.project.settings.memory.agent_timeout_minutes
        spec = AgentSpec(name="memory-extractor", system=SYSTEM,
                         task=TASK.format(project=roots.project, user=roots.user,
                                          existing=existing),
                         tools=["read_file", "grep_search", "glob", "list_directory",
                                "run_shell_command", "write_file", "edit"],
                         max_turns=5, max_time_s=(minutes * 60) if minutes else 120.0)
        try:
            outcome: AgentOutcome = await run_agent(self._model(), spec, ctx, req.history)
        except anyio.get_cancelled_exc_class():
            self.last[str(req.cwd)] = ExtractResult(status="cancelled")
            log.info("extraction cancelled", session=req.session_id)
            raise
        if outcome.status in ("failed", "timed_out"):
            # a failed run leaves nothing: its earlier writes are undone (the cursor stays, so
            # the next run sees the same messages and can write them again, whole)
            await anyio.to_thread.run_sync(ctx.fs.roll_back)
            return self._done(req, ExtractResult(status="failed", reason=outcome.error
                                                 or outcome.status))
        topics = sorted({t for f in outcome.files_written if (t := scope.touched_topic(f))})
        result = ExtractResult(status="completed" if outcome.files_written else "noop",
                               files=outcome.files_written, topics=topics)
        keep_cursor = False

        def after() -> bool:
            nonlocal keep_cursor
            if roots.state is not None:
                store.write_meta(roots.state, lastExtractionAt=store.now_iso(),
                                 lastExtractionSessionId=req.session_id,
                                 lastExtractionTouchedTopics=topics,
                                 lastExtractionStatus="updated" if topics else "noop")
            if outcome.files_written:
                if roots.project is not None:
                    try:
                        rebuild_index(roots.project, "project")
                    except Exception:
                        log.exception("project index rebuild failed; cursor kept for a retry")
                        keep_cursor = True
                try:
                    rebuild_index(roots.user, "user")
                except Exception:
                    log.warning("user index rebuild failed", exc_info=True)
            if not keep_cursor and roots.state is not None:
                store.write_cursor(roots.state, req.session_id, len(req.history))
            return keep_cursor

        await anyio.to_thread.run_sync(after)
        if keep_cursor:
            result.reason = "index_rebuild_failed"
        return self._done(req, result)

    def _done(self, req: ExtractRequest, result: ExtractResult) -> ExtractResult:
        self.last[str(req.cwd)] = result
        log.info("extraction", session=req.session_id, status=result.status,
                 reason=result.reason, files=len(result.files), topics=result.topics)
        return result
