"""qwenctxd.testing.wait: until / until_async return the first truthy value, and running out
names what was awaited and the last value (or ignored exception) seen."""

from __future__ import annotations

import threading

import anyio
import pytest

from qwenctxd.testing.wait import WaitTimeout, until, until_async


def test_until_returns_the_first_truthy_value() -> None:
    values = iter([0, None, [], {"done": True}, "later"])
    assert until(lambda: next(values), what="a value") == {"done": True}


def test_until_waits_for_another_thread() -> None:
    box: list[int] = []
    timer = threading.Timer(0.05, box.append, (7,))
    timer.start()
    assert until(lambda: box, what="the timer") == [7]
    timer.join()


def test_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(WaitTimeout) as exc:
        until(lambda: {"state": "pending"}.get("missing", 0), timeout=0.05,
              what="the job to finish")
    assert isinstance(exc.value, AssertionError)
    assert "the job to finish" in str(exc.value) and "last seen: 0" in str(exc.value)
    assert exc.value.last == 0 and exc.value.timeout == 0.05


def test_ignored_exceptions_mean_not_yet_and_others_stop_at_once() -> None:
    calls = iter([ConnectionRefusedError("not up"), ConnectionRefusedError("not up"), "up"])

    def connect() -> str:
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    assert until(connect, ignoring=(ConnectionRefusedError,), what="the server") == "up"
    with pytest.raises(WaitTimeout, match="ConnectionRefusedError"):
        until(lambda: connect_refused(), timeout=0.05, ignoring=(OSError,), what="the server")
    with pytest.raises(KeyError):  # not ignored: propagates on the first call
        until(lambda: {}["x"], what="never")


def connect_refused() -> None:
    raise ConnectionRefusedError("still down")


def test_until_async_takes_plain_and_coroutine_predicates() -> None:
    async def main() -> None:
        seen = iter([False, False, True])
        assert await until_async(lambda: next(seen), what="plain") is True
        event = anyio.Event()

        async def set_later() -> None:
            await anyio.wait_all_tasks_blocked()
            event.set()

        async def is_set() -> bool:
            return event.is_set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(set_later)
            assert await until_async(is_set, what="the event") is True
        with pytest.raises(WaitTimeout, match="never set"):
            await until_async(anyio.Event().is_set, timeout=0.05, what="never set")

    anyio.run(main)
