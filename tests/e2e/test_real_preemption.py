"""Foreground first against the real llama.cpp server (issue 29): a background side query the
daemon streams to the server (profile ``llamacpp``) is closed when a session whose agent uses
the same server begins a request — and the server stops generating it (llama-cpp-python logs
the disconnect and drops the generation), so the agent's own request is not queued behind the
daemon's work on a one-slot server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until
from tests.e2e.llama_server import MODEL_ALIAS, LlamaServer

pytestmark = pytest.mark.real_endpoint

_CHAT = re.compile(r'"POST /v1/chat/completions HTTP/1\.1" 200')


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[LlamaServer, SpawnedDaemon, Path]]:
    with LlamaServer(tmp_path / "llama.log") as llama:
        d = SpawnedDaemon(root=tmp_path / "d")
        cfg = d.home / ".config" / "qwenctxd"
        cfg.mkdir(parents=True)
        (cfg / "config.toml").write_text(
            f'[model]\nbase_url = "{llama.base_url}"\nmodel = "{MODEL_ALIAS}"\n'
            f'api_key = "none"\ntimeout_s = 120\nprofile = "llamacpp"\n'
            f"context_window = {llama.n_ctx}\n")
        d.start()
        proj = d.home / "work" / "proj"
        (proj / ".git").mkdir(parents=True)
        try:
            yield llama, d, proj
        finally:
            d.cleanup()


def _chats(llama: LlamaServer) -> int:
    return len(_CHAT.findall(llama.log_text()))


def test_a_streamed_side_query_is_closed_for_the_agents_request(setup) -> None:  # type: ignore[no-untyped-def]
    llama, d, proj = setup
    fg = d.call("session.open", {"cwd": str(proj), "model": MODEL_ALIAS,
                                 "model_base_url": llama.base_url})["session_id"]
    for attempt in range(3):
        # a complete exchange in another session: its extraction agent runs in the background,
        # streamed to the server
        bg = d.call("session.open", {"cwd": str(proj), "model": MODEL_ALIAS})["session_id"]
        seen = _chats(llama)
        d.call("session.turn", {"session_id": bg, "kind": "user", "text": (
            "Remember for later: our staging cluster is called Orion and deploys need the "
            f"release manager's approval (round {attempt}).")})
        d.call("session.record_model", {"session_id": bg, "message": {
            "role": "assistant", "content": "Noted: staging is Orion; deploys need approval."}})
        until(lambda s=seen: _chats(llama) > s, timeout=120,
              what="the extraction agent's streamed request to reach the server")
        # the agent's own request begins on the same server
        d.call("session.turn", {"session_id": fg, "kind": "user", "text": f"hello {attempt}"})
        if until(lambda: d.call("daemon.status")["model"]["scheduler"]["preempted"] > 0
                 or not d.call("daemon.status")["background"]["in_flight"], timeout=60,
                 what="the side query to be preempted or to finish"):
            if d.call("daemon.status")["model"]["scheduler"]["preempted"] > 0:
                break
        d.call("session.record_model", {"session_id": fg, "message": {
            "role": "assistant", "content": "hi"}})
    st = d.call("daemon.status")
    assert st["model"]["scheduler"]["preempted"] >= 1, st["model"]
    # the server saw the client go and dropped the generation
    until(lambda: "Disconnected from client" in llama.log_text(), timeout=30,
          what="llama.cpp to log the closed stream")
    assert not llama.rejected(), llama.rejected()
