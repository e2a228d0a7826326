"""Shared fixtures: a spawned real daemon in a scratch HOME (one per test, or one per module for
tests that each work in a project of their own; forked from the pre-imported
:mod:`qwenctxd.testing.forkserver`), the daemon's services served in-process for handler tests
(``inprocess_daemon``), and the scripted model server; and a guard
that fails the run when the suite left anything outside its tmp dirs (see
:mod:`qwenctxd.testing.leaks` for what is checked and why that scope)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from qwenctxd.testing import forkserver, leaks
from qwenctxd.testing import spawn as spawn_mod
from qwenctxd.testing.inprocess import InProcessDaemon
from qwenctxd.testing.spawn import SpawnedDaemon

#: The HOME the suite was started with, read before any test points HOME at a scratch tree.
REAL_HOME = Path(os.environ.get("HOME") or os.path.expanduser("~"))

pytest_plugins = ["qwenctxd.testing.pytest_fixtures"]

# daemons and qwenctl runs of this suite fork from a pre-imported zygote (real processes, no
# interpreter start-up each); QWENCTXD_TEST_FORKSERVER=0 makes them fresh interpreters again
forkserver.enable()


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



@pytest.fixture
def inprocess_daemon() -> Iterator[InProcessDaemon]:
    """The daemon's services and dispatcher in this process, for an empty scratch HOME,
    reached by ``client()``/``call()`` without a socket (:mod:`qwenctxd.testing.inprocess`).
    For handler tests that only call methods and check results; a test about the process, the
    socket, framing on the wire, signals or its log takes ``daemon`` instead."""
    with InProcessDaemon() as d:
        yield d


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """The zygote daemons and qwenctl runs fork from, started at once so that its imports
    overlap the first tests; stopped at the end (what it forked was stopped by its tests)."""
    if forkserver.enabled():
        forkserver.zygote()
    yield
    forkserver.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_outside_tmp() -> Iterator[None]:
    """Fails the session when it created something new in ``/``, the real HOME or the top of
    /tmp (beyond pytest's own dirs): every test writes below its tmp dirs only."""
    watches = leaks.default_watches(REAL_HOME, lambda: set(spawn_mod.CREATED_ROOTS))
    before = leaks.snapshot(watches)
    yield
    # the harness's own scratch trees: a daemon a test restarted on one (or a client's
    # autostart) may outlive the test's cleanup; reap it and remove the tree before judging
    spawn_mod.remove_leftover_roots()
    left = leaks.leaks(before, watches)
    if left:
        pytest.fail(f"the test run left files outside its tmp dirs: {left}", pytrace=False)
