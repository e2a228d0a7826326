"""RPC method handlers, one module per method family; ``register_all`` wires them in."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon


def register_all(daemon: Daemon) -> None:
    from qwenctxd.server.methods import (
        daemon_methods,
        instructions_methods,
        memory_methods,
        model_methods,
        search_methods,
        session_methods,
        skill_review_methods,
        skills_methods,
        speculation_methods,
        transcript_methods,
    )

    daemon_methods.register(daemon)
    instructions_methods.register(daemon)
    session_methods.register(daemon)
    skills_methods.register(daemon)
    skill_review_methods.register(daemon)
    memory_methods.register(daemon)
    model_methods.register(daemon)
    speculation_methods.register(daemon)
    transcript_methods.register(daemon)
    search_methods.register(daemon)
    if os.environ.get("QWENCTXD_DEBUG_METHODS") == "1":
        from qwenctxd.server.methods import debug_methods

        debug_methods.register(daemon)
