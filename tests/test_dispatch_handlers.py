"""Handlers are bound at their definition (``@handler(methods.X)``) and the handler families,
built over the composed services, serve the method table exactly: every entry once, the
``debug.*`` entries only when asked."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

from qwenctxd.protocol import daemon as wire
from qwenctxd.protocol import methods

with warnings.catch_warnings():  # jsonrpcserver reads its schema with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from qwenctxd.server.dispatch import Dispatcher, handler, specs_of
    from qwenctxd.server.handlers import handler_families


class Family:
    def __init__(self, answer: str) -> None:
        self.answer = answer

    @handler(methods.DAEMON_PING, quiet=True, inline=True)
    async def ping(self, ctx: Any, p: wire.Empty) -> str:
        return self.answer

    @handler(methods.RPC_CANCEL, inline=True)
    @handler(methods.CANCEL_REQUEST, inline=True)
    async def cancel(self, ctx: Any, p: wire.CancelParams) -> wire.CancelResult:
        return wire.CancelResult(cancelled=False)

    async def not_served(self, ctx: Any, p: wire.Empty) -> None:
        return None


def test_marked_methods_are_bound_to_the_instance() -> None:
    specs = specs_of(Family("pong from this instance"))
    assert [s.name for s in specs] == ["daemon.ping", "$/cancelRequest", "rpc.cancel"]
    ping = specs[0]
    assert (ping.params, ping.result, ping.quiet, ping.inline) == (
        wire.Empty, methods.DAEMON_PING.result, True, True)
    assert ping.handler.__self__.answer == "pong from this instance"  # type: ignore[attr-defined]
    assert specs[1].handler == specs[2].handler  # one function, two table entries


def test_a_dispatcher_built_from_the_marks_answers() -> None:
    import anyio

    d = Dispatcher()
    d.register_all(specs_of(Family("pong")))
    reply = anyio.run(d.dispatch, b'{"jsonrpc":"2.0","method":"daemon.ping","id":7}', None)
    assert reply == b'{"jsonrpc":"2.0","result":"pong","id":7}'
    assert d.inline == {"daemon.ping", "rpc.cancel", "$/cancelRequest"}


def served(debug: bool) -> list[str]:
    services = SimpleNamespace(**{name: object() for name in (
        "config", "bus", "tasks", "hub", "model", "projects", "instructions", "memory",
        "skills", "audit", "extractor", "reviewer", "speculation", "background", "search", "sessions",
        "turns")})
    families = handler_families(services, control=object(),  # type: ignore[arg-type]
                                dispatcher=Dispatcher(), debug=debug)
    return [spec.name for family in families for spec in specs_of(family)]


def test_the_families_serve_the_table_once_each() -> None:
    names = served(debug=False)
    assert sorted(names) == sorted(methods.METHODS)
    assert len(names) == len(set(names))


def test_the_debug_family_comes_on_top_when_asked() -> None:
    assert sorted(served(debug=True)) == sorted([*methods.METHODS, *methods.DEBUG_METHODS])
