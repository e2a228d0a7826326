"""The error hierarchy: one exception class per JSON-RPC error code the daemon returns.

Subsystems raise these; the server turns them into JSON-RPC error objects. ``message`` is
shown to users as it is, so it must never carry secrets or internal exception text; ``data``
is structured detail a client may act on (a field name, a path, a pid, rule ids).
"""

from __future__ import annotations

from typing import Any, Literal

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



class QwenctxdError(Exception):
    """Base of every error that reaches a client as a JSON-RPC error object."""

    code: int = INTERNAL_ERROR
    default_message: str = "Internal error"

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


class InvalidRequest(QwenctxdError):
    """The frame is JSON but not a JSON-RPC 2.0 request (or it is over the frame cap)."""

    code = INVALID_REQUEST
    default_message = "Invalid Request"


class MethodNotFound(QwenctxdError):
    """No method of that name is served."""

    code = METHOD_NOT_FOUND
    default_message = "Method not found"


class InvalidParams(QwenctxdError):
    """Params do not match the method's struct; ``data.field`` names the offending field."""

    code = INVALID_PARAMS
    default_message = "Invalid params"


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


class ModelUnavailable(QwenctxdError):
    """The model endpoint is not configured, unreachable, timed out or answered unusably."""

    code = MODEL_UNAVAILABLE
    default_message = "Model unavailable"


class PathOutsideProject(QwenctxdError):
    """A path parameter escapes the project root where that is refused."""

    code = PATH_OUTSIDE_PROJECT
    default_message = "Path outside project"


class SecretDetected(QwenctxdError):
    """A write into team memory contains a secret; ``data`` lists rule ids, never the value."""

    code = SECRET_DETECTED
    default_message = "Secret detected"


class Busy(QwenctxdError):
    """The daemon is draining or shutting down and takes no new work."""

    code = BUSY
    default_message = "Daemon is draining or shutting down"


class LockHeld(QwenctxdError):
    """A dream/extract lock is held by a live process (``data.pid``)."""

    code = LOCK_HELD
    default_message = "Lock held by another process"


Reason = Literal["missing", "empty", "unresolvable", "unreadable"]


class SystemPromptFileError(QwenctxdError):
    """A system prompt / identity file named by QWEN_SYSTEM_MD or QWEN_SYSTEM_IDENTITY_MD
    cannot be used; ``data`` names the path and the reason."""

    code = SYSTEM_PROMPT_FILE_ERROR
    default_message = "System prompt file error"

    def __init__(self, message: str, *, path: str, reason: Reason) -> None:
        self.path = path
        self.reason = reason
        super().__init__(message, data={"path": path, "reason": reason})


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
