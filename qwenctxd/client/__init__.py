"""The qwenctxd client library: a blocking ``Client`` and an anyio ``AsyncClient``.

Both speak either framing. ``request(methods.SESSION_TURN, TurnParams(...))`` is the typed
call, driven by the method table (:mod:`qwenctxd.protocol.methods`); ``call(name, params)`` the
raw one. Errors: ``RemoteError`` (the daemon's JSON-RPC error, with code, message and data) —
raised as its subclass per code (``SessionNotFound``, ``InvalidParams``, ``Busy``, … see
:mod:`qwenctxd.client.errors`) — or ``DaemonUnreachable`` / ``ConnectionLost``. ``Client``
imports no anyio, for fast CLIs. Typed notification payloads: ``qwenctxd.protocol.notifications``.
``SessionHistory`` keeps a session's message list from incremental ``session.turn`` replies
(``known``).
"""

from qwenctxd.client.errors import (
    Busy,
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
    SecretDetected,
    SessionNotFound,
    SystemPromptFileError,
)
from qwenctxd.client.history import SessionHistory
from qwenctxd.client.sync import Client, call

__all__ = [
    "AsyncClient",
    "Busy",
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
    "SecretDetected",
    "SessionHistory",
    "SessionNotFound",
    "SystemPromptFileError",
    "call",
]


def __getattr__(name: str) -> object:
    if name == "AsyncClient":
        from qwenctxd.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(name)
