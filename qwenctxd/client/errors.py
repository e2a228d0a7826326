"""Client-side errors: the daemon answered with an error, or could not be reached."""

from __future__ import annotations

from typing import Any


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
        super().__init__(f"[{code}] {message}")

    @classmethod
    def from_wire(cls, err: dict[str, Any]) -> RemoteError:
        return cls(int(err.get("code", -32603)), str(err.get("message", "")), err.get("data"))
