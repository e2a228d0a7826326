"""Process-wide redaction counters, reported as ``daemon.status`` ``secrets``.

``redacted_writes`` counts secrets replaced in project/user memory writes, ``redacted_out``
secrets replaced in memory text on its way to a model or client (each rendering counts, cached
or not), ``refused`` team-memory writes refused because they held a secret.
"""

from __future__ import annotations

import threading

__all__ = ["COUNTERS", "Counters"]


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.redacted_writes = 0
        self.redacted_out = 0
        self.refused = 0

    def add(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                setattr(self, name, getattr(self, name) + n)

    def reset(self) -> None:
        """Back to zero (a daemon run in-process starts with a fresh process's numbers)."""
        with self._lock:
            self.redacted_writes = self.redacted_out = self.refused = 0

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"redacted_writes": self.redacted_writes, "redacted_out": self.redacted_out,
                    "refused": self.refused}


COUNTERS = Counters()
