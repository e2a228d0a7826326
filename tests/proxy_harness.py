"""Test harness for ``qwenctl proxy``: a spawned daemon whose model endpoint is a scripted
OpenAI server, and the proxy as a real process (``qwenctl proxy --listen 127.0.0.1:0``, forked
from the pre-imported :mod:`qwenctxd.testing.forkserver`) in front of that same server."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.qwenctl_runs import qwenctl, start_qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


class RunningProxy:
    def __init__(self, daemon: SpawnedDaemon, upstream: str, cwd: Path,
                 extra_env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.daemon = daemon
        #: SDK clients made by :func:`client`: closed by :meth:`stop`, so no pooled socket is
        #: left to the collector (its ResourceWarning lands in whichever test runs then)
        self.clients: list[openai.OpenAI] = []
        env = {**daemon.env, "QWENCTXD_SOCKET": str(daemon.socket), **(extra_env or {})}
        self.env = env
        self.log = daemon.root / "proxy.log"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = start_qwenctl(
            "proxy", "--no-autostart", "--listen", "127.0.0.1:0", "--upstream", upstream,
            "--cwd", str(cwd), *extra_args, env=env, cwd=cwd, stdout=self._log, stderr=self._log)

        def listening() -> str | None:
            m = re.search(r"listening on (http://\S+/v1)", self.log.read_text(errors="replace"))
            if m is None and self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}:\n{self.log_text()}")
            return m.group(1) if m else None

        self.base_url = until(listening, timeout=30, what="the proxy's 'listening on' line")
        key = qwenctl(self, "proxy", "key")
        key.check_returncode()
        self.key = key.stdout.strip()
        self._wait_serving()

    def _wait_serving(self) -> None:
        import httpx2 as httpx

        until(lambda: httpx.get(self.base_url + "/models", timeout=2).status_code, timeout=30,
              ignoring=(httpx.HTTPError,), what="the proxy to answer GET /models")

    @property
    def root(self) -> str:
        return self.base_url[: -len("/v1")]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def daemon_for(spawn: type[SpawnedDaemon], stub: ScriptedOpenAI,
               env: dict[str, str] | None = None) -> SpawnedDaemon:
    """A daemon whose side queries (summaries, extraction) go to ``stub``."""
    return spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "upstream-key",
                      "OPENAI_MODEL": "stub-model", **(env or {})}).start()


def project(root: Path, name: str, qwen_md: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "QWEN.md").write_text(qwen_md)
    return d



CLIENT_SYSTEM = "You are TestBot, a terse assistant."
SUMMARY = ("<analysis>draft</analysis>\n<state_snapshot>\n<primary_request_and_intent>Answer "
           "the numbered questions.</primary_request_and_intent>\n<next_step>Keep going."
           "</next_step>\n</state_snapshot>")


class Upstream:
    """Scripted answers for the requests the proxy forwards (they carry the client's system
    prompt); the daemon's own side queries get a compaction summary when they ask for one,
    else a plain answer."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        msgs = body.get("messages") or []
        first = msgs[0].get("content") if msgs else ""
        if isinstance(first, str) and first.startswith(CLIENT_SYSTEM) and self.replies:
            return self.replies.pop(0)
        if "state_snapshot" in json.dumps(msgs):
            return Reply(content=SUMMARY)
        return Reply(content="{}")


@pytest.fixture
def upstream() -> Iterator[tuple[ScriptedOpenAI, Upstream]]:
    script = Upstream()
    with ScriptedOpenAI(strict_chat=True, handler=script) as stub:
        yield stub, script


def forwarded(stub: ScriptedOpenAI) -> list[dict[str, Any]]:
    """The chat bodies the proxy forwarded (not the daemon's side queries)."""
    return [r.body for r in stub.chat_requests
            if str((r.body.get("messages") or [{}])[0].get("content", "")).startswith(
                CLIENT_SYSTEM)]


def client(proxy: RunningProxy, **kw: Any) -> openai.OpenAI:
    """An openai SDK client of the proxy (``base_url`` may be given), closed with it."""
    c = openai.OpenAI(base_url=kw.pop("base_url", proxy.base_url), api_key=kw.pop(
        "api_key", proxy.key), max_retries=0, timeout=kw.pop("timeout", 60.0), **kw)
    proxy.clients.append(c)
    return c


@pytest.fixture
def setup(spawn: type[SpawnedDaemon], upstream: tuple[ScriptedOpenAI, Upstream]
          ) -> Iterator[tuple[RunningProxy, ScriptedOpenAI, Upstream, Path]]:
    """A daemon, a project with a QWEN.md, and the proxy in front of the strict upstream."""
    stub, script = upstream
    d = daemon_for(spawn, stub)
    proj = project(d.root, "proj", "Always answer in haiku.\n")
    proxy = RunningProxy(d, stub.base_url, proj)
    yield proxy, stub, script, proj
    proxy.stop()
