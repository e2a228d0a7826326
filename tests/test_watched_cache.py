"""WatchedCache (qwenctxd.watch.cache) with real files, a real WatchHub and a real task group:
random sequences of reads, invalidations, file edits and cancelled waiters never yield a value
that is stale once the edit has been seen, nor one published half-built."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.fsutil import atomic_write
from qwenctxd.tasks import TaskRegistry
from qwenctxd.testing.wait import until_async
from qwenctxd.watch import Watched, WatchedCache, WatchHub

SETTLE_S = 15.0  # a generous liveness bound, never a synchronisation point
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


@dataclass(eq=False)
class Built:
    """A value built in steps; ``complete`` is set by the load's last step only."""

    text: str
    parts: list[str] = field(default_factory=list)
    complete: bool = False


@dataclass
class Harness:
    cache: WatchedCache[str, Built]
    tasks: TaskRegistry
    hub: WatchHub
    file: Path
    load_delay_s: float = 0.0
    loads_started: int = 0


@asynccontextmanager
async def harness(directory: Path, **kw: object) -> AsyncIterator[Harness]:
    await anyio.Path(directory).mkdir(parents=True, exist_ok=True)
    file = directory / "value.txt"
    atomic_write(file, "v0")
    hub, tasks = WatchHub(), TaskRegistry()
    cache: WatchedCache[str, Built] = WatchedCache(hub, tasks, "test", **kw)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tasks.attach(tg)
        await tg.start(hub.run)
        try:
            yield Harness(cache, tasks, hub, file)
        finally:
            tasks.close()
            tasks.cancel_all()
            await tasks.drain(5)
            await cache.aclose()
            tg.cancel_scope.cancel()


def make_load(h: Harness) -> object:
    async def load() -> Watched[Built]:
        h.loads_started += 1
        text = await anyio.to_thread.run_sync(h.file.read_text)
        built = Built(text)
        built.parts.append(text[:1])
        await anyio.sleep(h.load_delay_s)  # sleep-ok: the window a cancellation can land in
        built.parts.append(text[1:])
        built.complete = True
        file = h.file
        return Watched(built, [file.parent], lambda p: p.name == file.name,
                       lambda: file.read_text() != text)

    return load


async def get(h: Harness) -> Built:
    value = await h.cache.get("k", make_load(h))  # type: ignore[arg-type]
    assert value.complete and "".join(value.parts) == value.text  # never half-built
    return value


async def until_fresh(h: Harness, text: str) -> None:
    """Wait (bounded) until the cache no longer offers anything but ``text``: the edit seen."""
    await until_async(lambda: (seen := h.cache.peek("k")) is None or seen.text == text,
                      timeout=SETTLE_S, what=f"the cache to offer only {text!r}")


async def settled(h: Harness, text: str) -> Built:
    """``get`` until it answers ``text`` (bounded): the watcher or the re-check saw the edit."""

    async def answer() -> Built | None:
        value = await get(h)
        return value if value.text == text else None

    return await until_async(answer, timeout=SETTLE_S, what=f"get() to answer {text!r}")


ops = st.lists(st.one_of(
    st.tuples(st.just("get"), st.just(0.0)),
    st.tuples(st.just("invalidate"), st.just(0.0)),
    st.tuples(st.just("write"), st.just(0.0)),
    st.tuples(st.just("settle"), st.just(0.0)),
    st.tuples(st.just("cancelled_get"), st.floats(0, 0.03)),
    st.tuples(st.just("slow"), st.floats(0, 0.03)),
), min_size=1, max_size=14)


def test_random_sequences_never_stale_once_seen_never_half_built(tmp_path: Path) -> None:
    counter = itertools.count()

    @PROPERTY
    @given(sequence=ops)
    def example(sequence: list[tuple[str, float]]) -> None:
        async def main() -> None:
            async with harness(tmp_path / f"case{next(counter)}") as h:
                history = ["v0"]  # every version written, oldest first
                newest_seen = -1  # index in history of the newest version a get returned

                def check(value: Built) -> None:
                    nonlocal newest_seen
                    index = history.index(value.text)  # only ever a version that was written
                    # once a version was seen, nothing older comes back
                    assert index >= newest_seen, (value.text, history[newest_seen])
                    newest_seen = index

                for op, arg in sequence:
                    if op == "get":
                        check(await get(h))
                    elif op == "invalidate":
                        h.cache.invalidate("k")
                        assert h.cache.peek("k") is None
                    elif op == "write":  # with loads possibly still in flight
                        history.append(f"v{len(history)}-" + "x" * (len(history) % 5))
                        atomic_write(h.file, history[-1])
                    elif op == "settle":
                        check(await settled(h, history[-1]))
                    elif op == "cancelled_get":  # the load goes on without its waiter
                        with anyio.move_on_after(arg):
                            check(await get(h))
                    elif op == "slow":
                        h.load_delay_s = arg
                    published = h.cache.peek("k")
                    assert published is None or published.complete
                # the cancellations poisoned nothing: the newest version is served
                check(await settled(h, history[-1]))
                for _ in range(3):
                    check(await get(h))
                    assert h.cache.peek("k") is not None

        anyio.run(main)

    example()


def test_edit_between_read_and_watch_is_caught_by_the_recheck(tmp_path: Path) -> None:
    async def main() -> None:
        async with harness(tmp_path / "race") as h:
            async def racing_load() -> Watched[Built]:
                built = Built("v0", ["v", "0"], True)
                atomic_write(h.file, "v1")  # after "reading", before the watch exists
                file = h.file
                return Watched(built, [file.parent], lambda p: p.name == file.name,
                               lambda: file.read_text() != "v0")

            assert (await h.cache.get("k", racing_load)).text == "v0"
            await until_fresh(h, "v1")
            assert (await get(h)).text == "v1"
            assert h.cache.stale_events >= 1

    anyio.run(main)


def test_on_stale_refreshes_instead_of_dropping(tmp_path: Path) -> None:
    refreshed: list[str] = []

    async def main() -> None:
        h_box: list[Harness] = []

        def on_stale(key: str, value: Built) -> None:
            refreshed.append(value.text)
            h = h_box[0]
            h.tasks.submit("refresh", lambda: h.cache.reload(key, make_load(h)), key="r")

        async with harness(tmp_path / "refresh", on_stale=on_stale) as h:
            h_box.append(h)
            assert (await get(h)).text == "v0"
            atomic_write(h.file, "v1")

            def refreshed_to_v1() -> bool:
                seen = h.cache.peek("k")
                assert seen is not None  # a refreshing cache keeps serving the old value
                return seen.text == "v1"

            await until_async(refreshed_to_v1, timeout=SETTLE_S, what="the refresh to v1")
            assert refreshed and refreshed[0] == "v0"
            assert h.hub.subscriptions()["test:k"] == frozenset({h.file.parent})

    anyio.run(main)


def test_forget_stops_watching(tmp_path: Path) -> None:
    async def main() -> None:
        async with harness(tmp_path / "forget") as h:
            await get(h)
            assert "test:k" in h.hub.subscriptions()
            h.cache.forget("k")
            assert "test:k" not in h.hub.subscriptions()
            assert h.cache.peek("k") is None

    anyio.run(main)
