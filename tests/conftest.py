"""Shared fixtures: a spawned real daemon in a scratch HOME, and the scripted model server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qwenctxd.testing.spawn import SpawnedDaemon

pytest_plugins = ["qwenctxd.testing.pytest_fixtures"]


@pytest.fixture
def spawn() -> Iterator[type[SpawnedDaemon]]:
    """A factory for daemons; every daemon it made is stopped and its tree removed after."""
    made: list[SpawnedDaemon] = []

    class _Tracked(SpawnedDaemon):
        def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, **kw)
            made.append(self)

    yield _Tracked
    for d in made:
        d.cleanup()


@pytest.fixture
def daemon(spawn: type[SpawnedDaemon]) -> SpawnedDaemon:
    """A running daemon with an empty scratch HOME."""
    return spawn().start()
