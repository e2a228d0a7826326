"""The test harness itself: a restart on the same scratch tree is not killed by the first
daemon's cleanup, and that cleanup does not wait out a zombie."""

from __future__ import annotations

import time

from qwenctxd.testing.spawn import SpawnedDaemon, wait_until


def test_first_cleanup_spares_a_restart_on_the_same_tree(spawn) -> None:  # type: ignore[no-untyped-def]
    first: SpawnedDaemon = spawn().start()
    first.stop()
    second: SpawnedDaemon = spawn(root=first.root).start()
    assert second.call("daemon.ping") == "pong"
    t0 = time.monotonic()
    first._own_root = False  # keep the tree: the second daemon still serves from it
    first.cleanup()
    assert time.monotonic() - t0 < 2  # no wait for a zombie
    assert second.proc is not None and second.proc.poll() is None
    assert second.call("daemon.ping") == "pong"


def test_wait_until_returns_the_value_or_names_what_timed_out() -> None:
    seen = iter([0, 0, 7])
    assert wait_until(lambda: next(seen), timeout=5) == 7
    try:
        wait_until(lambda: False, timeout=0.05, what="nothing")
    except AssertionError as exc:
        assert "nothing" in str(exc)
    else:
        raise AssertionError("wait_until must fail after its timeout")
