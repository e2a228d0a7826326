"""Per-request tasks on one connection: out-of-order replies, per-session order, cancellation.

Spawned daemon, raw sockets in both framings, the scripted model server with a delay standing
in for a slow compression.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from qwenctxd.protocol.framing import FrameDecoder, Framing, encode
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SLOW_S = 4.0


class Wire:
    """A raw connection: send requests with chosen ids, read replies as they come."""

    def __init__(self, d: SpawnedDaemon, framing: Framing = Framing.NDJSON) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(d.socket))
        self.framing = framing
        self.dec = FrameDecoder(framing)

    def send(self, msg: Any) -> None:
        self.sock.sendall(encode(json.dumps(msg).encode(), self.framing))

    def request(self, rid: int, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def read(self) -> Any:
        while True:
            frame = self.dec.next_frame()
            if frame is not None:
                return json.loads(frame)
            chunk = self.sock.recv(65536)
            assert chunk, "daemon closed the connection"
            self.dec.feed(chunk)

    def close(self) -> None:
        self.sock.close()


def model_env(stub: ScriptedOpenAI) -> dict[str, str]:
    return {"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
            "OPENAI_API_KEY": "test"}


#: set when a test has seen what it waits for while the compression is held: the compression
#: answers then, else after SLOW_S as before
COMPRESSION_RELEASED = threading.Event()


def slow_compression(body: dict[str, Any]) -> Reply:
    sys_msgs = [m for m in body.get("messages", []) if m.get("role") == "system"]
    if sys_msgs and "state_snapshot" in str(sys_msgs[0].get("content")):
        COMPRESSION_RELEASED.wait(SLOW_S)
        return Reply(content="<state_snapshot>s</state_snapshot>")
    return Reply(content="ok")


@pytest.fixture
def stub():  # type: ignore[no-untyped-def]
    COMPRESSION_RELEASED.clear()
    with ScriptedOpenAI(handler=slow_compression) as s:
        try:
            yield s
        finally:
            COMPRESSION_RELEASED.set()  # a held handler thread ends before the server stops


def session_with_history(d: SpawnedDaemon) -> str:
    sid = d.call("session.open", {"cwd": str(d.home), "model": "stub-model"})["session_id"]
    for i in range(3):
        d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"question {i}"})
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"answer {i} " + "words " * 200}})
    assert d.call("daemon.drain", {"timeout_s": 20})["drained"]  # background model calls done
    return sid


def test_ping_answered_while_a_slow_compression_runs_on_the_same_connection(
    spawn, stub  # type: ignore[no-untyped-def]
) -> None:
    d = spawn(env=model_env(stub)).start()
    sid = session_with_history(d)
    w = Wire(d)
    w.request(1, "session.compress", {"session_id": sid, "mode": "full"})
    t0 = time.monotonic()
    w.request(2, "daemon.ping")
    first = w.read()
    assert first == {"jsonrpc": "2.0", "result": "pong", "id": 2}
    assert time.monotonic() - t0 < SLOW_S / 2  # not queued behind the compression
    COMPRESSION_RELEASED.set()
    second = w.read()
    assert second["id"] == 1 and "result" in second, second
    w.close()


@pytest.mark.parametrize("framing,cancel_method", [
    (Framing.NDJSON, "rpc.cancel"), (Framing.LSP, "rpc.cancel"), (Framing.LSP, "$/cancelRequest"),
])
def test_cancel_a_slow_call(spawn, stub, framing, cancel_method) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env=model_env(stub)).start()
    sid = session_with_history(d)
    [jsonl] = sorted(d.home.rglob(f"{sid}.jsonl"))
    size_before = jsonl.stat().st_size
    w = Wire(d, framing)
    w.request(1, "session.compress", {"session_id": sid, "mode": "full"})
    stub.wait_for_requests(1, timeout=15)  # the compression is waiting on the model
    t0 = time.monotonic()
    if cancel_method == "$/cancelRequest":
        w.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 1}})
        replies = [w.read()]
    else:
        w.request(2, "rpc.cancel", {"id": 1})
        replies = [w.read(), w.read()]
    assert time.monotonic() - t0 < SLOW_S / 2
    by_id = {r["id"]: r for r in replies}
    assert by_id[1]["error"]["code"] == -32800
    assert by_id[1]["error"]["message"] == "Request cancelled"
    if cancel_method == "rpc.cancel":
        assert by_id[2]["result"] == {"cancelled": True}
        w.request(3, "rpc.cancel", {"id": 1})  # nothing in flight any more
        assert w.read()["result"] == {"cancelled": False}
    w.request(4, "daemon.ping")
    assert w.read()["result"] == "pong"  # the connection goes on
    w.close()
    # the cancelled compression recorded nothing
    assert jsonl.stat().st_size == size_before


def test_cancelled_turn_records_nothing(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env=model_env(stub)).start()
    sid = session_with_history(d)
    jsonl = sorted(d.home.rglob(f"{sid}.jsonl"))
    assert jsonl, "session transcript not found"
    size_before = jsonl[0].stat().st_size
    w = Wire(d)
    # a compression holds the session; the queued turn behind it is cancelled before it runs
    w.request(1, "session.compress", {"session_id": sid, "mode": "full"})
    w.request(2, "session.turn", {"session_id": sid, "kind": "user", "text": "cancel me"})
    stub.wait_for_requests(1, timeout=15)
    w.request(3, "rpc.cancel", {"id": 2})
    w.request(4, "rpc.cancel", {"id": 1})
    replies = {r["id"]: r for r in (w.read(), w.read(), w.read(), w.read())}
    assert replies[2]["error"]["code"] == -32800 and replies[1]["error"]["code"] == -32800
    w.close()
    assert jsonl[0].stat().st_size == size_before  # nothing recorded
    p = d.call("session.turn", {"session_id": sid, "kind": "user", "text": "next"})
    texts = [m.get("content") for m in p["messages"] if m["role"] == "user"]
    assert "cancel me" not in json.dumps(texts) and "next" in json.dumps(texts)


def test_same_session_keeps_arrival_order(spawn, stub) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env=model_env(stub)).start()
    sid = session_with_history(d)
    other = d.call("session.open", {"cwd": str(d.home), "model": "stub-model"})["session_id"]
    w = Wire(d)
    w.request(1, "session.compress", {"session_id": sid, "mode": "full"})
    w.request(2, "session.turn", {"session_id": sid, "kind": "user", "text": "after compress"})
    w.request(3, "session.turn", {"session_id": other, "kind": "user", "text": "other"})
    w.request(4, "daemon.ping")
    order = [w.read()["id"] for _ in range(2)]  # what did not wait for the held compression
    COMPRESSION_RELEASED.set()
    order += [w.read()["id"] for _ in range(2)]
    # the other session and the ping do not wait; the same session's turn waits for the
    # compression that arrived before it
    assert order.index(1) < order.index(2), order
    assert order.index(3) < order.index(1) and order.index(4) < order.index(1), order
    w.close()
