"""Shared fixtures: a spawned real daemon in a scratch HOME (one per test, or one per module for
tests that each work in a project of their own), and the scripted model server."""

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



@pytest.fixture(scope="module")
def module_daemon() -> Iterator[SpawnedDaemon]:
    """One running daemon with an empty scratch HOME, shared by a module's tests. For tests that
    each work in a fresh project of their own and assert nothing daemon-wide; a test that
    kills, restarts or reconfigures its daemon takes ``daemon`` instead."""
    d = SpawnedDaemon().start()
    try:
        yield d
    finally:
        d.cleanup()

