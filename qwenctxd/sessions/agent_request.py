"""What goes with a session's request to its agent's model: the system prompt it is sent
with, and the foreground mark on the session's model server while the agent waits for it
(side queries to the same server yield meanwhile: ``model/scheduler.py``)."""

from __future__ import annotations

from typing import Any

from qwenctxd.instructions.service import InstructionsService
from qwenctxd.model import ModelClient
from qwenctxd.sessions.state import Session


async def system_prompt(instructions: InstructionsService, s: Session) -> Any:
    """The system prompt of ``s``: its model, env, declared tools, agent identity and the git
    snapshot taken when it opened."""
    return await instructions.system_prompt(
        s.project, s.cwd, model=s.model, env=s.env, tool_roles=s.options.tool_roles,
        agent=(s.options.agent or {}).get("name"), git_snapshot=s.git_snapshot)


def begin_foreground(model: ModelClient, s: Session) -> None:
    """``s``'s agent is about to send the prompt just assembled to its model server."""
    sched = model.scheduler
    if sched is not None and s.model_base_url:
        sched.begin_foreground(s.model_base_url, s.id)


def end_foreground(model: ModelClient, s: Session) -> None:
    """``s``'s agent has its answer (or gave up)."""
    sched = model.scheduler
    if sched is not None:
        sched.end_foreground(s.id)
