"""The typed client through a spawned daemon: ``request(methods.X, Params)`` returns the
table's result struct, and every error code arrives as its own class — a ``RemoteError`` and
the server's class of the same name at once."""

from __future__ import annotations

import time

import anyio
import msgspec
import pytest

from qwenctxd import client as qc
from qwenctxd.client import errors as cerrors
from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import errors as perrors
from qwenctxd.protocol import instructions as iwire
from qwenctxd.protocol import memory as mwire
from qwenctxd.protocol import methods, notifications, turn_events
from qwenctxd.protocol import session as swire
from qwenctxd.protocol import speculation as spwire
from qwenctxd.protocol.framing import Framing
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until_async

SECRET = "token ghp_" + "a1B2c3D4e5" * 3 + "a1B2c3"


def raised(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(qc.RemoteError) as exc:
        fn(*args)
    return exc.value


def check(err: qc.RemoteError, cls: type[qc.RemoteError], code: int) -> None:
    assert type(err) is cls, (type(err), err)
    assert err.code == code == cls.code
    # the server's class of the same name catches it too
    server_cls = perrors.ERROR_CLASSES[code]
    assert server_cls.__name__ == cls.__name__ and isinstance(err, server_cls)


def test_typed_results(daemon: SpawnedDaemon) -> None:
    with daemon.client() as c:
        assert c.request(methods.DAEMON_PING) == "pong"
        hello = c.request(methods.DAEMON_HELLO, dwire.HelloParams())
        assert isinstance(hello, dwire.HelloResult) and hello.pid > 0
        opened = c.request(methods.SESSION_OPEN,
                           swire.OpenParams(cwd=str(daemon.home), model="qwen3-coder-plus"))
        assert isinstance(opened, swire.OpenResult)
        prompt = c.request(methods.SESSION_TURN, swire.TurnParams(
            session_id=opened.session_id, kind="user", text="hello there"))
        assert isinstance(prompt, swire.AssembledPrompt)
        assert "hello there" in str(prompt.messages[-1]["content"])
        status = c.request(methods.DAEMON_STATUS)
        assert [s.session_id for s in status.sessions] == [opened.session_id]
        with pytest.raises(TypeError, match="session.turn takes TurnParams"):
            c.request(methods.SESSION_TURN, swire.OpenParams(cwd="/", model="m"))  # type: ignore[arg-type]


def test_each_error_code_arrives_as_its_class(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"})
    (d.home / ".qwen").mkdir(parents=True)
    (d.home / ".qwen" / "settings.json").write_text('{"memory": {"enableTeamMemory": true}}')
    d.start()
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    with d.client() as c:
        # -32700: a frame that is not JSON
        c.send_raw(b'{"jsonrpc": "2.0", "method"')
        reply = msgspec.json.decode(c.read_frame())
        check(qc.RemoteError.from_wire(reply["error"]), qc.ParseError, -32700)
        # -32600: a batch over the member limit
        err = raised(c.batch, [("daemon.ping", None)] * 257)
        check(err, qc.InvalidRequest, -32600)
        check(raised(c.call, "no.such.method"), qc.MethodNotFound, -32601)
        err = raised(c.request, methods.SESSION_OPEN, swire.OpenParams(cwd="relative/dir", model="m"))
        check(err, qc.InvalidParams, -32602)
        assert err.data["field"] == "cwd"
        err = raised(c.request, methods.SESSION_TURN,
                     swire.TurnParams(session_id="no-such-session", kind="user", text="x"))
        check(err, qc.SessionNotFound, -32001)
        sid = c.request(methods.SESSION_OPEN, swire.OpenParams(cwd=str(repo), model="m")).session_id
        err = raised(c.request, methods.SPECULATION_START,
                     spwire.StartParams(session_id=sid, suggestion="run the tests"))
        check(err, qc.ModelUnavailable, -32002)
        err = raised(c.request, methods.MEMORY_FORGET,
                     mwire.ForgetParams(cwd=str(repo), paths=["/etc/passwd"]))
        check(err, qc.PathOutsideProject, -32003)
        err = raised(c.request, methods.MEMORY_SAVE, mwire.SaveParams(
            cwd=str(repo), type="reference", name="CI token", description="the CI token",
            body=f"CI uses {SECRET}", scope="team"))
        check(err, qc.SecretDetected, -32004)
        assert "github-pat" in err.data["rules"]
        err = raised(c.request, methods.PROMPT_SYSTEM,
                     iwire.PromptSystemParams(cwd=str(repo), env={"QWEN_SYSTEM_MD": "1"}))
        check(err, qc.SystemPromptFileError, -32010)
        assert isinstance(err, qc.SystemPromptFileError) and err.reason and err.path
        # -32005: new work while draining
        c.call("debug.sleep_task", {"seconds": 1.0})
        c.request(methods.DAEMON_SHUTDOWN, dwire.ShutdownParams(drain=True, timeout_s=5))
        check(raised(c.call, "debug.sleep_task", {"seconds": 1}), qc.Busy, -32005)


def test_every_server_code_has_a_client_class() -> None:
    assert set(cerrors.REMOTE_ERRORS) == set(perrors.ERROR_CLASSES)
    for code, server_cls in perrors.ERROR_CLASSES.items():
        err = qc.RemoteError.from_wire({"code": code, "message": "m", "data": {"k": 1}})
        assert isinstance(err, qc.RemoteError) and isinstance(err, server_cls)
        assert type(err).__name__ == server_cls.__name__
        assert (err.code, err.message, err.data, str(err)) == (code, "m", {"k": 1}, f"[{code}] m")
    unknown = qc.RemoteError.from_wire({"code": -32099, "message": "new"})
    assert type(unknown) is qc.RemoteError and unknown.code == -32099


def slow_compression(body: dict[str, object]) -> Reply:
    msgs = body.get("messages") or []
    system = [m for m in msgs if isinstance(m, dict) and m.get("role") == "system"]
    if system and "state_snapshot" in str(system[0].get("content")):
        return Reply(content="<state_snapshot>s</state_snapshot>", delay_s=4.0)
    return Reply(content="ok")


@pytest.mark.parametrize("framing", [Framing.NDJSON, Framing.LSP])
def test_cancelled_request_raises_request_cancelled(spawn, framing: Framing) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(handler=slow_compression) as stub:
        d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
                       "OPENAI_API_KEY": "test"}).start()
        sid = d.call("session.open", {"cwd": str(d.home), "model": "stub-model"})["session_id"]
        for i in range(3):
            d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"q {i}"})
            d.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": f"answer {i} " + "words " * 200}})
        assert d.call("daemon.drain", {"timeout_s": 20})["drained"]
        seen = len(stub.requests)

        async def main() -> qc.RemoteError:
            async with qc.AsyncClient(d.socket, framing=framing) as c:
                caught: list[qc.RemoteError] = []

                async def compress() -> None:
                    try:
                        await c.request(methods.SESSION_COMPRESS,
                                        swire.CompressParams(session_id=sid, mode="full"))
                    except qc.RemoteError as exc:
                        caught.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(compress)
                    await until_async(lambda: len(stub.requests) > seen, timeout=20,
                                      what="the compression's model call")
                    # the compression is request 1 of this connection
                    got = await c.request(methods.RPC_CANCEL, dwire.CancelParams(id=1))
                    assert got == dwire.CancelResult(cancelled=True)
                return caught[0]

        err = anyio.run(main)
        check(err, qc.RequestCancelled, -32800)


def test_notification_payloads_are_typed(spawn) -> None:  # type: ignore[no-untyped-def]
    assert set(notifications.NOTIFICATIONS) == set(dwire.TOPICS)
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    with d.client() as sub:
        sub.request(methods.DAEMON_SUBSCRIBE, dwire.SubscribeParams(topics=["background/progress"]))
        d.call("debug.sleep_task", {"seconds": 0.01})
        assert d.call("daemon.drain", {"timeout_s": 10})["drained"]
        deadline = time.monotonic() + 10

        def debug_states() -> list[notifications.BackgroundProgress]:
            return [p for p in states() if p.kind == "debug"]

        def states() -> list[object]:
            return [notifications.payload(n) for n in sub.notifications]

        # other start-up jobs may report too: wait for the debug task's two states
        while len(debug_states()) < 2 and time.monotonic() < deadline:
            sub.request(methods.DAEMON_PING)  # notifications arrive in between replies
        everything = states()
        ours = debug_states()
    assert all(isinstance(p, notifications.BackgroundProgress) for p in everything)
    assert [p.state for p in ours][:2] == ["started", "completed"]


def test_turn_and_compress_events_are_typed(daemon: SpawnedDaemon) -> None:
    with daemon.client() as c:
        sid = c.request(methods.SESSION_OPEN, swire.OpenParams(
            cwd=str(daemon.home), model="qwen3-coder-plus")).session_id
        c.request(methods.SESSION_TURN, swire.TurnParams(session_id=sid, kind="user",
                                                         text="read them"))
        for i in range(8):
            c.request(methods.SESSION_RECORD_MODEL, swire.RecordModelParams(
                session_id=sid, message={"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {
                        "name": "read_file", "arguments": f'{{"path": "/src/f{i}.py"}}'}}]}))
            c.request(methods.SESSION_TURN, swire.TurnParams(
                session_id=sid, kind="tool_results", tool_results=[
                    swire.ToolResult(tool_call_id=f"c{i}", content="data " * 2000)]))
        c.request(methods.SESSION_RECORD_MODEL, swire.RecordModelParams(
            session_id=sid, message={"role": "assistant", "content": "", "tool_calls": [
                {"id": "late", "type": "function",
                 "function": {"name": "read_file", "arguments": "{}"}}]}))
        abandoned = c.request(methods.SESSION_TURN, swire.TurnParams(
            session_id=sid, kind="user", text="never mind"))
        merged = c.request(methods.SESSION_TURN, swire.TurnParams(
            session_id=sid, kind="user", text="and again"))
        fast = c.request(methods.SESSION_COMPRESS,
                         swire.CompressParams(session_id=sid, mode="fast"))
    assert turn_events.parse_all(abandoned.events) == [
        turn_events.ToolCallsAbandoned(tool_call_ids=["late"])]
    assert turn_events.parse_all(merged.events) == [turn_events.UserTurnMerged()]
    assert fast.status == "compressed" and fast.tokens_after < fast.tokens_before
    [micro] = turn_events.parse_all(fast.events)
    assert isinstance(micro, turn_events.MicroCompacted)
    assert micro.trigger == "force" and micro.cleared["tool"] == 3 and micro.tokens_saved > 0
    assert micro.evicted_read_paths == ["/src/f0.py", "/src/f1.py", "/src/f2.py"]
    # a type this client does not know stays a dict
    assert turn_events.parse({"type": "from_the_future", "x": 1}) == {
        "type": "from_the_future", "x": 1}
