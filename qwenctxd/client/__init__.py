"""The qwenctxd client library: a blocking ``Client`` and an anyio ``AsyncClient``.

Both speak either framing. ``request(methods.SESSION_TURN, TurnParams(...))`` is the typed
call, driven by the method table (:mod:`qwenctxd.protocol.methods`); ``call(name, params)`` the
raw one. Both are thin fronts over one transport seam (:mod:`qwenctxd.client.transport`): pass
``transport=`` to drive a socket connected elsewhere (``SocketTransport.connected(sock)``).
Errors: ``RemoteError`` (the daemon's JSON-RPC error, with code, message and data) — raised as
its subclass per code (generated from the server's table, see :mod:`qwenctxd.client.errors`),
grouped by kind: ``RetryLater`` (``Busy``, ``LockHeld``, ``ModelUnavailable``) and
``CallerError`` (``InvalidParams``, ``SessionNotFound``, …) — or ``DaemonUnreachable`` /
``ConnectionLost``. ``Client`` imports no anyio, for fast CLIs. Typed notification payloads: ``qwenctxd.protocol.notifications``.
``SessionHistory`` keeps a session's message list from incremental ``session.turn`` replies
(``known``).
"""

from qwenctxd.client.errors import (
    Busy,
    CallerError,
    ClientError,
    ConnectionLost,
    DaemonUnreachable,
    InternalError,
    InvalidParams,
    InvalidRequest,
    LockHeld,
    MethodNotFound,
    ModelUnavailable,
    ParseError,
    PathOutsideProject,
    RemoteError,
    RequestCancelled,
    RetryLater,
    SecretDetected,
    SessionNotFound,
    SystemPromptFileError,
)
from qwenctxd.client.history import SessionHistory
from qwenctxd.client.sync import Client, call
from qwenctxd.client.transport import SocketTransport

__all__ = [
    "AsyncClient",
    "Busy",
    "CallerError",
    "Client",
    "ClientError",
    "ConnectionLost",
    "DaemonUnreachable",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "LockHeld",
    "MethodNotFound",
    "ModelUnavailable",
    "ParseError",
    "PathOutsideProject",
    "RemoteError",
    "RequestCancelled",
    "RetryLater",
    "SecretDetected",
    "SessionHistory",
    "SessionNotFound",
    "SocketTransport",
    "StreamTransport",
    "SystemPromptFileError",
    "call",
]


def __getattr__(name: str) -> object:
    """The anyio side, imported on first use (``Client`` alone never imports anyio)."""
    if name == "AsyncClient":
        from qwenctxd.client.aio import AsyncClient

        return AsyncClient
    if name == "StreamTransport":
        from qwenctxd.client.aio_transport import StreamTransport

        return StreamTransport
    raise AttributeError(name)
