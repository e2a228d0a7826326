"""Handlers of ``skills.list`` and ``skills.load``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import skills as wire
from qwenctxd.server.dispatch import handler
from qwenctxd.server.methods.instructions_methods import checked_project
from qwenctxd.skills import listing
from qwenctxd.skills.model import Skill

if TYPE_CHECKING:
    from qwenctxd.project import ProjectRegistry
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.manager import SessionManager
    from qwenctxd.sessions.state import Session
    from qwenctxd.skills.service import SkillsService


def _info(k: Skill, active: bool) -> wire.SkillInfo:
    return wire.SkillInfo(name=k.name, description=k.description, level=k.level,
                          path=str(k.path), conditional=k.conditional, active=active,
                          paths=list(k.paths), model_invocable=not k.disable_model_invocation)


class SkillsHandlers:
    def __init__(self, *, skills: SkillsService, sessions: SessionManager,
                 projects: ProjectRegistry) -> None:
        self.skills = skills
        self.sessions = sessions
        self.projects = projects

    def session_for(self, session_id: str | None) -> Session | None:
        return self.sessions.get(session_id) if session_id else None

    @handler(methods.SKILLS_LIST)
    async def list_skills(self, ctx: Connection, p: wire.ListParams) -> wire.ListResult:
        cwd, project = checked_project(self.projects, p.cwd)
        session = self.session_for(p.session_id)
        ss, _gen = await self.skills.skillset(session.project if session else project, cwd)
        activated = session.deliveries.skills_activated if session is not None else set()
        return wire.ListResult(
            skills=[_info(k, (not k.conditional) or k.name in activated)
                    for k in ss.skills.values()],
            errors=[wire.SkillError(path=e.path, message=e.message) for e in ss.errors],
            shadowed=[_info(k, False) for k in ss.shadowed],
        )

    @handler(methods.SKILLS_LOAD)
    async def load(self, ctx: Connection, p: wire.LoadParams) -> wire.LoadResult:
        cwd, project = checked_project(self.projects, p.cwd)
        session = self.session_for(p.session_id)
        ss, _gen = await self.skills.skillset(session.project if session else project, cwd)
        skill = ss.skills.get(p.name)
        if skill is None:
            known = ", ".join(sorted(ss.skills)) or "none"
            raise errors.InvalidParams(f"no skill named {p.name!r} (known: {known})",
                                       data={"field": "name", "message": "unknown skill"})
        if session is not None:
            session.deliveries.skills_used.add(skill.name)
        return wire.LoadResult(name=skill.name, base_dir=str(skill.base_dir),
                               content=listing.load_text(skill))
