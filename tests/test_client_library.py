"""qwenctxd.client against a spawned daemon: the async client (concurrency, notifications,
both framings) and the sync client's errors."""

from __future__ import annotations

import anyio
import pytest

from qwenctxd.client import AsyncClient, Client, DaemonUnreachable, RemoteError
from qwenctxd.protocol.framing import Framing
from qwenctxd.testing.spawn import SpawnedDaemon


@pytest.mark.asyncio
@pytest.mark.parametrize("framing", [Framing.NDJSON, Framing.LSP])
async def test_async_client_concurrent_calls_and_notifications(spawn, framing: Framing) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = await anyio.to_thread.run_sync(
        lambda: spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start())
    async with AsyncClient(d.socket, framing=framing) as c:
        assert await c.call("daemon.subscribe", {"topics": ["background/progress"]}) == {"ok": True}
        results: list[object] = []

        async def ping() -> None:
            results.append(await c.call("daemon.ping"))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(ping)
        assert results == ["pong"] * 20
        task = await c.call("debug.sleep_task", {"seconds": 0.1, "kind": "extract"})
        states = []
        with anyio.fail_after(5):
            async for note in c.notifications():
                assert note["method"] == "background/progress"
                if note["params"]["id"] == task["task_id"]:
                    states.append(note["params"]["state"])
                if "completed" in states:
                    break
        assert states == ["started", "completed"]
        with pytest.raises(RemoteError) as exc:
            await c.call("daemon.drain", {"timeout_s": "x"})
        assert exc.value.code == -32602


@pytest.mark.asyncio
async def test_async_client_unreachable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DaemonUnreachable) as exc:
        async with AsyncClient(tmp_path / "none.sock"):
            pass
    assert "no socket file" in str(exc.value)


def test_sync_client_stale_socket_is_unreachable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    path = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # a socket file nobody listens on
    with pytest.raises(DaemonUnreachable) as exc:
        Client(path)
    assert "refused" in str(exc.value)


def test_watchdog_pings_reach_notify_socket(spawn) -> None:  # type: ignore[no-untyped-def]
    import socket

    d = spawn()
    notify_path = d.root / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(10)
    try:
        d.start(env={"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "200000"})
        seen = []
        while sum(1 for m in seen if m == b"WATCHDOG=1") < 3:
            seen.append(notify.recv(4096))
        assert any(m.startswith(b"READY=1") for m in seen)
    finally:
        notify.close()
