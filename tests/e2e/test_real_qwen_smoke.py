"""The real Qwen Code CLI runs headless against the scripted model (harness check)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from tests.e2e.qwen_cli import QwenCli, qwen_binary

pytestmark = pytest.mark.real_qwen


def test_cli_is_0_24() -> None:
    out = subprocess.run([str(qwen_binary()), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().startswith("0.24."), out


def test_headless_prompt_reaches_the_model_and_prints_its_reply(tmp_path: Path) -> None:
    home, proj = tmp_path / "home", tmp_path / "proj"
    home.mkdir()
    proj.mkdir()
    with ScriptedOpenAI(default=Reply(content="hello from the scripted model")) as stub:
        cli = QwenCli(home=home, cwd=proj, base_url=stub.base_url)
        proc = cli.run(prompt="say hello")
        main = [r for r in stub.chat_requests if any(
            (t.get("function") or {}).get("name") == "skill" for t in r.body.get("tools") or []
        )]
    assert "hello from the scripted model" in proc.stdout
    assert main, "no main request (tools include `skill`) reached the model"
    assert main[0].body["messages"][0]["role"] == "system"
    assert list(cli.chats_dir().glob("*.jsonl")), "the CLI recorded no session file"
