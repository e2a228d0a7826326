"""Wiring of the background agents into the daemon: extraction and dream after user turns,
the idle dream scheduler, and the dream entry point ``memory.dream`` calls
(:meth:`Background.dream_now`).

Built by ``compose.build_services`` with the services it drives (no back-reference to the
daemon). The scheduler wakes every ``IDLE_CHECK_S`` (10 minutes) and, while no request is in flight, re-checks the dream gates of
every project the daemon has seen — consolidation happens between sessions without anyone
typing; a user turn for a project cancels its running dream at once (a turn always wins).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from qwenctxd.agents import dream as dream_mod
from qwenctxd.agents.extraction import ExtractRequest
from qwenctxd.protocol import memory as memory_wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from qwenctxd.agents.audit import AuditLog
    from qwenctxd.agents.extraction import Extractor
    from qwenctxd.agents.skill_review import SkillReviewer
    from qwenctxd.config import ConfigStore
    from qwenctxd.config.schema import Settings
    from qwenctxd.instructions.service import InstructionsService
    from qwenctxd.memory.service import MemoryService
    from qwenctxd.model import ModelClient
    from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.background")
IDLE_CHECK_S = 600.0


class Background:
    """Schedules the background agents; built by :func:`qwenctxd.server.compose.build_services`
    with the services it drives and ``in_flight`` (requests running: the idle loop waits)."""

    def __init__(self, *, config: ConfigStore, tasks: TaskRegistry, model: ModelClient,
                 memory: MemoryService, instructions: InstructionsService, audit: AuditLog,
                 extractor: Extractor, reviewer: SkillReviewer,
                 in_flight: Callable[[], int]) -> None:
        self.config = config
        self.tasks = tasks
        self.model = model
        self.memory = memory
        self.instructions = instructions
        self.audit = audit
        self.extractor = extractor
        self.reviewer = reviewer
        self.in_flight = in_flight
        self.dreamer = dream_mod.Dreamer()
        self.idle_checks = 0

    def settings_for(self, root: Path | None) -> Settings:
        return self.config.for_project(root) if root is not None else self.config.global_settings

    # -- after a user-query turn --------------------------------------------------------------
    def on_turn_complete(self, session: Any) -> list[str]:
        scheduled: list[str] = []
        req = ExtractRequest(session_id=session.id, cwd=session.cwd,
                             history=list(session.history.messages),
                             wrote_memory=session.turn.memory_written_this_turn)
        ok, _reason = self.extractor.schedule(req)
        if ok:
            scheduled.append("extract")
        ok, _reason = self.schedule_dream(session.cwd, session_id=session.id)
        if ok:
            scheduled.append("dream")
        reviewer = self.reviewer
        settings = self.settings_for(reviewer.project_root(session))
        job = reviewer.maybe_schedule(session, self.tasks, self.model, self.audit, settings)
        if job is not None:
            scheduled.append(job)
        return scheduled

    def on_user_turn(self, cwd: Path) -> None:
        """A turn takes priority over consolidation of the same project."""
        roots = self.memory.roots(cwd)
        if self.dreamer.cancel(self.tasks, roots):
            log.info("dream yielded to a user turn", project=str(roots.project))

    # -- dream ----------------------------------------------------------------------------------
    def _dream_enabled(self, cwd: Path) -> bool:
        s = self.settings_for(self.instructions.project_root(cwd))
        return (s.memory.enable_managed_auto_memory and s.memory.enable_managed_auto_dream
                and self.model.configured)

    def schedule_dream(self, cwd: Path, *, session_id: str | None, force: bool = False
                       ) -> tuple[bool, str | None]:
        if not self.model.configured:
            return False, "no_model"
        roots = self.memory.roots(cwd)
        return self.dreamer.schedule(
            self.tasks, lambda: self.model, roots=roots, cwd=cwd, session_id=session_id,
            audit=self.audit, project_key=cwd, enabled=self._dream_enabled(cwd),
            memory_pressure=dream_mod.memory_pressure(), force=force)

    async def dream_now(self, cwd: Path, *, force: bool) -> memory_wire.DreamScheduledResult:
        """``memory.dream``: scaffold the project's memory and schedule a dream of it; when
        skipped, when to retry and whether ``force`` would get past the reason."""
        await self.memory.project(cwd)  # scaffold
        scheduled, reason = self.schedule_dream(cwd, session_id=None, force=force)
        if scheduled or reason is None:
            return memory_wire.DreamScheduledResult(scheduled=scheduled, reason=reason,
                                                    skipped_reason=reason)
        roots = self.memory.roots(cwd)
        return memory_wire.DreamScheduledResult(
            scheduled=False, reason=reason, skipped_reason=reason,
            retry_at=self.dreamer.retry_at(roots, reason),
            force_skips=(reason in dream_mod.FORCE_SKIPS) or None)

    def dream_status(self, cwd: Path) -> tuple[dict[str, Any] | None, int]:
        roots = self.memory.roots(cwd)
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
            for key, _docs in self.memory.projects():
                if self.in_flight():
                    break
                ok, reason = self.schedule_dream(key, session_id=None)
                log.debug("idle dream check", project=str(key), scheduled=ok, reason=reason)
