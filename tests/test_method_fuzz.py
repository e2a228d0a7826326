"""Every method, fuzzed through the socket from its own ``rpc.discover`` schema: bad input gets
a documented JSON-RPC error, never an internal error, and the daemon keeps serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import ScriptedOpenAI
from qwenctxd.testing.rpc_fuzz import (
    DOCUMENTED_CODES,
    chaotic_model,
    fuzz_daemon,
    make_fuzz_project,
)
from qwenctxd.testing.spawn import SpawnedDaemon

CALLS = 1500


def test_discover_describes_every_served_method(daemon: SpawnedDaemon) -> None:
    doc = daemon.call("rpc.discover")
    assert doc["openrpc"] == "1.2.6" and doc["info"]["title"] == "qwenctxd"
    served = {c for c in daemon.call("daemon.hello")["capabilities"]
              if ("." in c or c.startswith("$/")) and not c.startswith("framing.")}
    names = [m["name"] for m in doc["methods"]]
    assert names == sorted(names) and set(names) == served
    assert "rpc.discover" in names
    by_name = {m["name"]: m for m in doc["methods"]}
    turn = {p["name"]: p for p in by_name["session.turn"]["params"]}
    assert turn["session_id"]["required"] and sorted(turn["kind"]["schema"]["enum"]) == [
        "cron", "tool_results", "user"]
    assert not turn["text"]["required"]
    assert by_name["daemon.ping"]["params"] == [] and by_name["daemon.ping"]["result"][
        "schema"] == {"type": "string"}
    # every $ref resolves inside the document
    text = json.dumps(doc)
    schemas = doc["components"]["schemas"]
    for ref in {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}:
        assert ref in schemas, ref


def _check(report: Any, d: SpawnedDaemon) -> None:
    assert report.calls == CALLS
    assert report.internal == [], report.internal[:5]
    assert report.undocumented == []
    assert {int(k) for k in report.outcomes if k != "ok"} <= DOCUMENTED_CODES
    # the generator reaches past validation, and produces bad input too
    assert report.outcomes["ok"] > CALLS // 10, report.outcomes
    assert report.outcomes["-32602"] > 0, report.outcomes
    assert d.call("daemon.ping") == "pong"
    d.stop()
    failures = [ln for ln in d.log_path.read_text().splitlines() if "method failed" in ln]
    assert failures == [], failures[:3]


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_without_a_model(spawn, seed: int) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    repo = make_fuzz_project(d.home)
    sessions = [d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]]
    with d.client() as c:
        report = fuzz_daemon(c, calls=CALLS, seed=seed, project=repo, sessions=sessions)
    _check(report, d)


def test_fuzz_with_a_model(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(handler=chaotic_model(7)) as stub:
        d: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": stub.base_url,
                                      "OPENAI_MODEL": "stub-model",
                                      "OPENAI_API_KEY": "test"}).start()
        repo = make_fuzz_project(d.home)
        sessions = [d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]]
        with d.client() as c:
            report = fuzz_daemon(c, calls=CALLS, seed=10, project=repo, sessions=sessions)
        assert d.call("daemon.drain", {"timeout_s": 30})["drained"]
        _check(report, d)


def test_docs_protocol_documents_every_method(daemon: SpawnedDaemon) -> None:
    """docs/protocol.md has a section for every method the daemon serves."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()
    headings = [ln[4:] for ln in text.splitlines() if ln.startswith("### ")]

    def documented(name: str) -> bool:
        family, _, leaf = name.rpartition(".")
        for h in headings:
            spelled = h.split(" (")[0]
            if name in spelled.split(" / ") or spelled == f"{family}*":
                return True
            parts = [x.strip() for x in spelled.split("/")]
            # "speculation.start / accept / abort / status"
            if parts[0].rpartition(".")[0] == family and leaf in {
                    p.rpartition(".")[2] for p in parts}:
                return True
        return False

    missing = [m["name"] for m in daemon.call("rpc.discover")["methods"]
               if not documented(m["name"])]
    assert missing == []
