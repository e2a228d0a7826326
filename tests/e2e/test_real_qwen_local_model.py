"""A local model, end to end (issue 29): the real Qwen Code → ``qwenctl proxy`` → the real
llama.cpp server, with the daemon's side queries on that same one-slot server — the README's
"A local model" set-up.

Qwen Code declares tools without ``parameters`` (llama.cpp answers HTTP 500 to them), asks for
``max_tokens: 32000`` and sends a ~17k-token prompt; through the proxy ``qwen -p`` answers
with no upstream error, every forwarded request fits the server's window, the conversation is
recorded under the user's words (Qwen Code's own one-shot side query is folded, no title is a
``<system-reminder>``), and a memory marker from the project reaches the model. A small
recording relay in front of llama.cpp (one URL for the proxy's upstream and the daemon's
endpoint, as in the README) keeps every body and answer."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.spawn import SpawnedDaemon
from tests.e2e.llama_server import LlamaServer
from tests.e2e.qwen_cli import QwenCli
from tests.proxy_harness import RunningProxy, project

pytestmark = pytest.mark.real_qwen

#: large enough for Qwen Code's own prompt (~17k tokens) with room for an answer
N_CTX = 24_576
MARKER = "the deploy gate is called BLUEHERON"


class Relay:
    """A loopback HTTP relay that records each POST body and passes the answer through
    unchanged (SSE chunk by chunk)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.bodies: list[dict[str, Any]] = []
        #: each POST's body with its answer as it passed (SSE as is), for a failure's message
        self.answers: list[tuple[dict[str, Any], str]] = []
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def _pass(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else None
                body: dict[str, Any] = {}
                if raw:
                    try:
                        body = json.loads(raw)
                        relay.bodies.append(body)
                    except ValueError:
                        pass
                path = self.path[len("/v1"):] if self.path.startswith("/v1") else self.path
                req = urllib.request.Request(relay.upstream + path, data=raw, method=method,
                                             headers={"Content-Type": "application/json"})
                try:
                    resp = urllib.request.urlopen(req, timeout=600)  # noqa: S310
                except urllib.error.HTTPError as exc:
                    resp = exc
                with resp:
                    self.send_response(resp.status if hasattr(resp, "status") else resp.code)
                    self.send_header("Content-Type", resp.headers.get("Content-Type",
                                                                      "application/json"))
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    answer = bytearray()
                    try:
                        for chunk in iter(lambda: resp.read1(65536), b""):
                            answer += chunk
                            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    finally:
                        if method == "POST":
                            relay.answers.append((body, answer.decode(errors="replace")))

            def do_GET(self) -> None:
                self._pass("GET")

            def do_POST(self) -> None:
                self._pass("POST")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> Relay:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def exchanges(relay: Relay) -> list[tuple[list[str], str]]:
    """Each forwarded request's message roles with the content the model answered (for an
    assertion's message: why a client asked again)."""
    out = []
    for body, answer in relay.answers:
        roles = [str(m.get("role")) for m in body.get("messages") or []]
        text = "".join(_delta_text(line[5:]) for line in answer.splitlines()
                       if line.startswith("data:"))
        out.append((roles, text[:400] or answer[-400:]))
    return out


def retries_of(home: Path) -> list[str]:
    """Why Qwen Code asked again, from its debug log (``QWEN_DEBUG_LOG_FILE``)."""
    return [line[:300] for log in sorted((home / ".qwen").rglob("*.txt"))
            for line in log.read_text(errors="replace").splitlines()
            if any(w in line for w in ("Invalid stream", "retry", "Retry", "XML tool call"))]


def _delta_text(data: str) -> str:
    try:
        choice = (json.loads(data).get("choices") or [{}])[0]
        return str((choice.get("delta") or {}).get("content") or "") + (
            f" <{choice['finish_reason']}>" if choice.get("finish_reason") else "")
    except (ValueError, AttributeError, IndexError, TypeError):
        return ""


@pytest.fixture
def local_model(tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(tmp_path / "llama.log", n_ctx=N_CTX) as server:
        yield server


def test_qwen_code_on_a_local_model_through_the_proxy(
        spawn: type[SpawnedDaemon], local_model: LlamaServer, tmp_path: Path) -> None:
    with Relay(local_model.base_url) as relay:
        # the daemon's side queries go to the same one-slot server (the obvious laptop set-up),
        # under the same URL as the proxy's upstream: that is how the daemon knows its side
        # queries must yield to the user's requests there. (Behind a URL of their own they did
        # not, and llama-cpp-python's server cut the user's answer short for an extraction.)
        d = spawn(env={"OPENAI_BASE_URL": relay.base_url, "OPENAI_API_KEY": "none",
                       "OPENAI_MODEL": "smollm2"})
        toml = d.home / ".config" / "qwenctxd" / "config.toml"
        toml.parent.mkdir(parents=True)
        toml.write_text(f'[model]\nprofile = "llamacpp"\ncontext_window = {N_CTX}\n')
        d.start()
        proj = project(d.root, "proj", "Keep answers short.\n")
        (proj / ".git").mkdir()
        d.call("memory.save", {"cwd": str(proj), "type": "project", "name": "deploy gate",
                               "description": MARKER, "body": f"Before a release: {MARKER}."})
        # answers capped at 96 tokens: SmolLM2 asked for Qwen Code's 32 000 rambles for minutes
        proxy = RunningProxy(d, relay.base_url, proj, extra_args=("--max-tokens", "96"))
        try:
            home = tmp_path / "qhome"
            (home / ".qwen").mkdir(parents=True)
            # the daemon does the memory work; Qwen Code's own extraction agent is off
            (home / ".qwen" / "settings.json").write_text(json.dumps(
                {"memory": {"enableManagedAutoMemory": False}}))
            cli = QwenCli(home=home, cwd=proj, base_url=proxy.base_url, api_key=proxy.key,
                          model="smollm2")
            # ~8 min on 2 cores: a 17k-token prompt, several times. Qwen Code gives up on a
            # stream that sends no chunk for 240 s and asks again; a loaded machine can take
            # longer than that to read the prompt, so its idle limit is raised to the bound
            proc = cli.run(prompt="What is the deploy gate called? One short sentence.",
                           timeout=1200, extra_env={"QWEN_STREAM_IDLE_TIMEOUT_MS": "1200000",
                                                 "QWEN_DEBUG_LOG_FILE": "1"})
            proxy_log = proxy.log_text()
            # the client waits longer than the drain may (its default read timeout is 30 s; the
            # extraction on the one-slot local server can take most of the drain's minute)
            with d.client(timeout=90) as c:
                c.call("daemon.drain", {"timeout_s": 60})
        finally:
            proxy.stop()
    assert proc.returncode == 0, (proc.stdout, proc.stderr, proxy_log[-3000:])
    assert proc.stdout.strip(), (proc.stdout, proc.stderr)
    assert not local_model.rejected(), (local_model.rejected(), local_model.log_text()[-3000:])
    main = [b for b in relay.bodies if any(
        (t.get("function") or {}).get("name") == "skill" for t in b.get("tools") or [])]
    assert main, [list(b) for b in relay.bodies]
    for body in main:
        # every declared function has parameters; max_tokens was capped to what is left
        assert all(isinstance(t["function"].get("parameters"), dict) for t in body["tools"])
        assert body["max_tokens"] <= 96
    system = main[0]["messages"][0]["content"]
    assert system.startswith("You are Qwen Code")
    assert MARKER in json.dumps(main[0]["messages"])  # the memory index or the recall reminder
    sessions = d.call("session.list", {"cwd": str(proj)})["sessions"]
    assert sessions, proxy_log[-2000:]
    # one conversation, one session, titled by the user's words: Qwen Code's one-shot side
    # query is folded away, and its re-asks of an answer it could not use (cut off by the
    # 96-token cap: finish_reason "length", which it retries with a larger budget) are
    # retries in the same session, not regenerates
    titles = [s.get("title") or "" for s in sessions]
    assert all(t.startswith("What is the deploy gate") for t in titles), titles
    if len(sessions) != 1:  # in full on stderr: an assertion's message is cut short
        sys.stderr.write(json.dumps({"proxy_log": proxy_log[-20000:],
                                     "exchanges": exchanges(relay),
                                     "qwen_retries": retries_of(home)}, indent=1) + "\n")
    assert len(sessions) == 1, ([(s.get("title"), s.get("messages")) for s in sessions],
                                proxy_log[-4000:], exchanges(relay), retries_of(home))
