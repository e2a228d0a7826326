"""Wiring of the background agents into the daemon: extraction and dream after user turns,
the idle dream scheduler, and the dream/speculation entry points the RPC methods call.

Kept out of ``app.py`` so the daemon's composition stays readable. The scheduler wakes every
``IDLE_CHECK_S`` (10 minutes) and, while no request is in flight, re-checks the dream gates of
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

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon

log = structlog.get_logger("qwenctxd.background")
IDLE_CHECK_S = 600.0


class Background:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.dreamer = dream_mod.Dreamer()
        self.idle_checks = 0

    # -- after a user-query turn --------------------------------------------------------------
    def on_turn_complete(self, session: Any) -> list[str]:
        scheduled: list[str] = []
        req = ExtractRequest(session_id=session.id, cwd=session.cwd,
                             history=list(session.history.messages),
                             wrote_memory=session.memory_written_this_turn)
        ok, _reason = self.d.extractor.schedule(req)
        if ok:
            scheduled.append("extract")
        ok, _reason = self.schedule_dream(session.cwd, session_id=session.id)
        if ok:
            scheduled.append("dream")
        from qwenctxd.agents import skill_review

        reviewer = skill_review.reviewer_for(self.d)
        settings = skill_review.settings_for(self.d, reviewer.project_root(session))
        job = reviewer.maybe_schedule(session, self.d.tasks, self.d.model, self.d.audit,
                                      settings)
        if job is not None:
            scheduled.append(job)
        return scheduled

    def on_user_turn(self, cwd: Path) -> None:
        """A turn takes priority over consolidation of the same project."""
        roots = self.d.memory.roots(cwd)
        if self.dreamer.cancel(self.d.tasks, roots):
            log.info("dream yielded to a user turn", project=str(roots.project))

    # -- dream ----------------------------------------------------------------------------------
    def _dream_enabled(self, cwd: Path) -> bool:
        root = self.d.instructions.project_root(cwd)
        s = self.d.config.for_project(root) if root else self.d.config.global_settings
        return (s.memory.enable_managed_auto_memory and s.memory.enable_managed_auto_dream
                and self.d.model.configured)

    def schedule_dream(self, cwd: Path, *, session_id: str | None, force: bool = False
                       ) -> tuple[bool, str | None]:
        if not self.d.model.configured:
            return False, "no_model"
        roots = self.d.memory.roots(cwd)
        return self.dreamer.schedule(
            self.d.tasks, lambda: self.d.model, roots=roots, cwd=cwd, session_id=session_id,
            audit=self.d.audit, project_key=cwd, enabled=self._dream_enabled(cwd),
            memory_pressure=dream_mod.memory_pressure(), force=force)

    def dream_status(self, cwd: Path) -> tuple[dict[str, Any] | None, int]:
        roots = self.d.memory.roots(cwd)
        st = self.dreamer.status(roots)
        try:
            since = self.dreamer.sessions_since(roots, cwd)
        except OSError:
            since = 0
        return st.get("lock"), since

    async def idle_loop(self) -> None:
        """The idle dream checks, and closing sessions idle past
        ``sessions.idle_close_minutes``."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.d.sessions.idle_close_loop)
            tg.start_soon(self._dream_idle_loop)

    async def _dream_idle_loop(self) -> None:
        while True:
            await anyio.sleep(IDLE_CHECK_S)
            if self.d.in_flight_requests or not self.d.tasks.accepting:
                continue
            self.idle_checks += 1
            for key, _docs in self.d.memory.projects():
                if self.d.in_flight_requests:
                    break
                ok, reason = self.schedule_dream(key, session_id=None)
                log.debug("idle dream check", project=str(key), scheduled=ok, reason=reason)
