"""``qwenctl proxy``: the three ways a streamed reply ends are recorded for what they are
(issue 24). A client that reads to ``[DONE]`` and closes at once (curl does) leaves a complete
reply; an upstream that breaks off mid-stream is recorded with that cause and the client gets
an OpenAI-style SSE error event instead of a clean end; a hung upstream is cut after the read
deadline (``model.timeout_s``), not after minutes, and the client is told; an upstream
nobody listens at is a 502."""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import openai
import pytest
from proxy_harness import CLIENT_SYSTEM, RunningProxy, client, daemon_for, project, upstream

from qwenctxd.testing.openai_stub import Reply
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

__all__ = ["upstream"]  # fixtures

MESSAGES = [{"role": "system", "content": CLIENT_SYSTEM}, {"role": "user", "content": "talk"}]


def transcript_text(daemon: SpawnedDaemon) -> str:
    files = sorted((daemon.home / ".qwen" / "projects").rglob("*.jsonl"))
    return "".join(f.read_text() for f in files)


@pytest.fixture
def proxy(spawn, upstream):  # type: ignore[no-untyped-def]
    """The proxy with a 2 s upstream read deadline (QWENCTXD_MODEL_TIMEOUT_S)."""
    stub, script = upstream
    d = daemon_for(spawn, stub)
    proj = project(d.root, "proj", "Be brief.\n")
    running = RunningProxy(d, stub.base_url, proj, extra_env={"QWENCTXD_MODEL_TIMEOUT_S": "2"})
    yield running, stub, script
    running.stop()


def _read_to_done_and_close(proxy: RunningProxy, session: str) -> bytes:
    """A curl-like client: POST, read until ``[DONE]`` arrives, close the socket at once."""
    url = urlsplit(proxy.base_url)
    body = json.dumps({"model": "stub-model", "stream": True, "messages": MESSAGES}).encode()
    head = (f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {proxy.key}\r\nContent-Type: application/json\r\n"
            f"X-Qwenctx-Session: {session}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    got = b""
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(head + body)
        while b"data: [DONE]" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


def test_a_client_that_closes_right_after_done_leaves_a_complete_reply(proxy) -> None:  # type: ignore[no-untyped-def]
    running, _stub, script = proxy
    for i in range(5):
        last = f"final{i}"
        script.replies.append(Reply(content=f"one two three {last}", chunk_chars=4))
        got = _read_to_done_and_close(running, str(uuid.uuid4()))
        assert b"data: [DONE]" in got
        until(lambda last=last: last in transcript_text(running.daemon), timeout=30,
              what="the reply recorded")
    text = transcript_text(running.daemon)
    assert "reply cut off" not in text, text[-2000:]


def test_an_upstream_that_breaks_off_is_recorded_so_and_the_client_gets_an_error(proxy) -> None:  # type: ignore[no-untyped-def]
    running, _stub, script = proxy
    words = " ".join(f"word{i}" for i in range(60))
    script.replies.append(Reply(content=words, chunk_chars=5, fault="cut_stream"))
    seen = []
    with pytest.raises(openai.APIError) as err:
        for chunk in client(running).chat.completions.create(
                model="stub-model", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            seen.append(chunk)
    assert "broke off" in str(err.value.message), err.value
    assert seen, "the part before the break still came through"
    until(lambda: "reply cut off" in transcript_text(running.daemon), timeout=30,
          what="the cut reply recorded")
    text = transcript_text(running.daemon)
    assert "[reply cut off: the upstream stream broke off]" in text
    assert "the client disconnected" not in text


def test_a_hung_upstream_is_cut_at_the_read_deadline(proxy) -> None:  # type: ignore[no-untyped-def]
    running, _stub, script = proxy
    script.replies.append(Reply(content="first then nothing for a long time", chunk_chars=6,
                                chunk_delay_s=120))
    started = time.monotonic()
    with pytest.raises(openai.APIError) as err:
        for _chunk in client(running, timeout=60).chat.completions.create(
                model="stub-model", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            pass
    waited = time.monotonic() - started
    assert "sent nothing for 2 s" in str(err.value.message), err.value
    assert waited < 30, waited  # the 2 s deadline, not an HTTP library's default
    until(lambda: "reply cut off" in transcript_text(running.daemon), timeout=30,
          what="the cut reply recorded")
    assert "[reply cut off: the upstream sent nothing for 2 s]" in transcript_text(
        running.daemon)


def test_an_upstream_that_never_answers_gets_a_gateway_timeout(proxy) -> None:  # type: ignore[no-untyped-def]
    running, _stub, script = proxy
    script.replies.append(Reply(content="too late", delay_s=120))
    with pytest.raises(openai.APIStatusError) as err:
        client(running, timeout=60).chat.completions.create(
            model="stub-model", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert err.value.status_code == 504 and "timed out after 2 s" in err.value.message


def test_an_upstream_that_refuses_connections_gets_a_bad_gateway(spawn, upstream) -> None:  # type: ignore[no-untyped-def]
    """Nothing listens at the upstream's port: the chat and the model list are 502s naming the
    cause, and the proxy keeps serving."""
    stub, _script = upstream
    d = daemon_for(spawn, stub)
    proj = project(d.root, "proj", "Be brief.\n")
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    running = RunningProxy(d, dead, proj)
    try:
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as err:
                client(running, timeout=30).chat.completions.create(
                    model="stub-model", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
            assert err.value.status_code == 502, err.value
            assert "upstream unreachable" in err.value.message, err.value.message
        with pytest.raises(openai.APIStatusError) as err:
            client(running, timeout=30).models.list()
        assert err.value.status_code == 502 and "upstream unreachable" in err.value.message
    finally:
        running.stop()
