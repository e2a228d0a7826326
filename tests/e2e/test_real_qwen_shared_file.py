"""The real Qwen Code CLI 0.24 and the daemon writing one session file at the same time.

Five rounds, each on a session the daemon opened and answered once: ``qwen --resume <id> -p …``
with a prompt of several hundred KB (piped on stdin, which the CLI puts before ``-p``; Node
writes that record, over 512 KiB, in several ``write()`` calls) while a thread drives the same
session through the daemon (``session.turn`` / ``session.record_model``) for the whole run.
Afterwards no line of the file is unparseable, every record the daemon acknowledged is there,
the CLI's big record is whole, and daemon records landed after it (the writes overlapped). The
first round's session holds a merged user turn (a ``mid_turn_user_message`` delta): the resumed
CLI sends it to the model as one user message carrying both parts.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from tests.e2e.qwen_cli import QwenCli

pytestmark = pytest.mark.real_qwen

ROUNDS = 5
PROMPT_BYTES = 600 * 1024  # one CLI record well over 512 KiB


def is_main(body: dict[str, Any]) -> bool:
    return any((t.get("function") or {}).get("name") == "skill" for t in body.get("tools") or [])


def texts(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


class DaemonWriter:
    """Drives one session through the daemon until stopped; remembers what was acknowledged."""

    def __init__(self, d: SpawnedDaemon, sid: str, tag: str) -> None:
        self.d, self.sid, self.tag = d, sid, tag
        self.acked: list[str] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.d.client() as c:
                n = 0
                while not self.stop.is_set() or n < 4:  # at least a few, however fast qwen is
                    q = f"daemon {self.tag} question {n} " + "q" * 2000
                    c.call("session.turn", {"session_id": self.sid, "kind": "user", "text": q})
                    self.acked.append(f"daemon {self.tag} question {n} ")
                    a = f"daemon {self.tag} answer {n} " + "a" * 2000
                    c.call("session.record_model", {"session_id": self.sid, "message": {
                        "role": "assistant", "content": a},
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
                    self.acked.append(f"daemon {self.tag} answer {n} ")
                    n += 1
                    # pacing the load (not a synchronisation): a turn every few milliseconds
                    self.stop.wait(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def __enter__(self) -> DaemonWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=120)


def check_file(path: Path, acked: list[str], marker: str) -> tuple[int, int]:
    """No unparseable line, every acknowledged daemon record there, the CLI's big prompt record
    whole and over 512 KiB; (records, bytes)."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = [line for line in raw.split(b"\n") if line.strip()]
    records, bad = [], []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError:
            bad.append((i, len(line), line[:120]))
    assert bad == [], f"{len(bad)} unparseable lines: {bad[:3]}"
    everything = "\n".join(json.dumps(rec.get("message") or {}, ensure_ascii=False)
                           for rec in records)
    missing = [a for a in acked if a not in everything]
    assert missing == [], f"{len(missing)} acknowledged daemon records missing: {missing[:5]}"
    big = [line for line in lines if marker.encode() in line]
    assert big, "the CLI's prompt record is lost"
    assert max(len(line) for line in big) > 512 * 1024
    last_big = max(i for i, line in enumerate(lines) if marker.encode() in line)
    assert any(b'"daemon ' in line for line in lines[last_big + 1:]), "the writes never overlapped"
    return len(records), len(raw)


def test_qwen_resuming_a_session_the_daemon_is_writing_loses_nothing(
        spawn: type[SpawnedDaemon]) -> None:
    with ScriptedOpenAI(default=Reply(content="cli answer")) as stub:
        d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k",
                       "OPENAI_MODEL": "scripted-model"}).start()
        proj = d.root / "proj"
        proj.mkdir()
        cli = QwenCli(home=d.home, cwd=proj, base_url=stub.base_url)
        figures = []
        for r in range(ROUNDS):
            with d.client() as c:  # a session of the daemon's, answered once
                sid = c.call("session.open", {"cwd": str(proj), "model": "scripted-model"})[
                    "session_id"]
                c.call("session.turn", {"session_id": sid, "kind": "user",
                                        "text": "merge part one"})
                if r == 0:  # another user turn joining the unanswered one: a recorded delta
                    merged = c.call("session.turn", {"session_id": sid, "kind": "user",
                                                     "text": "merge part two"})
                    assert any(e["type"] == "user_turn_merged" for e in merged["events"])
                c.call("session.record_model", {"session_id": sid, "message": {
                    "role": "assistant", "content": "first answer"}})
            path = cli.chats_dir() / f"{sid}.jsonl"
            marker = f"cli round {r} big prompt "
            # JSON doubles each of these characters (UTF-8 or an escape), Qwen Code counts one:
            # a record over 512 KiB whose prompt stays under its token limit
            big = marker + 'é"\\' * (PROMPT_BYTES // 6)
            before = len(stub.chat_requests)
            with DaemonWriter(d, sid, f"r{r}") as w:
                proc = cli.run("--resume", sid, prompt=f"round {r}: reply briefly",
                               stdin_text=big)
            assert w.error is None, w.error
            assert "Failed" not in proc.stderr, proc.stderr
            mains = [q.body for q in stub.chat_requests[before:] if is_main(q.body)]
            assert mains, f"round {r}: the resumed CLI sent no main request"
            msgs = mains[0]["messages"]
            if r == 0:  # Qwen Code's resume joined the delta into the user message before
                [joined] = [m for m in msgs if "merge part one" in texts(m)]
                assert joined["role"] == "user" and "merge part two" in texts(joined)
                assert not [m for m in msgs if m is not joined and "merge part two" in texts(m)]
            assert marker in texts(msgs[-1])
            with d.client() as c:
                c.call("session.close", {"session_id": sid})  # writes anything still queued
            n, size = check_file(path, w.acked, marker)
            figures.append((n, len(w.acked), size))
    print("rounds (records, acknowledged by the daemon, bytes):", figures)
