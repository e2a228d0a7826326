"""The in-process daemon (:mod:`qwenctxd.testing.inprocess`): a request reaches the real
dispatcher with no socket and no process, errors come back as their client classes, a request
can be cancelled, requests naming one session keep their order, notifications arrive, and
cleanup leaves no thread, environment change, descriptor or file behind."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import Client, ConnectionLost, InvalidParams, MethodNotFound, RemoteError
from qwenctxd.protocol import errors, methods
from qwenctxd.protocol.daemon import Empty
from qwenctxd.protocol.framing import Framing
from qwenctxd.testing.inprocess import InProcessDaemon
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.wait import until

HOLD_S = 20.0  # a held compression answers after this unless released


class Raw:
    """Frames with chosen ids over a client's in-process transport, replies as they come."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def request(self, rid: int, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.client.send_raw(json.dumps(msg).encode())

    def read(self) -> dict[str, Any]:
        return json.loads(self.client.read_frame())


@pytest.fixture
def held() -> Iterator[tuple[ScriptedOpenAI, threading.Event]]:
    """A scripted model whose compression calls wait for the event (turns answer at once)."""
    release = threading.Event()

    def reply(body: dict[str, Any]) -> Reply:
        system = [m for m in body.get("messages", []) if m.get("role") == "system"]
        if system and "state_snapshot" in str(system[0].get("content")):
            release.wait(HOLD_S)
            return Reply(content="<state_snapshot>s</state_snapshot>")
        return Reply(content="ok")

    with ScriptedOpenAI(handler=reply) as stub:
        try:
            yield stub, release
        finally:
            release.set()  # a held handler thread ends before the server stops


@pytest.fixture
def model_daemon(held: tuple[ScriptedOpenAI, threading.Event]) -> Iterator[InProcessDaemon]:
    stub, _ = held
    with InProcessDaemon(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
                              "OPENAI_API_KEY": "test"}) as d:
        yield d


def session_with_history(d: InProcessDaemon) -> str:
    sid = d.call("session.open", {"cwd": str(d.home), "model": "stub-model"})["session_id"]
    for i in range(3):
        d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"question {i}"})
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"answer {i} " + "words " * 200}})
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
    return sid


@pytest.mark.parametrize("framing", [Framing.NDJSON, Framing.LSP])
def test_a_request_reaches_the_dispatcher_in_this_process(
        inprocess_daemon: InProcessDaemon, framing: Framing) -> None:
    with inprocess_daemon.client(framing=framing) as c:
        assert c.request(methods.DAEMON_PING, Empty()) == "pong"
        hello = c.request(methods.DAEMON_HELLO)
        status = c.call("daemon.status")
    assert hello.pid == os.getpid()  # served by this process
    assert status["state"] == "serving" and status["connections"] == 1
    assert set(status["secrets"].values()) == {0}  # a fresh daemon's numbers
    assert os.environ["HOME"] == str(inprocess_daemon.home)  # the daemon's HOME, for its life
    assert not inprocess_daemon.socket.exists()  # no socket file was ever bound


def test_errors_come_back_as_their_client_classes(inprocess_daemon: InProcessDaemon) -> None:
    with inprocess_daemon.client() as c:
        with pytest.raises(InvalidParams) as bad:
            c.call("memory.status", {})
        assert bad.value.code == errors.INVALID_PARAMS and "cwd" in bad.value.message
        with pytest.raises(MethodNotFound):
            c.call("memory.no_such_method")
        assert c.call("daemon.ping") == "pong"  # the connection goes on


def test_a_slow_request_is_cancelled(model_daemon: InProcessDaemon,
                                     held: tuple[ScriptedOpenAI, threading.Event]) -> None:
    stub, _ = held
    sid = session_with_history(model_daemon)
    asked = len(stub.chat_requests)
    with model_daemon.client() as c:
        raw = Raw(c)
        raw.request(1, "session.compress", {"session_id": sid, "mode": "full"})
        until(lambda: len(stub.chat_requests) > asked, timeout=15,
              what="the compression waiting on the model")
        raw.request(2, "rpc.cancel", {"id": 1})
        by_id = {r["id"]: r for r in (raw.read(), raw.read())}
        assert by_id[1]["error"]["code"] == errors.REQUEST_CANCELLED
        assert by_id[2]["result"] == {"cancelled": True}
        raw.request(3, "daemon.ping")
        assert raw.read() == {"jsonrpc": "2.0", "result": "pong", "id": 3}


def test_one_session_keeps_arrival_order(model_daemon: InProcessDaemon,
                                         held: tuple[ScriptedOpenAI, threading.Event]) -> None:
    _, release = held
    sid = session_with_history(model_daemon)
    other = model_daemon.call("session.open", {"cwd": str(model_daemon.home),
                                               "model": "stub-model"})["session_id"]
    with model_daemon.client() as c:
        raw = Raw(c)
        raw.request(1, "session.compress", {"session_id": sid, "mode": "full"})
        raw.request(2, "session.turn", {"session_id": sid, "kind": "user", "text": "after"})
        raw.request(3, "session.turn", {"session_id": other, "kind": "user", "text": "other"})
        raw.request(4, "daemon.ping")
        order = [raw.read()["id"] for _ in range(2)]  # what did not wait for the compression
        release.set()
        order += [raw.read()["id"] for _ in range(2)]
    assert order.index(1) < order.index(2), order
    assert order.index(3) < order.index(1) and order.index(4) < order.index(1), order


def test_notifications_reach_a_subscribed_client() -> None:
    with InProcessDaemon(env={"QWENCTXD_DEBUG_METHODS": "1"}) as d, d.client() as c:
        assert c.call("daemon.subscribe", {"topics": ["config/changed"]}) == {"ok": True}
        c.call("debug.publish", {"topic": "config/changed", "params": {"n": 1}})
        until(lambda: c.notifications or c.call("daemon.ping") != "pong",
              what="the published notification")
        assert c.notifications[0] == {"jsonrpc": "2.0", "method": "config/changed",
                                      "params": {"n": 1}}


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_cleanup_leaves_nothing() -> None:
    environ, threads, fds = dict(os.environ), set(threading.enumerate()), _open_fds()
    d = InProcessDaemon().start()
    client = d.client()
    assert client.call("session.open", {"cwd": str(d.home), "model": "m"})["session_id"]
    with pytest.raises(RuntimeError, match="another InProcessDaemon"):
        InProcessDaemon(root=d.root).start()  # one per process: it owns os.environ
    root = d.root
    d.cleanup()
    with pytest.raises(ConnectionLost):  # a client left open sees the daemon gone
        client.call("daemon.ping")
    client.close()
    assert dict(os.environ) == environ
    # the loop's thread is joined; its worker threads end as they see the loop gone
    until(lambda: set(threading.enumerate()) <= threads, what="the daemon's threads ending")
    until(lambda: len(_open_fds()) <= len(fds), what="the daemon's descriptors closed")
    assert not Path(root).exists()
    with InProcessDaemon() as again:  # the next one starts cleanly
        assert again.call("daemon.ping") == "pong"


def test_a_handler_error_is_not_a_transport_error(inprocess_daemon: InProcessDaemon) -> None:
    """A bad session id is the daemon's answer (a RemoteError), and the same client goes on."""
    with inprocess_daemon.client() as c:
        with pytest.raises(RemoteError) as missing:
            c.call("session.turn", {"session_id": "no-such", "kind": "user", "text": "x"})
        assert missing.value.code < 0
        assert c.call("daemon.ping") == "pong"
