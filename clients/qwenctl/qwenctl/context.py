"""What every qwenctl command is handed: the parsed arguments and the daemon connection.

Below ``cli.py`` and every ``*_cmds.py`` (they import it; it imports none of them), so the
entry point imports the commands and nothing imports the entry point. ``Ctx.request`` is the
typed call (``methods.X`` with its params struct in, its result struct out) — the only one:
the raw ``qwenctl call`` command sends through ``ctx.client().call``. ``emit_json`` writes one JSON document — a
result struct encodes to the same bytes the daemon sent for it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from qwenctl.daemon_link import connect

if TYPE_CHECKING:
    from qwenctxd.client import Client
    from qwenctxd.protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._client: Client | None = None

    def client(self, *, autostart: bool | None = None) -> Client:
        if self._client is None:
            auto = (not self.args.no_autostart) if autostart is None else autostart
            self._client = connect(self.args.socket, autostart=auto, timeout=self.args.timeout)
        return self._client

    def request(self, method: Method[P, R], params: P | None = None, *,
                autostart: bool | None = None) -> R:
        """The typed call of a table method: its result struct, or its RemoteError."""
        return self.client(autostart=autostart).request(method, params)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def wire(result: Any) -> Any:
    """A result struct in the daemon's JSON shape (builtins): for a ``--json`` document that
    merges a result with keys of its own, and for ``doctor``, whose report carries the wire
    fields as details."""
    return msgspec.to_builtins(result)


def emit_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
