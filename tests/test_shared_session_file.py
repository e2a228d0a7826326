"""A session file shared with another writer (Node, as Qwen Code writes) and a held session.

Node writers append 1.2 MB records to the session file the daemon is recording turns into:
``fs.promises.appendFile`` (Node cuts it into 512 KiB writes) and a writer issuing several
``fs.write`` calls per record from different async paths. Every record either side wrote must
read back, and no line may be unparseable. Node is required: the test fails loudly without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from qwenctxd.sessions import records, shared_file
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

NODE = shutil.which("node")
ROUNDS = 6
TURNS_PER_ROUND = 8

APPEND_FILE_WRITER = r"""
const fs = require('fs');
const [path, n, tag] = process.argv.slice(1);
(async () => {
  for (let i = 0; i < +n; i++) {
    const rec = {uuid: `${tag}-${i}`, parentUuid: null, sessionId: 's', timestamp: new Date().toISOString(),
                 type: 'user', cwd: '/', version: 'node',
                 message: {role: 'user', parts: [{text: 'x'.repeat(1200000)}]}};
    await fs.promises.appendFile(path, Buffer.from(JSON.stringify(rec) + '\n'), {flush: true});
    await new Promise(r => setTimeout(r, 30));
  }
})();
"""

# several write() calls per record, the next chunk issued from a timer/immediate callback
CHUNKED_WRITER = r"""
const fs = require('fs');
const [path, n, tag] = process.argv.slice(1);
const fd = fs.openSync(path, 'a');
const w = (buf) => new Promise((res, rej) => fs.write(fd, buf, 0, buf.length, null,
                                                     e => e ? rej(e) : res()));
(async () => {
  for (let i = 0; i < +n; i++) {
    const rec = {uuid: `${tag}-${i}`, parentUuid: null, sessionId: 's', timestamp: new Date().toISOString(),
                 type: 'user', cwd: '/', version: 'node',
                 message: {role: 'user', parts: [{text: 'y'.repeat(1200000)}]}};
    const buf = Buffer.from(JSON.stringify(rec) + '\n');
    const step = 300000;
    for (let off = 0; off < buf.length; off += step) {
      const chunk = buf.subarray(off, Math.min(buf.length, off + step));
      await new Promise(r => (off % 2 ? setImmediate : process.nextTick)(r));
      await w(chunk);
    }
    await new Promise(r => setTimeout(r, 30));
  }
  fs.closeSync(fd);
})();
"""


def _node() -> str:
    if NODE is None:
        raise AssertionError("node is required for this test (apt-get install -y nodejs)")
    return NODE


@pytest.fixture
def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = SpawnedDaemon(tmp_path / "d").start()
    yield d
    d.cleanup()


@pytest.mark.parametrize("script", [APPEND_FILE_WRITER, CHUNKED_WRITER],
                         ids=["appendFile", "chunked-writes"])
def test_node_writer_and_daemon_share_a_session(daemon: SpawnedDaemon, tmp_path: Path,
                                                script: str) -> None:
    cwd = tmp_path / "proj"
    cwd.mkdir()
    opened = daemon.call("session.open", {"cwd": str(cwd), "model": "m"})
    sid, path = opened["session_id"], Path(opened["path"])
    ours: list[str] = []
    with daemon.client() as c:
        for rnd in range(ROUNDS):
            size = path.stat().st_size
            node = subprocess.Popen([_node(), "-e", script, str(path), "3", f"node{rnd}"])
            # our turns while Node writes: from its first bytes, at most TURNS_PER_ROUND (each
            # reply carries the whole prompt; a slow Node start must not grow it past a frame)
            until(lambda: node.poll() is not None or path.stat().st_size != size,  # noqa: B023
                  timeout=30, what="Node's first write")
            deadline = time.monotonic() + 30
            i = 0
            while node.poll() is None and i < TURNS_PER_ROUND and time.monotonic() < deadline:
                text = f"round {rnd} turn {i} " + "z" * 200_000
                c.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
                c.call("session.record_model", {"session_id": sid, "message": {
                    "role": "assistant", "content": f"reply {rnd}.{i}"}})
                ours.append(f"reply {rnd}.{i}")
                i += 1
            assert node.wait(timeout=30) == 0
        c.call("session.close", {"session_id": sid})
    got = records.read_records(path)
    assert got.torn == [], ([t.reason for t in got.torn],
                            [ln for ln in daemon.log_text().splitlines() if "session file" in ln])
    uuids = {r.uuid for r in got.records}
    for rnd in range(ROUNDS):
        for k in range(3):
            assert f"node{rnd}-{k}" in uuids
    texts = [p.get("text") for r in got.records if r.message for p in r.message.get("parts", [])]
    for want in ours:
        assert want in texts, want
    # resume reads every branch back in file order
    state = records.resume(path)
    assert state.torn == []
    assert sum(1 for m in state.messages if m.get("role") == "assistant") >= len(ours)


def _fake_registration(qwen_home: Path, session_id: str, cwd: Path) -> Path:
    """A registry record for this (live) test process, exactly as Qwen Code writes one."""
    d = qwen_home / "sessions"
    d.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    rec = {"schemaVersion": 1, "pid": pid, "procStart": shared_file.proc_start_token(pid),
           "pidNs": os.stat("/proc/self/ns/pid").st_ino, "sessionId": session_id,
           "cwd": str(cwd), "name": "proj-ab", "startedAt": int(time.time() * 1000),
           "qwenVersion": "0.24.4", "kind": "tui"}
    p = d / f"{pid}.json"
    p.write_text(json.dumps(rec))
    return p


def test_session_open_warns_when_qwen_code_holds_it(daemon: SpawnedDaemon, tmp_path: Path) -> None:
    cwd = tmp_path / "proj"
    cwd.mkdir()
    opened = daemon.call("session.open", {"cwd": str(cwd), "model": "m"})
    sid = opened["session_id"]
    assert not any("running Qwen Code" in w for w in opened.get("warnings", []))
    daemon.call("session.close", {"session_id": sid})
    reg = _fake_registration(daemon.home / ".qwen", sid, cwd)
    again = daemon.call("session.open", {"cwd": str(cwd), "model": "m", "session_id": sid, "resume": True})
    held = [w for w in again["warnings"] if "running Qwen Code" in w]
    assert held and f"pid {os.getpid()}" in held[0], again["warnings"]
    daemon.call("session.close", {"session_id": sid})
    # a record whose process start time does not match (a reused pid) does not count
    rec = json.loads(reg.read_text())
    rec["procStart"] = rec["procStart"].rsplit(":", 1)[0] + ":1"
    reg.write_text(json.dumps(rec))
    third = daemon.call("session.open", {"cwd": str(cwd), "model": "m", "session_id": sid, "resume": True})
    assert not any("running Qwen Code" in w for w in third.get("warnings", []))
    assert reg.exists()  # never deleted: the directory is Qwen Code's


# -- the race the checks cannot close: a record begun between our last look and our write ----
def _foreign(tag: str, i: int, size: int = 4000) -> bytes:
    return (json.dumps({"uuid": f"{tag}-{i}", "parentUuid": None, "sessionId": "s",
                        "timestamp": "2026-12-02T00:00:00.000Z", "type": "user",
                        "message": {"role": "user", "parts": [{"text": "f" * size}]}}) + "\n").encode()


def test_an_interleaved_line_is_moved_after_the_record_it_landed_in(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    rec = _foreign("node", 0)
    ours = b'{"uuid":"ours","type":"user"}\n'
    path.write_bytes(_foreign("node", -1) + rec[:1000] + ours)
    fd = os.open(path, os.O_RDONLY)
    try:
        start = len(_foreign("node", -1)) + 1000
        torn = shared_file.Interleave(start, start + len(ours))
        assert shared_file.mend_interleave(path, fd, torn, time.monotonic()) == "wait"
        with path.open("ab") as fh:
            fh.write(rec[1000:])
        assert shared_file.mend_interleave(path, fd, torn, time.monotonic()) == "mended"
    finally:
        os.close(fd)
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines == [_foreign("node", -1), rec, ours]
    assert torn.ours_end == path.stat().st_size


def test_an_interleave_whose_record_never_ends_is_left_with_our_lines_intact(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    ours = b'{"uuid":"ours","type":"user"}\n'
    path.write_bytes(b'{"uuid":"dead","mess' + ours)
    fd = os.open(path, os.O_RDONLY)
    try:
        torn = shared_file.Interleave(20, 20 + len(ours))
        t0 = time.monotonic()
        assert shared_file.mend_interleave(path, fd, torn, t0) == "wait"
        assert shared_file.mend_interleave(path, fd, torn, t0 + shared_file.STALE_TAIL_S) == "gave_up"
    finally:
        os.close(fd)
    assert path.read_bytes().endswith(ours)

