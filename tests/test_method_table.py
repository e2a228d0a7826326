"""One method table (qwenctxd/protocol/methods.py) for dispatch, ``rpc.discover`` and the
typed client: what the daemon's dispatcher serves is exactly the table, its OpenRPC result schemas
are the table's result types, and the server refuses to serve a method the table lacks."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import msgspec
import pytest

from qwenctxd.protocol import methods
from qwenctxd.protocol.daemon import Empty
from qwenctxd.testing.inprocess import InProcessDaemon

with warnings.catch_warnings():  # jsonrpcserver reads its schema with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from qwenctxd.server.discover import REF_TEMPLATE
    from qwenctxd.server.dispatch import Dispatcher, MethodSpec, bind


async def _handler(ctx: Any, p: Any) -> str:
    return "pong"


def served(d: InProcessDaemon) -> dict[str, Any]:
    return {m["name"]: m for m in d.call("rpc.discover")["methods"]}


@pytest.fixture
def daemon(inprocess_daemon: InProcessDaemon) -> InProcessDaemon:
    """This module's handler tests need no process: they run on the in-process daemon."""
    return inprocess_daemon


def test_served_methods_are_exactly_the_table(daemon: InProcessDaemon) -> None:
    assert set(served(daemon)) == set(methods.METHODS)
    hello = daemon.call("daemon.hello")
    assert {c for c in hello["capabilities"] if "." in c or c.startswith("$/")} - {
        "framing.ndjson", "framing.lsp"} == set(methods.METHODS)


def test_debug_methods_come_from_the_table_too() -> None:
    with InProcessDaemon(env={"QWENCTXD_DEBUG_METHODS": "1"}) as d:
        assert set(served(d)) == set(methods.METHODS) | set(methods.DEBUG_METHODS)


def test_discover_result_schemas_are_the_table_result_types(daemon: InProcessDaemon) -> None:
    doc = daemon.call("rpc.discover")
    by_name = {m["name"]: m for m in doc["methods"]}
    entries = sorted(methods.METHODS.values(), key=lambda m: m.name)
    schemas, components = msgspec.json.schema_components(
        [m.result for m in entries], ref_template=REF_TEMPLATE)
    for entry, schema in zip(entries, schemas, strict=True):
        assert by_name[entry.name]["result"]["schema"] == schema, entry.name
        assert schema, f"{entry.name} has no result schema"
    for name, body in components.items():
        assert doc["components"]["schemas"][name] == body
    assert by_name["session.turn"]["result"]["schema"] == {
        "$ref": "#/components/schemas/AssembledPrompt"}
    assert by_name["daemon.ping"]["result"]["schema"] == {"type": "string"}


def test_the_server_refuses_a_method_the_table_lacks() -> None:
    d = Dispatcher()
    with pytest.raises(ValueError, match="does not match qwenctxd.protocol.methods"):
        d.register(MethodSpec("daemon.pingg", Empty, _handler, str))
    with pytest.raises(ValueError, match="does not match"):  # params not the table's
        d.register(MethodSpec("session.turn", Empty, _handler, methods.SESSION_TURN.result))
    with pytest.raises(ValueError, match="does not match"):  # result not the table's
        d.register(MethodSpec("daemon.ping", Empty, _handler, int))
    d.register(bind(methods.DAEMON_PING, _handler))
    assert set(d.specs) == {"daemon.ping"}


def test_table_names_are_unique_and_constants_cover_them() -> None:
    constants = [v for v in vars(methods).values() if isinstance(v, methods.Method)]
    names = [m.name for m in constants]
    assert len(names) == len(set(names))
    assert set(names) == set(methods.METHODS) | set(methods.DEBUG_METHODS)
    for m in constants:
        assert issubclass(m.params, msgspec.Struct), m.name
        assert methods.lookup(m.name) is m


def test_the_table_imports_nothing_but_the_protocol_package() -> None:
    code = ("import sys; import qwenctxd.protocol.methods, qwenctxd.client; "
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    ours = [m for m in loaded if m.startswith("qwenctxd.")]
    allowed = ("qwenctxd.protocol", "qwenctxd.client", "qwenctxd.paths")
    assert [m for m in ours if not m.startswith(allowed)] == []
    heavy = {"anyio", "structlog", "jsonrpcserver", "openai", "aiosqlite", "watchfiles"}
    assert heavy.isdisjoint(m.split(".")[0] for m in loaded)
