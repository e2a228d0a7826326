"""``qwenctl methods`` and ``qwenctl call``: the raw protocol, for people and scripts.

``methods`` lists what the daemon serves (from ``rpc.discover``), and with a name shows that
method's params — name, type, required — and its result type. ``call METHOD [PARAMS]`` sends
one request with PARAMS as a JSON object (or ``-`` to read it from stdin) and prints the result
as JSON; a daemon error exits 1 with its code and message, like every other command.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from qwenctl.context import emit_json
from qwenctl.daemon_link import EXIT_OK, EXIT_USAGE
from qwenctxd.protocol import methods as table

if TYPE_CHECKING:
    from qwenctl.context import Ctx


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    m = sub.add_parser("methods", parents=[common],
                       help="methods the daemon serves; with a name, its params and result")
    m.add_argument("name", nargs="?", metavar="METHOD", help="one method to describe")
    c = sub.add_parser("call", parents=[common],
                       help="send one JSON-RPC request and print the result as JSON")
    c.add_argument("method", metavar="METHOD")
    c.add_argument("params", nargs="?", metavar="PARAMS",
                   help="a JSON object ('-': read it from stdin); none when omitted")


def type_label(schema: dict[str, Any]) -> str:
    """A short human spelling of a JSON Schema: ``str``, ``int | null``, ``[Reminder]``…"""
    import json  # lazily, as below: qwenctl's start-up imports only what every command needs

    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(type_label(s) for s in schema[key])
    if "enum" in schema:
        return "|".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"[{type_label(schema.get('items', {}))}]"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"{{str: {type_label(extra) if isinstance(extra, dict) else 'any'}}}"
    names = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
             "null": "null", "object": "object"}
    if isinstance(kind, list):
        return " | ".join(names.get(k, k) for k in kind)
    return names.get(kind, "any") if kind else "any"


def cmd_methods(ctx: Ctx) -> int:
    doc = ctx.request(table.RPC_DISCOVER)  # a JSON Schema document: its type is a dict
    served = {m["name"]: m for m in doc["methods"]}
    name = ctx.args.name
    if name is None:
        if ctx.args.json:
            emit_json(sorted(served))
            return EXIT_OK
        width = max(map(len, served))
        for m in served.values():
            params = ", ".join(p["name"] + ("" if p["required"] else "?") for p in m["params"])
            sys.stdout.write(f"{m['name']:<{width}}  {{{params}}}\n")
        return EXIT_OK
    if name not in served:
        sys.stderr.write(f"qwenctl: the daemon serves no method {name!r} "
                         "(see `qwenctl methods`)\n")
        return EXIT_USAGE
    m = served[name]
    if ctx.args.json:
        emit_json(m)
        return EXIT_OK
    sys.stdout.write(f"{name}\nparams{' (none)' if not m['params'] else ''}\n")
    width = max((len(p["name"]) for p in m["params"]), default=0)
    for p in m["params"]:
        need = "required" if p["required"] else "optional"
        sys.stdout.write(f"  {p['name']:<{width}}  {need:<8}  {type_label(p['schema'])}\n")
    sys.stdout.write(f"result  {type_label(m['result']['schema'])}\n")
    return EXIT_OK


def cmd_call(ctx: Ctx) -> int:
    import json

    raw = ctx.args.params
    params: Any = None
    if raw is not None:
        text = sys.stdin.read() if raw == "-" else raw
        try:
            params = json.loads(text)
        except ValueError as exc:
            sys.stderr.write(f"qwenctl: PARAMS is not JSON: {exc}\n")
            return EXIT_USAGE
        if not isinstance(params, dict | list):
            sys.stderr.write("qwenctl: PARAMS must be a JSON object (or array)\n")
            return EXIT_USAGE
    # the one raw call of qwenctl: any wire name the user types, with the JSON they typed
    emit_json(ctx.client().call(ctx.args.method, params))
    return EXIT_OK
