"""``rpc.discover``: every served method as an OpenRPC 1.2.6 document.

Built from what the dispatcher actually serves — each method's params struct (msgspec's JSON
Schema; params are by-name, unknown fields refused) and its result type from the method table (``qwenctxd.protocol.methods``) — so
client authors, code generators and fuzzers see the exact wire shapes, and the document cannot
drift from the code. Shared types live once under ``components.schemas``. Built on first call
and kept (the method table is fixed once the daemon serves).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from qwenctxd.server.dispatch import MethodSpec

OPENRPC_VERSION = "1.2.6"
REF_TEMPLATE = "#/components/schemas/{name}"


def result_type(spec: MethodSpec[Any]) -> Any:
    """The method's result type from the table (``qwenctxd.protocol.methods``), or None."""
    return spec.result


def _describe(schema: dict[str, Any], components: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                         str | None]:
    ref = schema.get("$ref", "")
    body = components.get(ref.rsplit("/", 1)[-1], schema) if ref else schema
    required = set(body.get("required", ()))
    params = [{"name": name, "required": name in required, "schema": sub}
              for name, sub in (body.get("properties") or {}).items()]
    return params, body.get("description")


def openrpc_document(specs: Iterable[MethodSpec[Any]], *, version: str) -> dict[str, Any]:
    ordered = sorted(specs, key=lambda s: s.name)
    results = [result_type(s) for s in ordered]
    known = [r for r in results if r is not None]
    schemas, components = msgspec.json.schema_components(
        [s.params for s in ordered] + known, ref_template=REF_TEMPLATE)
    param_schemas, result_schemas = schemas[: len(ordered)], iter(schemas[len(ordered):])
    methods = []
    for spec, pschema, rtype in zip(ordered, param_schemas, results, strict=True):
        params, summary = _describe(pschema, components)
        method: dict[str, Any] = {"name": spec.name, "paramStructure": "by-name",
                                  "params": params}
        if summary:
            method["summary"] = summary
        method["result"] = {"name": "result",
                            "schema": next(result_schemas) if rtype is not None else {}}
        methods.append(method)
    return {"openrpc": OPENRPC_VERSION,
            "info": {"title": "qwenctxd", "version": version,
                     "description": "JSON-RPC 2.0 over a Unix socket; see docs/protocol.md"},
            "methods": methods,
            "components": {"schemas": components}}
