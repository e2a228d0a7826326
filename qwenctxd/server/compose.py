"""The daemon's services, built once at start-up in one readable order.

:func:`build_services` is the only place that knows how the subsystems fit together: each
service gets what it needs as constructor arguments (its collaborators, its hooks), nothing is
patched in afterwards and nothing is looked up in module globals. Order, bottom up:

    bus, tasks, watch hub, model client, project registry (cwd → one Project per repository)
    instructions  (its memory section comes from the memory service, bound below)
    memory        (every call brings its resolved Project; no registry of its own)
    skills, audit log, extractor, skill reviewer, speculation
    background    (extraction, dream and skill review after turns; the idle dream loop)
    session search (the FTS index of every session file; fed by the store's record hook)
    sessions      the store (transcripts, fsync, index), the manager (the open sessions),
                  the compactor, then the turn pipeline over them all (hooks: after a user
                  turn → background + speculation; after a completed turn → background)

The server (:class:`qwenctxd.server.app.Daemon`) owns the lifecycle and the socket; the
handler families (:mod:`qwenctxd.server.methods`) are constructed over these services, each
with exactly the ones it uses, never through the daemon.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.extraction import Extractor
from qwenctxd.agents.skill_review import SkillReviewer
from qwenctxd.agents.speculation import SpeculationManager
from qwenctxd.config import ConfigStore
from qwenctxd.events import EventBus
from qwenctxd.instructions.service import InstructionsService
from qwenctxd.memory.semantic.upkeep import SemanticUpkeep
from qwenctxd.memory.service import MemoryService
from qwenctxd.model import ModelClient
from qwenctxd.model.scheduler import EndpointScheduler
from qwenctxd.paths import runtime_base_dir
from qwenctxd.project import Project, ProjectRegistry
from qwenctxd.server.background import Background
from qwenctxd.sessions.compacting import Compactor
from qwenctxd.sessions.manager import SessionManager
from qwenctxd.sessions.search import SessionSearch
from qwenctxd.sessions.store import SessionStore
from qwenctxd.sessions.turns import TurnPipeline
from qwenctxd.skills.service import SkillsService
from qwenctxd.tasks import TaskRegistry
from qwenctxd.watch import WatchHub, closed_writes


@dataclass(frozen=True)
class Services:
    """Everything the daemon serves with, wired together."""

    config: ConfigStore
    bus: EventBus
    tasks: TaskRegistry
    hub: WatchHub
    model: ModelClient
    projects: ProjectRegistry
    instructions: InstructionsService
    memory: MemoryService
    skills: SkillsService
    audit: AuditLog
    extractor: Extractor
    reviewer: SkillReviewer
    speculation: SpeculationManager
    background: Background
    search: SessionSearch
    sessions: SessionManager
    turns: TurnPipeline


def build_services(config: ConfigStore, *, state: Path, bump: Callable[[str], None],
                   in_flight: Callable[[], int]) -> Services:
    """The services over ``config``, with their stores under ``state``; ``bump`` counts
    rebuilds for ``daemon.status``, ``in_flight`` tells the idle loop whether requests run."""
    bus = EventBus()
    tasks = TaskRegistry()
    hub = WatchHub()
    model = ModelClient(config.global_settings.endpoint(), scheduler=EndpointScheduler())
    projects = ProjectRegistry(config, hub=hub, tasks=tasks)

    def the_model() -> ModelClient:
        return model

    memory: MemoryService | None = None

    def memory_section(project: Project) -> str:
        return memory.prompt_section(project) if memory is not None else ""

    def memory_stamp(project: Project) -> object:
        return memory.prompt_stamp(project) if memory is not None else None

    instructions = InstructionsService(
        hub, tasks, projects=projects, on_rebuild=lambda: bump("instructions_rebuilds"),
        memory_section=memory_section, memory_stamp=memory_stamp)
    memory = MemoryService(hub, tasks, bus, model=the_model, semantic=SemanticUpkeep(tasks))
    skills = SkillsService(hub, tasks, bus, on_refresh=lambda: bump("skills_refreshes"))
    audit = AuditLog(state)
    extractor = Extractor(memory, audit, tasks, the_model)
    reviewer = SkillReviewer(audit=audit, home=projects.home, qwen_dir=projects.qwen_home)
    speculation = SpeculationManager()
    background = Background(tasks=tasks, model=model, memory=memory, audit=audit,
                            extractor=extractor, reviewer=reviewer, in_flight=in_flight)
    # QWENCTXD_BENCH_NO_SEARCH_HOOK=1: the bench's baseline — no record hook, no watch (only
    # the start-up scan indexes), so session.turn runs as if there were no search index
    no_search = os.environ.get("QWENCTXD_BENCH_NO_SEARCH_HOOK") == "1"
    # the chats directories are watched for closed writes only (watch/closed_writes.py: the
    # hub's every-event watch made each of the daemon's own appends cost a turn ~4 %)
    own_watch = closed_writes.available()
    search = SessionSearch(state / "session_search.sqlite",
                           projects_root=runtime_base_dir() / "projects",
                           hub=None if no_search else (
                               closed_writes.ClosedWriteWatch() if own_watch else hub),
                           own_watch=own_watch and not no_search)
    store = SessionStore(index_path=state / "sessions.sqlite", tasks=tasks,
                         record_hooks=[] if no_search else [search.recorded])
    sessions = SessionManager(config=config, instructions=instructions, model=the_model,
                              tasks=tasks, store=store)
    compactor = Compactor(sessions=sessions.sessions, store=store, instructions=instructions,
                          model=the_model, bus=bus)
    turns = TurnPipeline(
        sessions=sessions.sessions, store=store, instructions=instructions, model=the_model,
        tasks=tasks, bus=bus, compactor=compactor, skills=skills, memory=memory,
        user_turn_hooks=[lambda s: background.on_user_turn(s.project),
                         lambda s: speculation.abort_session(s.id)],
        turn_complete_hooks=[background.on_turn_complete],
    )
    return Services(config=config, bus=bus, tasks=tasks, hub=hub, model=model, projects=projects,
                    instructions=instructions, memory=memory, skills=skills, audit=audit,
                    extractor=extractor, reviewer=reviewer, speculation=speculation,
                    background=background, search=search, sessions=sessions, turns=turns)
