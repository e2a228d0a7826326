"""Run the real Qwen Code CLI (npm ``@qwen-code/qwen-code`` 0.24) headless in a test.

``QwenCli`` runs ``qwen --auth-type openai -m MODEL -p PROMPT`` with a scratch HOME against
an OpenAI-compatible base URL (the scripted model, the proxy, …) and returns the finished
process. Facts: ../shared/reference/interop-facts.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.cache import cache_dir, require

QWEN_TIMEOUT_S = 120.0


def qwen_binary() -> Path:
    """The cached ``qwen`` entry point (fails the test loudly when it is not installed)."""
    if shutil.which("node") is None:
        import pytest

        pytest.fail("node is not installed; tests/e2e/prepare.sh installs it from Debian's packages")
    return require(cache_dir() / "qwen-code" / "node_modules" / ".bin" / "qwen", "the Qwen Code CLI")


@dataclass
class QwenCli:
    """One scratch user of the real CLI: ``home`` is its HOME, ``cwd`` its project."""

    home: Path
    cwd: Path
    base_url: str
    model: str = "scripted-model"
    api_key: str = "test-key"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "QWEN_", "DASHSCOPE_", "GEMINI_"))
        }
        env.update(
            HOME=str(self.home),
            OPENAI_BASE_URL=self.base_url,
            OPENAI_API_KEY=self.api_key,
            OPENAI_MODEL=self.model,
            NO_COLOR="1",
            CI="true",
        )
        env.update(extra or {})
        return env

    def run(
        self,
        *args: str,
        prompt: str | None = None,
        extra_env: dict[str, str] | None = None,
        timeout: float = QWEN_TIMEOUT_S,
        check: bool = True,
        stdin_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``qwen --auth-type openai -m MODEL [args] [-p prompt]``; asserts exit 0 by default.

        ``stdin_text`` is piped to the CLI, which puts it before the ``-p`` prompt (a prompt
        larger than one argv string may be, 128 KiB)."""
        cmd = [str(qwen_binary())]
        if args[:1] != ("sessions",):
            cmd += ["--auth-type", "openai", "-m", self.model]
        cmd += list(args)
        if prompt is not None:
            cmd += ["-p", prompt]
        proc = subprocess.run(
            cmd,
            cwd=self.cwd,
            env=self.env(extra_env),
            capture_output=True,
            text=True,
            timeout=timeout,
            **({"stdin": subprocess.DEVNULL} if stdin_text is None else {"input": stdin_text}),
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"qwen {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
            )
        return proc

    def chats_dir(self) -> Path:
        """``~/.qwen/projects/<slug(cwd)>/chats`` — where both sides keep session JSONL."""
        slug = "".join(c if c.isalnum() else "-" for c in str(self.cwd.resolve()))
        return self.home / ".qwen" / "projects" / slug / "chats"
