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


def bind(path: Path, backlog: int = 512) -> socket.socket:
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
    max_connections: int,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept until cancelled; ``handler(conn, peer_uid_ok)`` runs per connection in
    ``connections``. Caps concurrent connections and backs off on EMFILE instead of spinning.
    """
    loop = asyncio.get_running_loop()
    slots = anyio.Semaphore(max_connections)

    async def run(sock: socket.socket) -> None:
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
            slots.release()

    task_status.started()
    while True:
        await slots.acquire()
        try:
            sock, _ = await loop.sock_accept(listening)
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
        connections.start_soon(run, sock)


# -- one connection ---------------------------------------------------------------------------
class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
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
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        d = self.drain_waiter
        if d is not None and not d.done():
            d.set_result(None)


class SocketConnection:
    """Buffered frame I/O over one accepted socket (same errors as anyio's buffered stream)."""

    def __init__(self, transport: asyncio.Transport, proto: _Protocol) -> None:
        self._transport = transport
        self._p = proto

    @classmethod
    async def wrap(cls, sock: socket.socket) -> SocketConnection:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.connect_accepted_socket(_Protocol, sock)
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

    def unread(self, data: bytes) -> None:
        self._p.buffer[:0] = data

    async def receive_until(self, delimiter: bytes, max_bytes: int) -> bytes:
        p = self._p
        offset = 0
        while True:
            idx = p.buffer.find(delimiter, offset)
            if idx >= 0:
                found = bytes(p.buffer[:idx])
                del p.buffer[: idx + len(delimiter)]
                return found
            if len(p.buffer) >= max_bytes:
                raise anyio.DelimiterNotFound(max_bytes)
            offset = max(len(p.buffer) - len(delimiter) + 1, 0)
            await self._fill()

    async def receive_exactly(self, n: int) -> bytes:
        p = self._p
        while len(p.buffer) < n:
            await self._fill()
        data = bytes(p.buffer[:n])
        del p.buffer[:n]
        return data

    async def send(self, data: bytes) -> None:
        t = self._transport
        if t.is_closing():
            raise anyio.BrokenResourceError
        t.write(data)
        p = self._p
        if p.write_paused:
            p.drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await p.drain_waiter
            finally:
                p.drain_waiter = None
            if t.is_closing():
                raise anyio.BrokenResourceError

    def close(self) -> None:
        self._transport.close()
