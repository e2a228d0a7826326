"""Wiring of the background agents into the daemon: extraction and dream after user turns,
the idle dream scheduler, and the dream entry point ``memory.dream`` calls
(:meth:`Background.dream_now`).

Built by ``compose.build_services`` with the services it drives (no back-reference to the
daemon). The scheduler wakes every ``IDLE_CHECK_S`` (10 minutes) and, while no request is in flight, re-checks the dream gates of
every project the daemon has seen — consolidation happens between sessions without anyone
typing; a user turn for a project cancels its running dream at once (a turn always wins).
Every entry point takes the resolved :class:`~qwenctxd.project.Project` (a session's, or the one
the wire edge resolved): its settings gate the agents, its anchor keys their jobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from qwenctxd.agents import dream as dream_mod
from qwenctxd.agents.extraction import ExtractRequest, turns_key
from qwenctxd.protocol import memory as memory_wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from qwenctxd.agents.audit import AuditLog
    from qwenctxd.agents.extraction import Extractor
    from qwenctxd.agents.skill_review import SkillReviewer
    from qwenctxd.memory.service import MemoryService
    from qwenctxd.model import ModelClient
    from qwenctxd.project import Project
    from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.background")
IDLE_CHECK_S = 600.0


class Background:
    """Schedules the background agents; built by :func:`qwenctxd.server.compose.build_services`
    with the services it drives and ``in_flight`` (requests running: the idle loop waits)."""

    def __init__(self, *, tasks: TaskRegistry, model: ModelClient, memory: MemoryService,
                 audit: AuditLog, extractor: Extractor, reviewer: SkillReviewer,
                 in_flight: Callable[[], int]) -> None:
        self.tasks = tasks
        self.model = model
        self.memory = memory
        self.audit = audit
        self.extractor = extractor
        self.reviewer = reviewer
        self.in_flight = in_flight
        self.dreamer = dream_mod.Dreamer()
        self.idle_checks = 0

    # -- after a user-query turn --------------------------------------------------------------
    def on_turn_complete(self, session: Any) -> list[str]:
        scheduled: list[str] = []
        req = ExtractRequest(session_id=session.id, cwd=session.cwd, project=session.project,
                             history=list(session.history.messages),
                             wrote_memory=session.turn.memory_written_this_turn,
                             after_turn=True, agent_base_url=session.model_base_url)
        ok, _reason = self.extractor.schedule(req)
        if ok:
            scheduled.append("extract")
        ok, _reason = self.schedule_dream(session.project, session.cwd, session_id=session.id)
        if ok:
            scheduled.append("dream")
        job = self.reviewer.maybe_schedule(session, self.tasks, self.model, self.audit,
                                           session.project.settings)
        if job is not None:
            scheduled.append(job)
        return scheduled

    def on_user_turn(self, project: Project) -> None:
        """A turn takes priority over consolidation of the same project, and puts off its
        extraction until the turns pause (agents/extraction.py)."""
        self.tasks.quiet.touch(turns_key(project))
        roots = self.memory.roots(project)
        if self.dreamer.cancel(self.tasks, roots):
            log.info("dream yielded to a user turn", project=str(roots.project))

    # -- dream ----------------------------------------------------------------------------------
    def _dream_enabled(self, project: Project) -> bool:
        s = project.settings
        return (s.memory.enable_managed_auto_memory and s.memory.enable_managed_auto_dream
                and self.model.configured)

    def schedule_dream(self, project: Project, cwd: Path, *, session_id: str | None,
                       force: bool = False) -> tuple[bool, str | None]:
        """Check the dream gates for ``project`` (sessions counted in ``cwd``'s transcripts)
        and schedule one when they pass."""
        if not self.model.configured:
            return False, "no_model"
        roots = self.memory.roots(project)
        return self.dreamer.schedule(
            self.tasks, lambda: self.model, roots=roots, cwd=cwd, session_id=session_id,
            audit=self.audit, project_key=cwd, enabled=self._dream_enabled(project),
            memory_pressure=dream_mod.memory_pressure(), force=force)

    async def dream_now(self, project: Project, cwd: Path, *, force: bool
                        ) -> memory_wire.DreamScheduledResult:
        """``memory.dream``: scaffold the project's memory and schedule a dream of it; when
        skipped, when to retry and whether ``force`` would get past the reason."""
        await self.memory.load(project)  # scaffold
        scheduled, reason = self.schedule_dream(project, cwd, session_id=None, force=force)
        if scheduled or reason is None:
            return memory_wire.DreamScheduledResult(scheduled=scheduled, reason=reason,
                                                    skipped_reason=reason)
        roots = self.memory.roots(project)
        return memory_wire.DreamScheduledResult(
            scheduled=False, reason=reason, skipped_reason=reason,
            retry_at=self.dreamer.retry_at(roots, reason),
            force_skips=(reason in dream_mod.FORCE_SKIPS) or None)

    def dream_status(self, project: Project, cwd: Path) -> tuple[dict[str, Any] | None, int]:
        roots = self.memory.roots(project)
        st = self.dreamer.status(roots)
        try:
            since = self.dreamer.sessions_since(roots, cwd)
        except OSError:
            since = 0
        return st.get("lock"), since

    async def idle_loop(self) -> None:
        """The idle dream checks (closing idle sessions is the session manager's own loop)."""
        while True:
            await anyio.sleep(IDLE_CHECK_S)
            if self.in_flight() or not self.tasks.accepting:
                continue
            self.idle_checks += 1
            for project in self.memory.loaded():
                if self.in_flight():
                    break
                ok, reason = self.schedule_dream(project, project.anchor, session_id=None)
                log.debug("idle dream check", project=str(project.anchor), scheduled=ok,
                          reason=reason)
