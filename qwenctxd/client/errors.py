"""Client-side errors: the daemon answered with an error, or could not be reached.

The mirror of the server's error table (:data:`qwenctxd.protocol.errors.ERROR_CLASSES`) is
generated from it, not written a second time: every code gets one class here, named as on the
server. Each is a :class:`RemoteError` — so ``except RemoteError`` catches them all — and also
a subclass of the server's class of the same name, so ``except
qwenctxd.protocol.errors.SessionNotFound`` works on either side of the socket. A code without
a class (a newer daemon) arrives as a plain ``RemoteError``.

The classes are grouped by what a caller can do about them (the server class's ``kind``):

* :class:`RetryLater` — the same request may succeed later: ``Busy`` (draining, at a limit),
  ``LockHeld`` (a dream/extract lock, ``data["pid"]``), ``ModelUnavailable``;
* :class:`CallerError` — the request is wrong: ``ParseError``, ``InvalidRequest``,
  ``MethodNotFound``, ``InvalidParams`` (``data["field"]`` names the field),
  ``SessionNotFound``, ``PathOutsideProject``, ``SecretDetected`` (``data["rules"]``),
  ``SystemPromptFileError`` (``.path`` and ``.reason`` from ``data``);
* neither: ``InternalError`` (``data["error_id"]`` finds it in the daemon log),
  ``RequestCancelled``.

Without a daemon: :class:`DaemonUnreachable` (connecting failed) and :class:`ConnectionLost`
(the connection ended before the reply).
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


class RetryLater(RemoteError):
    """The daemon cannot serve the request now; the same request may succeed later."""


class CallerError(RemoteError):
    """The request is wrong (its frame, method, params or target); retrying it will not help."""


KIND_BASES: dict[perrors.ErrorKind, type[RemoteError]] = {
    "retry_later": RetryLater,
    "caller": CallerError,
    "daemon": RemoteError,
}


class _PathAndReason:
    """``path`` and ``reason`` of a system prompt file error, read from ``data``."""

    data: Any

    @property
    def path(self) -> str:
        info = self.data if isinstance(self.data, dict) else {}
        return str(info.get("path", ""))

    @property
    def reason(self) -> str:
        info = self.data if isinstance(self.data, dict) else {}
        return str(info.get("reason", "unreadable"))


#: codes whose client class reads more than code/message/data out of the wire error
_EXTRA_MIXINS: dict[int, tuple[type, ...]] = {perrors.SYSTEM_PROMPT_FILE_ERROR: (_PathAndReason,)}


def mirror(server_cls: type[perrors.QwenctxdError]) -> type[RemoteError]:
    """The client class of ``server_cls``: same name and docstring, a subclass of both the
    kind's base (:data:`KIND_BASES`) and the server class, built from the wire's
    (code, message, data)."""
    bases = (*_EXTRA_MIXINS.get(server_cls.code, ()), KIND_BASES[server_cls.kind], server_cls)
    return type(server_cls.__name__, bases, {
        "__doc__": server_cls.__doc__,
        "__module__": __name__,
        "__init__": RemoteError.__init__,
    })


REMOTE_ERRORS: dict[int, type[RemoteError]] = {
    code: mirror(cls) for code, cls in perrors.ERROR_CLASSES.items()
}
"""The client class of each code the daemon returns, generated from ``perrors.ERROR_CLASSES``."""

# the generated classes by name, for importers and readers (a test checks them against the table)
ParseError = REMOTE_ERRORS[perrors.PARSE_ERROR]
InvalidRequest = REMOTE_ERRORS[perrors.INVALID_REQUEST]
MethodNotFound = REMOTE_ERRORS[perrors.METHOD_NOT_FOUND]
InvalidParams = REMOTE_ERRORS[perrors.INVALID_PARAMS]
InternalError = REMOTE_ERRORS[perrors.INTERNAL_ERROR]
RequestCancelled = REMOTE_ERRORS[perrors.REQUEST_CANCELLED]
SessionNotFound = REMOTE_ERRORS[perrors.SESSION_NOT_FOUND]
ModelUnavailable = REMOTE_ERRORS[perrors.MODEL_UNAVAILABLE]
PathOutsideProject = REMOTE_ERRORS[perrors.PATH_OUTSIDE_PROJECT]
SecretDetected = REMOTE_ERRORS[perrors.SECRET_DETECTED]
Busy = REMOTE_ERRORS[perrors.BUSY]
LockHeld = REMOTE_ERRORS[perrors.LOCK_HELD]
SystemPromptFileError = REMOTE_ERRORS[perrors.SYSTEM_PROMPT_FILE_ERROR]
