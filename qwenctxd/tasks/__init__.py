"""The background-task registry: every job the daemon runs outside a request lives here."""

from qwenctxd.tasks.registry import TaskOutcome, TaskRecord, TaskRegistry

__all__ = ["TaskOutcome", "TaskRecord", "TaskRegistry"]
