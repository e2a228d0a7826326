"""The real Qwen Code CLI, headless, with OPENAI_BASE_URL pointed at ``qwenctl proxy`` in
front of the scripted model: its request reaches the upstream with its own system prompt plus
the project's instructions behind ``---``, and it prints the upstream's reply."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from tests.e2e.qwen_cli import QwenCli
from tests.proxy_harness import RunningProxy, daemon_for, project

pytestmark = pytest.mark.real_qwen


def test_qwen_code_through_the_proxy(spawn: type[SpawnedDaemon], tmp_path: Path) -> None:
    with ScriptedOpenAI(default=Reply(content="hello through the proxy")) as stub:
        d = daemon_for(spawn, stub)
        proj = project(d.root, "proj", "Proxy marker: the project's own rule.\n")
        proxy = RunningProxy(d, stub.base_url, proj)
        try:
            home = tmp_path / "qhome"
            home.mkdir()
            cli = QwenCli(home=home, cwd=proj, base_url=proxy.base_url, api_key=proxy.key)
            proc = cli.run(prompt="say hello")
            sp = d.call("prompt.system", {"cwd": str(proj), "model": cli.model})
        finally:
            proxy.stop()
        main = [r for r in stub.chat_requests if any(
            (t.get("function") or {}).get("name") == "skill" for t in r.body.get("tools") or [])]
    assert "hello through the proxy" in proc.stdout, (proc.stdout, proc.stderr)
    assert main, "no main request of Qwen Code reached the upstream"
    system = main[0].body["messages"][0]["content"]
    assert isinstance(system, str) and system.startswith("You are Qwen Code")
    pos, appended = 0, ""
    for sec in sp["sections"]:
        if sec["name"] in ("instructions", "memory"):
            appended += sp["text"][pos:pos + sec["chars"]]
        pos += sec["chars"]
    assert "Proxy marker" in appended
    assert system.endswith(appended)  # Qwen Code's prompt, then ours behind ---
    assert main[0].headers["authorization"] == "Bearer upstream-key"  # never the proxy key
    sessions = d.call("session.list", {"cwd": str(proj)})["sessions"]
    assert sessions and any(s["messages"] >= 2 for s in sessions)
