"""One greedy connection cannot eat the machine: 14 pipelined 3 MB user turns that the client
does not read (each joins the unanswered one before: a merge) leave the daemon's peak RSS and
the session file bounded, and another client is served meanwhile. Every merge appends only its
own part to the JSONL (a ``mid_turn_user_message``), so the file grows with what was sent, not
with its square."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

TURNS = 14
TEXT_BYTES = 3 * 1024 * 1024  # under limits.max_message_bytes (4 MiB by default)
PEAK_RSS_BOUND = 600 * 1024 * 1024
JSONL_FACTOR = 3  # the file stays under 3 x the bytes sent


def vm_hwm(pid: int) -> int:
    """The process's peak resident set (VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def test_pipelined_large_merges_keep_rss_and_the_file_bounded(spawn: type[SpawnedDaemon]) -> None:
    # a fresh interpreter: the peak RSS is then the daemon's own, not that of a fork of the
    # test session's zygote (which holds every module of qwenctxd and qwenctl, the clients'
    # SDKs among them)
    d = spawn(fresh=True).start()
    assert d.proc is not None
    repo = d.root / "repo"
    repo.mkdir()
    sid = d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    frames = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "session.turn", "params": {
        "session_id": sid, "kind": "user",
        "text": f"turn {i} " + chr(ord("a") + i) * TEXT_BYTES}}).encode() + b"\n"
        for i in range(TURNS)]
    sent = sum(len(f) for f in frames)
    greedy = socket.socket(socket.AF_UNIX)
    greedy.connect(str(d.socket))
    progress = {"sent": 0, "error": None}

    def send_all() -> None:
        try:
            for f in frames:
                greedy.sendall(f)
                progress["sent"] += len(f)
        except OSError as exc:  # pragma: no cover - reported by the assertion below
            progress["error"] = exc

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    path_of = d.home / ".qwen" / "projects"

    def session_file() -> Path | None:
        found = list(path_of.glob(f"*/chats/{sid}.jsonl"))
        return found[0] if found else None

    def merges_recorded() -> int:
        p = session_file()
        return p.read_bytes().count(b'"mid_turn_user_message"') if p else 0

    # the greedy client reads nothing: the daemon stops reading it once its unsent replies
    # pass the high-water mark; meanwhile another client is served, a session of its own too
    until(lambda: merges_recorded() >= 1, timeout=60, what="the first merge recorded")
    with d.client() as other:
        assert other.call("daemon.ping") == "pong"
        other_sid = other.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
        got = other.call("session.turn", {"session_id": other_sid, "kind": "user", "text": "hi"})
        assert got["messages"][-1]["role"] == "user"
    stalled_rss = vm_hwm(d.proc.pid)

    # now it reads its replies (and throws them away): every turn is answered
    replies = {"n": 0, "bytes": 0, "errors": []}

    def read_all() -> None:
        buf = bytearray()
        while replies["n"] < TURNS:
            chunk = greedy.recv(1 << 20)
            if not chunk:
                return
            buf += chunk
            while (nl := buf.find(b"\n")) >= 0:
                line = bytes(buf[:nl])
                del buf[:nl + 1]
                replies["n"] += 1
                replies["bytes"] += len(line)
                if b'"error"' in line[:200]:
                    replies["errors"].append(line[:300])

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(timeout=300)
    sender.join(timeout=60)
    greedy.close()
    assert progress["error"] is None and progress["sent"] == sent
    assert replies["n"] == TURNS and replies["errors"] == [], replies

    peak = vm_hwm(d.proc.pid)
    path = session_file()
    assert path is not None
    size = path.stat().st_size
    print(f"sent {sent / 2**20:.1f} MiB; replies {replies['bytes'] / 2**20:.1f} MiB; "
          f"peak RSS {peak / 2**20:.0f} MiB (while stalled {stalled_rss / 2**20:.0f} MiB); "
          f"JSONL {size / 2**20:.1f} MiB")
    assert merges_recorded() == TURNS - 1
    assert peak < PEAK_RSS_BOUND, f"peak RSS {peak} bytes"
    assert size < JSONL_FACTOR * sent, f"JSONL {size} bytes for {sent} sent"
    assert d.call("daemon.ping") == "pong"
