"""The background-task registry: every job the daemon runs outside a request lives here, and
the shared loads (per-key work that callers wait for but cannot abort) run in its task group."""

from qwenctxd.tasks.registry import TaskOutcome, TaskRecord, TaskRegistry
from qwenctxd.tasks.shared_load import SharedLoads

__all__ = ["SharedLoads", "TaskOutcome", "TaskRecord", "TaskRegistry"]
