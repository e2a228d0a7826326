"""``qwenctl proxy`` under pressure: a client that disconnects mid-stream (the upstream call
is cancelled, the partial reply recorded as cut) and a long conversation that passes the
``auto`` threshold (the forwarded history becomes the daemon's compacted one, still valid for
a strict upstream)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from proxy_harness import (
    CLIENT_SYSTEM,
    RunningProxy,
    client,
    forwarded,
    project,
    setup,
    upstream,
)

from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

__all__ = ["setup", "upstream"]  # fixtures


def transcript_text(daemon: SpawnedDaemon) -> str:
    files = sorted((daemon.home / ".qwen" / "projects").rglob("*.jsonl"))
    return "".join(f.read_text() for f in files)


def test_client_disconnecting_mid_stream_records_a_cut_reply(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, _ = setup
    words = " ".join(f"word{i}" for i in range(400))
    script.replies.append(Reply(content=words, chunk_chars=6, chunk_delay_s=0.02))
    script.replies.append(Reply(content="after the cut"))
    body = {"model": "stub-model", "stream": True, "messages": [
        {"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "talk"}]}
    got = b""
    with httpx.stream("POST", proxy.base_url + "/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {proxy.key}"}) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            got += chunk
            if got.count(b"data:") >= 10:
                break  # leaving the block closes the connection mid-stream
    full_events = len(words) // 6 + 3
    until(lambda: "reply cut off" in transcript_text(proxy.daemon), timeout=30,
          what="the cut-off reply in the transcript")
    text = transcript_text(proxy.daemon)
    assert "word0" in text and "[reply cut off: the client disconnected]" in text
    assert "word399" not in text  # the upstream call was cancelled, not read to the end
    assert got.count(b"data:") < full_events
    # the conversation goes on, and the history sent upstream stays valid
    c = client(proxy)
    r2 = c.chat.completions.create(model="stub-model", messages=[  # type: ignore[arg-type]
        {"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "talk"},
        {"role": "assistant", "content": "word0 word1"}, {"role": "user", "content": "more"}])
    assert r2.choices[0].message.content == "after the cut"
    assert validate_chat_body(forwarded(stub)[-1]) == []


@pytest.fixture
def small_window(spawn: type[SpawnedDaemon], upstream: tuple[ScriptedOpenAI, Any]):  # type: ignore[no-untyped-def]
    stub, script = upstream
    d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "upstream-key",
                   "OPENAI_MODEL": "stub-model"})
    settings = d.home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"model": {"generationConfig": {"contextWindowSize": 40000}}}))
    d.start()
    proj = project(d.root, "proj", "Project rule: be brief.\n")
    proxy = RunningProxy(d, stub.base_url, proj)
    yield proxy, stub, script, proj
    proxy.stop()


def test_compaction_is_reached_and_the_forwarded_history_shrinks(small_window) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, _proj = small_window
    c = client(proxy)
    history: list[dict[str, Any]] = [{"role": "system", "content": CLIENT_SYSTEM}]
    filler = "lorem ipsum dolor sit amet " * 220  # ~6 KB, ~1.5k tokens per message
    sent_lengths: list[tuple[int, int]] = []
    for i in range(14):
        script.replies.append(Reply(content=f"answer {i}: {filler}"))
        history.append({"role": "user", "content": f"question {i}: {filler}"})
        r = c.chat.completions.create(model="stub-model", messages=history)  # type: ignore[arg-type]
        history.append({"role": "assistant", "content": r.choices[0].message.content})
        up = forwarded(stub)[-1]
        assert validate_chat_body(up) == [], up["messages"]
        sent_lengths.append((len(history) - 1, len(up["messages"])))
    # at some point the daemon compacted: fewer messages went up than the client sent
    shrunk = [(client_n, up_n) for client_n, up_n in sent_lengths if up_n < client_n]
    assert shrunk, (sent_lengths, proxy.daemon.log_text()[-3000:])
    assert "chat_compression" in transcript_text(proxy.daemon)
    last = forwarded(stub)[-1]["messages"]
    assert last[0]["content"].startswith(CLIENT_SYSTEM)
    assert "question 13" in json.dumps(last[-1]["content"])
    assert "Project rule: be brief." in last[0]["content"]


def test_proxy_env_prints_export_lines(tmp_path: Path, setup) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from qwenctl.proxy.keys import decode_project

    proxy: RunningProxy = setup[0]
    other = tmp_path / "elsewhere"
    other.mkdir()
    out = subprocess.run([sys.executable, "-m", "qwenctl", "proxy", "env", "--cwd", str(other)],
                         env=proxy.env, capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert lines[1] == f"export OPENAI_API_KEY={proxy.key}"
    url = lines[0].removeprefix("export OPENAI_BASE_URL=")
    assert url.startswith("http://127.0.0.1:8788/p/") and url.endswith("/v1")
    assert decode_project(url.split("/p/")[1].split("/")[0]) == str(other.resolve())
    same = subprocess.run([sys.executable, "-m", "qwenctl", "proxy", "env", "--cwd", str(other),
                           "--default-cwd", str(other)], env=proxy.env, capture_output=True,
                          text=True, check=True).stdout
    assert same.splitlines()[0] == "export OPENAI_BASE_URL=http://127.0.0.1:8788/v1"
