"""The daemon's accept loop ends when shutdown has closed its listener: accepting again on
the closed socket raised ValueError under uvloop, which crashed the shutdown and left the
process unable to exit (a database thread never closed)."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest

from qwenctxd.server import transport

handled: list[int] = []


async def handler(conn: transport.SocketConnection, uid: int) -> None:
    handled.append(uid)
    conn.close()


# uvloop: the daemon's loop, whose accept raised the ValueError
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True}), "asyncio"])
@pytest.mark.anyio
async def test_the_accept_loop_ends_when_its_listener_is_closed(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen(4)
    listener.setblocking(False)
    listener.close()  # shutdown closed it before the loop came round again
    ended = False
    async with anyio.create_task_group() as conns:
        with anyio.fail_after(5):
            await transport.accept_loop(listener, handler, conns, max_connections=lambda: 4)
            ended = True
    assert ended and handled == []  # it returned (no ValueError), having accepted nothing
