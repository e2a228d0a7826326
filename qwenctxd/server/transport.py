"""Socket I/O for the daemon: listen, accept, and each accepted connection as a
:class:`~qwenctxd.socket_io.SocketConnection` (asyncio's protocol layer; shared with the async
client)."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import structlog

from qwenctxd.socket_io import SocketConnection

log = structlog.get_logger("qwenctxd.transport")

ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


class SocketInUse(Exception):
    def __init__(self, path: Path) -> None:
        super().__init__(f"another process is serving on {path}")


# -- listening --------------------------------------------------------------------------------
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


def bind(path: Path, backlog: int = 4096) -> socket.socket:
    """A listening socket at ``path``, created 0600 (bound under umask 077: no window)."""
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o077)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def adopt(fd: int) -> socket.socket:
    """The listening socket systemd passed as ``fd`` (never unlinked by us)."""
    sock = socket.socket(fileno=fd)
    if sock.type != socket.SOCK_STREAM or sock.family != socket.AF_UNIX:
        sock.detach()
        raise ValueError(f"inherited fd {fd} is not a Unix stream socket")
    sock.setblocking(False)
    return sock


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return pid, uid, gid


async def accept_loop(
    listening: socket.socket,
    handler: Callable[[SocketConnection, int], Awaitable[None]],
    connections: anyio.abc.TaskGroup,
    *,
    max_connections: Callable[[], int],
    evict_idle: Callable[[], bool] = lambda: False,
    busy_reply: bytes = b"",
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept until cancelled; ``handler(conn, peer_uid)`` runs per connection in
    ``connections``. Past ``max_connections()`` open connections, ``evict_idle()`` may close
    one that never sent a frame; if none, the new connection gets ``busy_reply`` and is closed
    (never queued: a full daemon answers at once). Backs off on EMFILE instead of spinning.
    """
    loop = asyncio.get_running_loop()
    active = 0

    async def run(sock: socket.socket) -> None:
        nonlocal active
        conn: SocketConnection | None = None
        try:
            try:
                _, uid, _ = peer_credentials(sock)
            except OSError:
                uid = -1
            conn = await SocketConnection.wrap(sock)
            await handler(conn, uid)
        except Exception:
            log.exception("connection handler crashed")
        finally:
            if conn is not None:
                conn.close()
            else:
                sock.close()
            active -= 1

    task_status.started()
    while True:
        if listening.fileno() < 0:
            # shutdown closed the listener while a connection was being accepted: the scope's
            # cancellation has not landed yet, and accepting on a closed socket raises
            # ValueError (uvloop) — which crashed the shutdown and left the process unable
            # to exit (its database threads never closed)
            return
        try:
            sock, _ = await loop.sock_accept(listening)
        except OSError as exc:
            if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                log.warning("accept: out of resources; backing off", errno=exc.errno)
                await anyio.sleep(0.1)
                continue
            raise
        if active >= max_connections() and not evict_idle():
            refuse(sock, busy_reply)
            continue
        active += 1
        connections.start_soon(run, sock)


def refuse(sock: socket.socket, reply: bytes) -> None:
    """Best-effort one-shot reply (never blocks), then close."""
    try:
        sock.setblocking(False)
        if reply:
            sock.send(reply)
    except OSError:
        pass
    finally:
        sock.close()
