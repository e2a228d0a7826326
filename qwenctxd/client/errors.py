"""Client-side errors: the daemon answered with an error, or could not be reached.

Every JSON-RPC error code the daemon returns has its class here, named as on the server
(:mod:`qwenctxd.protocol.errors`). Each is a :class:`RemoteError` — so ``except RemoteError``
catches them all — and also a subclass of the server's class of the same name, so
``except qwenctxd.protocol.errors.SessionNotFound`` works on either side of the socket. A code
without a class (a newer daemon) arrives as a plain ``RemoteError``.
"""

from __future__ import annotations

from typing import Any

from qwenctxd.protocol import errors as perrors


class ClientError(Exception):
    """Base of the client library's errors."""


class DaemonUnreachable(ClientError):
    """No daemon answers at the socket path (not running, stale socket, or refused)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"no qwenctxd answers at {path} ({reason})")


class ConnectionLost(ClientError):
    """The daemon closed the connection before answering."""


class RemoteError(ClientError):
    """A JSON-RPC error object returned by the daemon."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code, self.message, self.data = code, message, data
        Exception.__init__(self, f"[{code}] {message}")

    @classmethod
    def from_wire(cls, err: dict[str, Any]) -> RemoteError:
        """The error of ``err`` (a JSON-RPC ``error`` member) as its class, by code."""
        try:
            code = int(err.get("code", perrors.INTERNAL_ERROR))
        except (TypeError, ValueError):
            code = perrors.INTERNAL_ERROR
        klass = REMOTE_ERRORS.get(code, RemoteError)
        return klass(code, str(err.get("message", "")), err.get("data"))


class ParseError(RemoteError, perrors.ParseError):
    """The daemon could not parse the frame as JSON."""


class InvalidRequest(RemoteError, perrors.InvalidRequest):
    """The frame was not a JSON-RPC request (or over a limit)."""


class MethodNotFound(RemoteError, perrors.MethodNotFound):
    """The daemon serves no such method (``data`` is the name)."""


class InvalidParams(RemoteError, perrors.InvalidParams):
    """Params refused; ``data["field"]`` names the field."""


class InternalError(RemoteError, perrors.InternalError):
    """The daemon failed unexpectedly (``data["error_id"]`` finds it in the daemon log)."""


class RequestCancelled(RemoteError, perrors.RequestCancelled):
    """The request was cancelled (``rpc.cancel`` / ``$/cancelRequest``)."""


class SessionNotFound(RemoteError, perrors.SessionNotFound):
    """Unknown session id."""


class ModelUnavailable(RemoteError, perrors.ModelUnavailable):
    """The model endpoint is not configured, unreachable or unusable."""


class PathOutsideProject(RemoteError, perrors.PathOutsideProject):
    """A path escapes the project root."""


class SecretDetected(RemoteError, perrors.SecretDetected):
    """A team-memory write holds a secret (``data["rules"]``)."""


class Busy(RemoteError, perrors.Busy):
    """The daemon is draining or at a limit."""


class LockHeld(RemoteError, perrors.LockHeld):
    """A dream/extract lock is held (``data["pid"]``)."""


class SystemPromptFileError(RemoteError, perrors.SystemPromptFileError):
    """A system prompt file cannot be used (``path`` and ``reason`` from ``data``)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(code, message, data)
        info = data if isinstance(data, dict) else {}
        self.path = str(info.get("path", ""))
        self.reason = info.get("reason", "unreadable")


REMOTE_ERRORS: dict[int, type[RemoteError]] = {
    cls.code: cls
    for cls in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
                RequestCancelled, SessionNotFound, ModelUnavailable, PathOutsideProject,
                SecretDetected, Busy, LockHeld, SystemPromptFileError)
}
"""The client class of each code the daemon returns (``perrors.ERROR_CLASSES`` mirrored)."""
