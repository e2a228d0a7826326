"""The qwenctxd client library: a blocking ``Client`` and an anyio ``AsyncClient``.

Both speak either framing and raise ``RemoteError`` (the daemon's JSON-RPC error, with code,
message and data) or ``DaemonUnreachable``. ``Client`` imports no anyio, for fast CLIs. ``SessionHistory`` keeps a session's
message list from incremental ``session.turn`` replies (``known``).
"""

from qwenctxd.client.errors import ClientError, ConnectionLost, DaemonUnreachable, RemoteError
from qwenctxd.client.history import SessionHistory
from qwenctxd.client.sync import Client, call

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "ConnectionLost",
    "DaemonUnreachable",
    "RemoteError",
    "SessionHistory",
    "call",
]


def __getattr__(name: str) -> object:
    if name == "AsyncClient":
        from qwenctxd.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(name)
