"""The error hierarchy: one exception class per JSON-RPC error code the daemon returns.

Subsystems raise these; the server turns them into JSON-RPC error objects. ``message`` is
shown to users as it is, so it must never carry secrets or internal exception text; ``data``
is structured detail a client may act on (a field name, a path, a pid, rule ids).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

# JSON-RPC 2.0 standard codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800  # LSP's RequestCancelled

# Domain codes (protocol.md, "Domain-specific error codes").
SESSION_NOT_FOUND = -32001
MODEL_UNAVAILABLE = -32002
PATH_OUTSIDE_PROJECT = -32003
SECRET_DETECTED = -32004
BUSY = -32005
LOCK_HELD = -32006
SYSTEM_PROMPT_FILE_ERROR = -32010


#: What a client can do about an error: ``caller`` — the request itself is wrong (fix it, do
#: not retry it as it is); ``retry_later`` — the daemon cannot serve it now (a drain, a held
#: lock, no model) and the same request may succeed later; ``daemon`` — neither (an internal
#: failure, a cancelled request). The client library groups its classes by it.
ErrorKind = Literal["caller", "retry_later", "daemon"]


class QwenctxdError(Exception):
    """Base of every error that reaches a client as a JSON-RPC error object."""

    code: int = INTERNAL_ERROR
    default_message: str = "Internal error"
    kind: ClassVar[ErrorKind] = "daemon"

    def __init__(self, message: str | None = None, data: Any = None) -> None:
        self.message = message or self.default_message
        self.data = data
        super().__init__(self.message)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` member for this exception."""
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


class ParseError(QwenctxdError):
    """The frame is not valid JSON."""

    code = PARSE_ERROR
    default_message = "Parse error"
    kind = "caller"


class InvalidRequest(QwenctxdError):
    """The frame is JSON but not a JSON-RPC 2.0 request (or it is over the frame cap)."""

    code = INVALID_REQUEST
    default_message = "Invalid Request"
    kind = "caller"


class MethodNotFound(QwenctxdError):
    """No method of that name is served."""

    code = METHOD_NOT_FOUND
    default_message = "Method not found"
    kind = "caller"


class InvalidParams(QwenctxdError):
    """Params do not match the method's struct; ``data.field`` names the offending field."""

    code = INVALID_PARAMS
    default_message = "Invalid params"
    kind = "caller"


class InternalError(QwenctxdError):
    """An unexpected failure inside the daemon; details go to the log, not to the client."""

    code = INTERNAL_ERROR
    default_message = "Internal error"


class RequestCancelled(QwenctxdError):
    """The request was cancelled by ``$/cancelRequest`` or ``rpc.cancel`` before it finished."""

    code = REQUEST_CANCELLED
    default_message = "Request cancelled"


class SessionNotFound(QwenctxdError):
    """Unknown session id."""

    code = SESSION_NOT_FOUND
    default_message = "Session not found"
    kind = "caller"


class ModelUnavailable(QwenctxdError):
    """The model endpoint is not configured, unreachable, timed out or answered unusably."""

    code = MODEL_UNAVAILABLE
    default_message = "Model unavailable"
    kind = "retry_later"


class PathOutsideProject(QwenctxdError):
    """A path parameter escapes the project root where that is refused."""

    code = PATH_OUTSIDE_PROJECT
    default_message = "Path outside project"
    kind = "caller"


class SecretDetected(QwenctxdError):
    """A write into team memory contains a secret; ``data`` lists rule ids, never the value."""

    code = SECRET_DETECTED
    default_message = "Secret detected"
    kind = "caller"


class Busy(QwenctxdError):
    """The daemon is draining or shutting down and takes no new work."""

    code = BUSY
    default_message = "Daemon is draining or shutting down"
    kind = "retry_later"


class LockHeld(QwenctxdError):
    """A dream/extract lock is held by a live process (``data.pid``)."""

    code = LOCK_HELD
    default_message = "Lock held by another process"
    kind = "retry_later"


Reason = Literal["missing", "empty", "unresolvable", "unreadable"]


class SystemPromptFileError(QwenctxdError):
    """A system prompt / identity file named by QWEN_SYSTEM_MD or QWEN_SYSTEM_IDENTITY_MD
    cannot be used; ``data`` names the path and the reason."""

    code = SYSTEM_PROMPT_FILE_ERROR
    default_message = "System prompt file error"
    kind = "caller"

    def __init__(self, message: str, *, path: str, reason: Reason) -> None:
        self.path = path
        self.reason = reason
        super().__init__(message, data={"path": path, "reason": reason})


# -- OS errors caused by a client-supplied path ---------------------------------------------
#: errno → what a client is told: the errors a path the client chose can cause. Only an OSError
#: tagged with the field it came from (:func:`client_path`) is mapped; an untagged one stays an
#: internal error (it is the daemon's own problem, e.g. its state dir).
PATH_ERRNOS: dict[int, str] = {
    errno.ENAMETOOLONG: "name too long",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "not a directory",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "no such file or directory",
    errno.EEXIST: "already exists",
    errno.EINVAL: "not a regular file",
    errno.EROFS: "read-only file system",
    errno.ENXIO: "no such device or address",
    errno.ETXTBSY: "text file busy",
}

_FIELD_ATTR = "qwenctxd_field"


@contextmanager
def client_path(field: str) -> Iterator[None]:
    """Tag every OSError raised inside with the param ``field`` whose path caused it.

    The innermost tag wins (a more precise caller already said which field). The server maps
    a tagged error whose errno is in :data:`PATH_ERRNOS` to -32602 naming the field
    (:func:`invalid_path`); this is the only way an OSError becomes a client error."""
    try:
        yield
    except OSError as exc:
        if getattr(exc, _FIELD_ATTR, None) is None:
            setattr(exc, _FIELD_ATTR, field)
        raise


def path_field(exc: BaseException) -> str | None:
    """The param field an OSError was tagged with by :func:`client_path`, if any."""
    field = getattr(exc, _FIELD_ATTR, None) if isinstance(exc, OSError) else None
    return field if isinstance(field, str) else None


def invalid_path(exc: OSError) -> InvalidParams | None:
    """The -32602 for a tagged OSError with a path errno; None when it is not a client's."""
    field = path_field(exc)
    reason = PATH_ERRNOS.get(exc.errno or 0)
    if field is None or reason is None:
        return None
    data: dict[str, Any] = {"field": field, "message": reason,
                            "errno": errno.errorcode.get(exc.errno or 0, str(exc.errno))}
    if isinstance(exc.filename, str) and len(exc.filename) <= 4096:
        data["path"] = exc.filename
    return InvalidParams(f"{field}: {reason}", data=data)


class ConfigError(Exception):
    """Invalid configuration: names the file, the key and the problem. Not a wire error."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        self.file, self.key, self.problem = file, key, problem
        super().__init__(f"{file}: {key}: {problem}")


ERROR_CLASSES: dict[int, type[QwenctxdError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        RequestCancelled,
        SessionNotFound,
        ModelUnavailable,
        PathOutsideProject,
        SecretDetected,
        Busy,
        LockHeld,
        SystemPromptFileError,
    )
}
