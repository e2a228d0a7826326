"""session.search over a session the real Qwen Code CLI 0.24 records while the daemon runs.

The daemon and the CLI share one scratch HOME; the CLI talks to the scripted model and reads a
file with a real ``read_file`` call. Without a restart, the daemon finds what was said (the
user's words, the model's answer, the tool's output) at the right entries of that session's
``session.transcript``, and ``qwenctl sessions search`` shows it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until
from tests.e2e.qwen_cli import QwenCli

pytestmark = pytest.mark.real_qwen


def is_main(body: dict[str, Any]) -> bool:
    return any((t.get("function") or {}).get("name") == "skill" for t in body.get("tools") or [])


def test_a_session_the_real_cli_records_is_searchable_without_a_restart(
        spawn: type[SpawnedDaemon]) -> None:
    notes: dict[str, str] = {}

    def handler(body: dict[str, Any]) -> Reply:
        if not is_main(body):
            return Reply(content="ok")
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="The ledger says the wombat tariff is 41 credits.")
        return Reply(tool_calls=[{"id": "call_s1", "function": {
            "name": "read_file", "arguments": {"file_path": notes["path"]}}}])

    with ScriptedOpenAI(handler=handler) as stub:
        d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k",
                       "OPENAI_MODEL": "scripted-model"}).start()
        proj = d.root / "proj"
        proj.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=proj, check=True)
        ledger = proj / "ledger.txt"
        ledger.write_text("quarterly ledger: ocelot surcharge applies\n")
        notes["path"] = str(ledger)
        before = d.call("session.search", {"query": "wombat"})
        assert before["hits"] == []
        cli = QwenCli(home=d.home, cwd=proj, base_url=stub.base_url)
        cli.run("--approval-mode", "yolo", prompt="look up the wombat tariff in ledger.txt")
        files = list(cli.chats_dir().glob("*.jsonl"))
        assert len(files) == 1
        sid = files[0].stem

        def found(query: str, **kw: Any) -> list[dict[str, Any]]:
            hits: list[dict[str, Any]] = d.call("session.search", {"query": query, **kw})["hits"]
            return [h for h in hits if h["session_id"] == sid]

        user = until(lambda: found("wombat tariff", roles=["user"]), timeout=5,
                     what="the CLI's session in the index")[0]
        answer = until(lambda: found("41 credits"), timeout=5, what="the model's answer")[0]
        tool = until(lambda: found("ocelot surcharge", roles=["tool"]), timeout=5,
                     what="the tool output")[0]
        entries = d.call("session.transcript", {"session_id": sid})["entries"]
        assert "wombat tariff" in entries[user["entry"]]["text"] and user["role"] == "user"
        assert entries[answer["entry"]]["role"] == "assistant"
        assert "41 credits" in entries[answer["entry"]]["text"]
        assert entries[tool["entry"]]["role"] == "tool"
        assert "ocelot surcharge" in entries[tool["entry"]]["text"]
        assert user["entry"] < tool["entry"] < answer["entry"]
        scoped = d.call("session.search", {"query": "wombat", "cwd": str(proj)})["hits"]
        assert sid in {h["session_id"] for h in scoped}
        r = subprocess.run([sys.executable, "-m", "qwenctl", "sessions", "search", "wombat",
                            "tariff"], env=d.env, cwd=proj, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert sid[:8] in r.stdout and "--around" in r.stdout
        assert Path(files[0]).exists()
