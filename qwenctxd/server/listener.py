"""The listening socket: bind safely (or adopt systemd's), then accept with back-off.

Binding happens only after the pid lock is held, so any socket file found at the path is stale;
it is still connect-tested before it is unlinked, and the bind runs under umask 077 so the
socket is never briefly world-accessible. An adopted socket (socket activation) is never
unlinked. The accept loop caps concurrent connections and sleeps on EMFILE/ENFILE instead of
spinning.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream

log = structlog.get_logger("qwenctxd.listener")

ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class SocketInUse(Exception):
    def __init__(self, path: Path) -> None:
        super().__init__(f"another process is serving on {path}")


def socket_answers(path: Path) -> bool:
    """True if something accepts connections at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def remove_stale_socket(path: Path) -> bool:
    """Unlink a leftover socket file at ``path`` after proving nobody answers on it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; refusing to remove it")
    if socket_answers(path):
        raise SocketInUse(path)
    os.unlink(path)
    log.info("removed stale socket", path=str(path))
    return True


async def bind(path: Path) -> SocketListener:
    remove_stale_socket(path)
    old = os.umask(0o077)
    try:
        listener = await anyio.create_unix_listener(path, mode=0o600, backlog=512)
    finally:
        os.umask(old)
    return listener


async def adopt(fd: int) -> SocketListener:
    return await SocketListener.from_socket(fd)


async def accept_loop(
    listener: SocketListener,
    handler: Callable[[SocketStream], Awaitable[None]],
    connections: anyio.abc.TaskGroup,
    *,
    max_connections: int,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept until cancelled; each connection runs ``handler`` as a task in ``connections``.

    Connections live in a task group of their own so that cancelling the accept loop (the
    first step of a shutdown) stops new clients while replies in flight still go out.
    """
    slots = anyio.Semaphore(max_connections)

    async def run(stream: SocketStream) -> None:
        try:
            async with stream:
                await handler(stream)
        except Exception:
            log.exception("connection handler crashed")
        finally:
            slots.release()

    task_status.started()
    while True:
        await slots.acquire()
        try:
            stream = await listener.accept()
        except OSError as exc:
            slots.release()
            if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                log.warning("accept: out of resources; backing off", errno=exc.errno)
                await anyio.sleep(0.1)
                continue
            raise
        except BaseException:
            slots.release()
            raise
        connections.start_soon(run, stream)
