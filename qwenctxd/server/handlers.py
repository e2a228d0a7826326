"""The handler families of :mod:`qwenctxd.server.methods` over the composed services.

Each family is a class whose handler methods carry their table entry (``@handler(methods.X)``
from :mod:`qwenctxd.server.dispatch`), constructed here with exactly the services it uses;
:func:`served_specs` binds every marked handler for the dispatcher."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from qwenctxd.server.dispatch import specs_of
from qwenctxd.server.methods.daemon_methods import DaemonControl, DaemonHandlers
from qwenctxd.server.methods.instructions_methods import InstructionsHandlers
from qwenctxd.server.methods.memory_methods import MemoryHandlers
from qwenctxd.server.methods.model_methods import ModelHandlers
from qwenctxd.server.methods.search_methods import SearchHandlers
from qwenctxd.server.methods.session_methods import SessionHandlers
from qwenctxd.server.methods.skill_review_methods import SkillReviewHandlers
from qwenctxd.server.methods.skills_methods import SkillsHandlers
from qwenctxd.server.methods.speculation_methods import SpeculationHandlers
from qwenctxd.server.methods.transcript_methods import TranscriptHandlers

if TYPE_CHECKING:
    from qwenctxd.server.compose import Services
    from qwenctxd.server.dispatch import Dispatcher, MethodSpec

__all__ = ["DaemonControl", "handler_families", "served_specs"]


def handler_families(s: Services, *, control: DaemonControl, dispatcher: Dispatcher,
                     debug: bool = False) -> list[object]:
    """One instance of every handler family over the services ``s``; ``debug`` adds the
    ``debug.*`` family."""
    families: list[object] = [
        DaemonHandlers(control=control, dispatcher=dispatcher, tasks=s.tasks, config=s.config),
        InstructionsHandlers(instructions=s.instructions, projects=s.projects),
        SessionHandlers(sessions=s.sessions, turns=s.turns, projects=s.projects),
        SkillsHandlers(skills=s.skills, sessions=s.sessions, projects=s.projects),
        SkillReviewHandlers(reviewer=s.reviewer, audit=s.audit, projects=s.projects,
                            sessions=s.sessions, tasks=s.tasks, model=s.model),
        MemoryHandlers(memory=s.memory, audit=s.audit, extractor=s.extractor,
                       sessions=s.sessions, background=s.background, projects=s.projects),
        ModelHandlers(model=s.model, config=s.config),
        SpeculationHandlers(speculation=s.speculation, sessions=s.sessions, tasks=s.tasks,
                            model=s.model),
        TranscriptHandlers(sessions=s.sessions),
        SearchHandlers(search=s.search, projects=s.projects),
    ]
    if debug:
        from qwenctxd.server.methods.debug_methods import DebugHandlers

        families.append(DebugHandlers(tasks=s.tasks, bus=s.bus))
    return families


def served_specs(s: Services, *, control: DaemonControl, dispatcher: Dispatcher
                 ) -> list[MethodSpec[Any]]:
    """Every method the daemon serves, bound to its family's handler (the ``debug.*`` family
    only with QWENCTXD_DEBUG_METHODS=1)."""
    debug = os.environ.get("QWENCTXD_DEBUG_METHODS") == "1"
    return [spec for family in handler_families(s, control=control, dispatcher=dispatcher,
                                                debug=debug)
            for spec in specs_of(family)]
