"""Socket I/O for the daemon on asyncio's protocol layer: listen, accept, buffered frames.

anyio's Unix socket streams register and unregister the fd with the loop and yield a
checkpoint on every receive and send; at editor-scale request rates that was most of a ping's
cost. Here each connection is an asyncio Protocol whose reader stays registered: received
bytes land in a buffer and wake at most one waiting reader; writes go straight to the
transport, with flow control. Structure (task groups, cancellation) stays with anyio — the
waits are plain futures, so anyio cancel scopes cancel them as usual.
"""

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

log = structlog.get_logger("qwenctxd.transport")

ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
READ_HIGH_WATER = 4 * 1024 * 1024  # pause reading while this much is buffered unread
WRITE_HIGH_WATER = 8 * 1024 * 1024  # unsent reply bytes past which a connection is not read


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


# -- one connection ---------------------------------------------------------------------------
class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.waiter: asyncio.Future[None] | None = None
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.write_paused = False
        self.read_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > READ_HIGH_WATER and not self.read_paused and self.transport:
            self.transport.pause_reading()
            self.read_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return True  # half-close: replies to what was sent still go out; we close at the end

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiters, self.drain_waiters = self.drain_waiters, []
        for d in waiters:
            if not d.done():
                d.set_result(None)


class SocketConnection:
    """Byte I/O over one accepted socket (same errors as anyio's streams); frames are cut by
    ``qwenctxd.protocol.framing.FrameDecoder``."""

    def __init__(self, transport: asyncio.Transport, proto: _Protocol) -> None:
        self._transport = transport
        self._p = proto

    @classmethod
    async def wrap(cls, sock: socket.socket) -> SocketConnection:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.connect_accepted_socket(_Protocol, sock)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        return cls(transport, proto)

    async def _fill(self) -> None:
        """Wait for more bytes; IncompleteRead at end of stream."""
        p = self._p
        if p.eof:
            raise anyio.IncompleteRead
        if p.read_paused and self._transport is not None:
            p.read_paused = False
            self._transport.resume_reading()
        p.waiter = asyncio.get_running_loop().create_future()
        try:
            await p.waiter
        finally:
            p.waiter = None

    async def receive_some(self) -> bytes:
        """Whatever is buffered (waiting for at least one byte)."""
        p = self._p
        while not p.buffer:
            await self._fill()
        data = bytes(p.buffer)
        p.buffer.clear()
        return data

    async def send(self, data: bytes) -> None:
        t = self._transport
        if t.is_closing():
            raise anyio.BrokenResourceError
        t.write(data)
        p = self._p
        if p.write_paused:  # several request tasks may wait here at once
            waiter = asyncio.get_running_loop().create_future()
            p.drain_waiters.append(waiter)
            await waiter
            if t.is_closing():
                raise anyio.BrokenResourceError

    async def wait_writable(self) -> None:
        """Wait while the unsent bytes are past the write high-water mark."""
        p = self._p
        while p.write_paused and not self._transport.is_closing():
            waiter = asyncio.get_running_loop().create_future()
            p.drain_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        self._transport.close()
