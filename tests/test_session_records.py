"""Session JSONL records: write/read, chaining, torn lines, resume from checkpoints, kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest

from qwenctxd.sessions import records as rec
from qwenctxd.sessions.jsonl_writer import JsonlWriter
from qwenctxd.sessions.records import ChatRecord, read_records, resume, scan_summary
from qwenctxd.testing.wait import until_async

SID = "0b6c1f3e-8d2a-4c53-9a57-3f1e2d4c5b6a"


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: object) -> dict:
    return {"role": "assistant", "content": text, **extra}


def tool(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QWEN_RUNTIME_DIR", str(tmp_path / "qwen"))
    return rec.session_path(tmp_path / "proj", SID)


def test_paths(tmp_path: Path, path: Path) -> None:
    assert rec.chats_dir(tmp_path / "proj") == path.parent
    assert path.parent.parent.parent == tmp_path / "qwen" / "projects"
    assert path.name == f"{SID}.jsonl"
    with pytest.raises(ValueError):
        rec.session_path(tmp_path, "../../etc/passwd")


def test_write_then_read_and_chain(path: Path) -> None:
    with JsonlWriter(path, cwd="/w/proj", version="9.9", fsync="never") as w:
        a = w.append_message("user", user("hi"))
        b = w.append_message(
            "assistant",
            assistant("", tool_calls=[{"id": "c1", "type": "function",
                                       "function": {"name": "ls", "arguments": "{}"}}]),
            usage={"prompt_tokens": 10, "completion_tokens": 2},
            model="qwen3-coder",
        )
        c = w.append_message("tool_result", tool("c1", "a.txt"))
        explicit = w.append(ChatRecord(type="user", parentUuid=a.uuid, message=user("branch")))
        root = w.append(ChatRecord(type="user", message=user("root")), chain=False)
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    res = read_records(path)
    assert res.torn == []
    got = res.records
    assert [r.uuid for r in got] == [a.uuid, b.uuid, c.uuid, explicit.uuid, root.uuid]
    assert got[0].parentUuid is None
    assert got[1].parentUuid == a.uuid and got[2].parentUuid == b.uuid
    assert got[3].parentUuid == a.uuid  # given → kept
    assert got[4].parentUuid is None
    assert all(r.sessionId == SID and r.cwd == "/w/proj" and r.version == "9.9" for r in got)
    assert got[1].usageMetadata == {"promptTokenCount": 10, "candidatesTokenCount": 2,
                                    "totalTokenCount": 12}
    assert got[1].model == "qwen3-coder"
    # Qwen Code's own payload: a Gemini Content with a functionCall part
    assert got[1].message == {"role": "model", "parts": [
        {"functionCall": {"id": "c1", "name": "ls", "args": {}}}]}
    assert got[2].message == {"role": "user", "parts": [
        {"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a.txt"}}}]}
    assert got[0].timestamp.endswith("Z") and "T" in got[0].timestamp
    # the line uses Qwen Code's camelCase names and omits unset fields
    first = json.loads(path.read_bytes().splitlines()[1])
    assert first["parentUuid"] == a.uuid and first["sessionId"] == SID
    assert "systemPayload" not in first and "subtype" not in first


def test_reopened_writer_continues_the_chain(path: Path) -> None:
    with JsonlWriter(path, fsync="never") as w:
        a = w.append_message("user", user("one"))
    with JsonlWriter(path, fsync="never") as w:
        assert w.last_uuid == a.uuid
        b = w.append_message("assistant", assistant("two"))
    assert b.parentUuid == a.uuid
    assert [r.uuid for r in read_records(path).records] == [a.uuid, b.uuid]


def test_empty_and_missing_file(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert read_records(path).records == []
    st = resume(path)
    assert st.messages == [] and st.records == 0 and st.torn == []
    with pytest.raises(FileNotFoundError):
        read_records(path.with_name("nope.jsonl"))


def _write(path: Path, n: int) -> list[ChatRecord]:
    with JsonlWriter(path, fsync="never") as w:
        return [w.append_message("user", user(f"m{i}")) for i in range(n)]


def test_torn_last_line_is_skipped_and_reported(path: Path) -> None:
    written = _write(path, 3)
    half = msgspec.json.encode(ChatRecord(type="user", uuid="x", message=user("y" * 100)))
    with open(path, "ab") as f:
        f.write(half[: len(half) // 2])
    res = read_records(path)
    assert [r.uuid for r in res.records] == [r.uuid for r in written]
    assert len(res.torn) == 1
    t = res.torn[0]
    assert t.line_no == 4 and "torn tail" in t.reason
    assert t.data == half[: len(half) // 2] and t.length == len(half) // 2
    st = resume(path)
    assert [m["content"] for m in st.messages] == ["m0", "m1", "m2"]
    assert [x.line_no for x in st.torn] == [4]


def _crashed_a_minute_ago(path: Path) -> None:
    t = time.time() - 60
    os.utime(path, (t, t))


def test_a_fresh_partial_tail_is_a_live_writers_record_and_is_waited_for(path: Path) -> None:
    """Opening a writer on a file whose last line is still being written (a running Qwen Code)
    must not close that line: the append waits until the other writer finishes it."""
    written = _write(path, 1)
    other = ChatRecord(type="user", uuid="theirs", message=user("x" * 1000))
    line = msgspec.json.encode(other) + b"\n"
    with open(path, "ab") as f:
        f.write(line[:400])
    w = JsonlWriter(path, fsync="never")
    with open(path, "ab") as f:
        f.write(line[400:])
    new = w.append_message("user", user("ours"))
    w.close()
    res = read_records(path)
    assert res.torn == []
    assert [r.uuid for r in res.records] == [written[0].uuid, "theirs", new.uuid]


def test_an_append_waits_while_a_live_writers_partial_tail_is_unfinished(path: Path) -> None:
    """The size at open is not ours when the file ends inside another writer's record: the
    append is held (nothing written after the partial line) until that record ends."""
    written = _write(path, 1)
    line = msgspec.json.encode(ChatRecord(type="user", uuid="theirs", message=user("y"))) + b"\n"
    with open(path, "ab") as f:
        f.write(line[:30])

    async def scenario() -> ChatRecord:
        w = JsonlWriter(path, fsync="never")
        before = path.read_bytes()  # noqa: ASYNC240
        new = w.append_message("user", user("ours"))  # on a loop: deferred, never blocking
        assert w.pending == 1
        await asyncio.sleep(0.1)  # sleep-ok: the other record stays unfinished this long
        assert w.pending == 1
        assert path.read_bytes() == before  # noqa: ASYNC240
        with open(path, "ab") as f:  # noqa: ASYNC230
            f.write(line[30:])
        await until_async(lambda: w.pending == 0, timeout=5, what="the held append written")
        w.close()
        return new

    new = asyncio.run(scenario())
    res = read_records(path)
    assert res.torn == []
    assert [r.uuid for r in res.records] == [written[0].uuid, "theirs", new.uuid]


def test_append_after_torn_tail_starts_a_fresh_line(path: Path) -> None:
    written = _write(path, 2)
    with open(path, "ab") as f:
        f.write(b'{"uuid":"torn","type":"us')
    _crashed_a_minute_ago(path)
    with JsonlWriter(path, fsync="never") as w:
        assert w.last_uuid == written[-1].uuid  # the torn line is not a parent
        new = w.append_message("user", user("after crash"))
    assert new.parentUuid == written[-1].uuid
    res = read_records(path)
    assert [r.uuid for r in res.records] == [written[0].uuid, written[1].uuid, new.uuid]
    assert [t.line_no for t in res.torn] == [3]
    assert "undecodable" in res.torn[0].reason
    assert resume(path).messages[-1]["content"] == "after crash"


def test_complete_line_without_newline_counts(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(msgspec.json.encode(ChatRecord(type="user", uuid="u1", message=user("a"))))
    assert [r.uuid for r in read_records(path).records] == ["u1"]
    _crashed_a_minute_ago(path)
    with JsonlWriter(path, fsync="never") as w:
        b = w.append_message("user", user("b"))
    assert b.parentUuid == "u1"
    assert [r.uuid for r in read_records(path).records] == ["u1", b.uuid]


def test_garbage_line_in_the_middle(path: Path) -> None:
    _write(path, 2)
    with open(path, "ab") as f:
        f.write(b"\x00\xffnot json at all\n\n")
        f.write(b'{"type":"nonsense","uuid":"z"}\n')
    _write(path, 1)
    res = read_records(path)
    assert len(res.records) == 3
    assert [t.line_no for t in res.torn] == [3, 5]  # the blank line 4 is not reported
    assert resume(path).records == 3
    assert scan_summary(path).messages == 3


def test_unknown_fields_are_ignored(path: Path) -> None:
    path.parent.mkdir(parents=True)
    line = {
        "uuid": "u1", "parentUuid": None, "sessionId": SID, "timestamp": "2025-01-01T00:00:00.000Z",
        "type": "user", "cwd": "/p", "version": "1", "message": user("hi"),
        "gitBranch": "main", "provenance": "real_user", "toolCallResult": {"status": "ok"},
        "futureThing": [1, {"a": None}],
    }
    path.write_text(json.dumps(line) + "\n")
    res = read_records(path)
    assert res.torn == [] and res.records[0].message == user("hi")
    assert resume(path).messages == [user("hi")]


def test_resume_without_checkpoint(path: Path) -> None:
    with JsonlWriter(path, cwd="/w/p", fsync="never") as w:
        first = w.append_message("user", user("q1"))
        w.append_message("assistant", assistant("a1"), usage={"prompt_tokens": 5,
                                                              "completion_tokens": 1})
        w.append_system("slash_command", {"phase": "invocation", "rawCommand": "/x"})
        w.append(ChatRecord(type="assistant", message=None))  # no message → skipped
        w.append_message("user", user("q2"))
        last = w.append_message("assistant", assistant("a2"), model="m2")
    st = resume(path)
    assert [m["content"] for m in st.messages] == ["q1", "a1", "q2", "a2"]
    assert st.checkpoint_uuid is None
    assert st.records == 6
    assert st.last_usage == {"prompt_tokens": 5, "completion_tokens": 1}
    assert st.anchor_index == 2
    assert st.last_model == "m2"
    assert st.started_at == first.timestamp and st.updated_at == last.timestamp
    assert st.cwd == "/w/p" and st.title is None
    assert st.last_uuid == last.uuid


def test_resume_uses_the_latest_of_two_checkpoints(path: Path) -> None:
    with JsonlWriter(path, fsync="never") as w:
        w.append_message("user", user("old1"))
        w.append_message("assistant", assistant("old2"), usage={"prompt_tokens": 900,
                                                                "completion_tokens": 9})
        w.append_checkpoint([user("summary-1"), assistant("ack-1")], info={"n": 1})
        w.append_message("user", user("mid"))
        w.append_message("assistant", assistant("mid-a"), usage={"prompt_tokens": 300,
                                                                 "completion_tokens": 3})
        cp2 = w.append_checkpoint([user("summary-2"), assistant("ack-2")])
        w.append_message("user", user("new-q"))
        w.append_message("assistant", assistant("new-a"), usage={"prompt_tokens": 120,
                                                                 "completion_tokens": 7})
        w.append_message("tool_result", tool("c9", "out"))
    st = resume(path)
    assert [m["content"] for m in st.messages] == [
        "summary-2", "ack-2", "new-q", "new-a", "out"]
    assert st.checkpoint_uuid == cp2.uuid
    assert st.last_usage == {"prompt_tokens": 120, "completion_tokens": 7}
    assert st.anchor_index == 4
    assert st.records == 9


def test_usage_before_the_checkpoint_is_not_an_anchor(path: Path) -> None:
    with JsonlWriter(path, fsync="never") as w:
        w.append_message("assistant", assistant("a"), usage={"prompt_tokens": 1,
                                                             "completion_tokens": 1})
        w.append_checkpoint([user("s")])
        w.append_message("user", user("q"))
    st = resume(path)
    assert st.messages == [user("s"), user("q")]
    assert st.last_usage is None and st.anchor_index is None


def test_custom_title_latest_wins(path: Path) -> None:
    with JsonlWriter(path, fsync="never") as w:
        w.append_message("user", user("q"))
        w.append_title("first")
        w.append_checkpoint([user("s")])
        w.append_title("second", source="auto")
    assert resume(path).title == "second"
    summary = scan_summary(path)
    assert summary.title == "second"


def test_scan_summary(path: Path) -> None:
    with JsonlWriter(path, cwd="/w/p", fsync="never") as w:
        a = w.append_message("user", user("q"))
        w.append_system("ui_telemetry", {"x": 1})
        w.append(ChatRecord(type="assistant"))  # message absent
        w.append(ChatRecord(type="assistant", message=None))
        b = w.append_message("assistant", assistant("a"))
    s = scan_summary(path)
    st = path.stat()
    assert (s.session_id, s.path, s.cwd) == (SID, str(path), "/w/p")
    assert (s.started_at, s.updated_at, s.messages) == (a.timestamp, b.timestamp, 2)
    assert (s.size, s.mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_fsync_policies(path: Path, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(rec.os, "fsync", counting)
    w = JsonlWriter(path, fsync=policy, fsync_interval=3600)  # type: ignore[arg-type]
    created = len(calls)  # the directory entry of a new file
    for i in range(5):
        w.append_message("user", user(str(i)))
    appended = len(calls) - created
    w.close()
    w.close()  # idempotent
    closing = len(calls) - created - appended
    assert (created, appended, closing) == {
        "always": (1, 5, 0), "interval": (1, 0, 1), "never": (0, 0, 0)}[policy]
    assert len(read_records(path).records) == 5
    with pytest.raises(ValueError):
        w.append_message("user", user("closed"))


def test_bad_fsync_policy(path: Path) -> None:
    with pytest.raises(ValueError):
        JsonlWriter(path, fsync="sometimes")  # type: ignore[arg-type]


_CHILD = textwrap.dedent(
    """
    import sys
    from qwenctxd.sessions.jsonl_writer import JsonlWriter
    w = JsonlWriter(sys.argv[1], fsync="never")
    big = "x" * 200_000
    i = 0
    while True:
        w.append_message("user", {"role": "user", "content": f"{i}:" + big})
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
        i += 1
    """
)


def test_kill9_mid_append_loses_at_most_the_last_line(path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    acked = -1
    try:
        for line in proc.stdout:
            acked = int(line)
            if acked >= 60:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.stdout.close()
        proc.wait()
    acked = max([acked, *(int(x) for x in rest.split())])
    res = read_records(path)
    ids = [int(r.message["parts"][0]["text"].split(":", 1)[0]) for r in res.records]
    assert ids == list(range(len(ids)))  # in order, no gaps
    assert len(ids) >= acked + 1  # every acknowledged (fully written) record is there
    assert len(ids) <= acked + 2
    assert len(res.torn) <= 1
    if res.torn:
        assert res.torn[0].line_no == len(ids) + 1
    # the session keeps going after the crash
    with JsonlWriter(path, fsync="never") as w:
        w.append_message("user", user("after"))
    again = read_records(path)
    assert len(again.records) == len(ids) + 1 and len(again.torn) == len(res.torn)
    assert resume(path).messages[-1] == user("after")


def test_record_uuids_are_random_version_4_and_differ_in_a_forked_child() -> None:
    """Record ids come from a PRNG seeded from the OS per process (no syscall per id): valid
    version-4 uuids, no repeats, and a forked daemon does not replay its parent's sequence."""
    import uuid

    ids = [rec.record_uuid() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(uuid.UUID(i).version == 4 and uuid.UUID(i).variant == uuid.RFC_4122
               for i in ids[:100])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes its next id and leaves at once
        os.close(r)
        os.write(w, rec.record_uuid().encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child = f.read().decode()
    os.waitpid(pid, 0)
    assert uuid.UUID(child).version == 4
    assert child != rec.record_uuid()
