"""session.search through the socket: planted facts in many sessions and projects (English,
Chinese, Japanese; user, assistant, tool; one folded by a compaction) found at the right session
and entry; files another program writes, changes and removes, seen without a restart; filters;
hostile queries; bad params → -32602 naming the field; a corrupt index rebuilt."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.paths import project_slug
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

SUMMARY = ("<state_snapshot>\n<primary_request_and_intent>keep going with the task"
           "</primary_request_and_intent>\n<next_step>continue</next_step>\n</state_snapshot>")


def chats(d: SpawnedDaemon, project: Path) -> Path:
    return d.home / ".qwen" / "projects" / project_slug(project) / "chats"


def qwen_records(cwd: Path, sid: str, turns: list[tuple[str, str]], *,
                 start: int = 0) -> list[str]:
    """Lines as the Qwen Code CLI writes them: ``(role, text)`` with role user / model /
    tool (a functionResponse) / compression (a chat_compression record)."""
    base = {"sessionId": sid, "cwd": str(cwd), "version": "0.24.4"}
    out = []
    for i, (role, text) in enumerate(turns, start):
        rec: dict[str, Any]
        if role == "user":
            rec = {"type": "user", "message": {"role": "user", "parts": [{"text": text}]}}
        elif role == "model":
            rec = {"type": "assistant", "model": "m",
                   "message": {"role": "model", "parts": [{"text": text}]}}
        elif role == "tool":
            rec = {"type": "tool_result", "message": {"role": "user", "parts": [
                {"functionResponse": {"id": f"c{i}", "name": "run_shell_command",
                                      "response": {"output": text}}}]}}
        else:
            rec = {"type": "system", "subtype": "chat_compression", "systemPayload": {
                "info": {"originalTokenCount": 9000, "newTokenCount": 900}}}
        out.append(json.dumps({"uuid": str(uuid.uuid4()), "parentUuid": None,
                               "timestamp": f"2026-01-0{1 + i % 9}T00:00:{i % 60:02d}.000Z",
                               **base, **rec}, ensure_ascii=False))
    return out


def write_session(d: SpawnedDaemon, cwd: Path, turns: list[tuple[str, str]]) -> str:
    sid = str(uuid.uuid4())
    path = chats(d, cwd) / f"{sid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(qwen_records(cwd, sid, turns)) + "\n", encoding="utf-8")
    return sid


def search(d: SpawnedDaemon, query: str, **params: Any) -> dict[str, Any]:
    return d.call("session.search", {"query": query, **params})


def settled(d: SpawnedDaemon, sessions: int | None = None) -> dict[str, Any]:
    """Once nothing is pending (and ``sessions`` files are indexed, when given)."""
    def done() -> dict[str, Any] | None:
        r: dict[str, Any] = search(d, "x")
        ok = r["indexed"]["pending"] == 0 and sessions in (None, r["indexed"]["sessions"])
        return r if ok else None

    try:
        return until(done, timeout=30, what="the search index caught up")
    except Exception:
        print(d.call("daemon.status")["search"], d.log_text()[-4000:])
        raise


def entry_text(d: SpawnedDaemon, sid: str, entry: int) -> str:
    return str(d.call("session.transcript", {"session_id": sid})["entries"][entry]["text"])


def test_planted_facts_found_at_their_session_and_entry(spawn: type[SpawnedDaemon]) -> None:
    d = spawn()
    alpha, beta, gamma = (d.home / n for n in ("alpha", "beta", "gamma"))
    for p in (alpha, beta, gamma):
        p.mkdir()
    filler = [("user", "let us look at the build"), ("model", "The build is green.")]
    planted = {
        "english": write_session(d, alpha, [*filler, (
            "user", "We decided the retry budget is seven attempts for the uploader.")]),
        "chinese": write_session(d, beta, [("user", "部署流程怎么走?"), (
            "model", "我们决定把重试预算设为七次,然后部署到生产环境。")]),
        "japanese": write_session(d, gamma, [("user", "テストを実行して"), (
            "tool", "ARM64 でのみ失敗するフレーキーなテストを修正しました")]),
        "folded": write_session(d, alpha, [
            ("user", "the flaky test only fails on the ARM runner"),
            ("model", "Pinning the seed fixed the ARM-only flake."),
            ("compression", ""), ("user", "Summary: continuing"), ("model", "ok")]),
    }
    for i in range(12):  # other sessions the facts must stand out from
        write_session(d, (alpha, beta, gamma)[i % 3], [*filler, ("model", f"note {i} about CI")])
    junk = chats(d, alpha) / f"{uuid.uuid4()}.jsonl"
    junk.write_bytes(os.urandom(2000).replace(b"\n", b"") + b"\n\x00\xff\n")
    torn = chats(d, beta) / f"{uuid.uuid4()}.jsonl"
    torn.write_text(qwen_records(beta, torn.stem, [("user", "torn neighbour obsidian")])[0]
                    + "\n{\"type\": \"user\", \"mess\n" + qwen_records(
                        beta, torn.stem, [("model", "still read after the torn line: basalt")],
                        start=1)[0] + "\n", encoding="utf-8")
    d.start()
    r = settled(d)
    assert r["indexed"]["sessions"] == 18 and r["indexed"]["entries"] > 40

    def top(query: str, **kw: Any) -> dict[str, Any]:
        hits = search(d, query, **kw)["hits"]
        assert hits, query
        return hits[0]

    hit = top("retry budget seven")
    assert (hit["session_id"], hit["entry"], hit["role"]) == (planted["english"], 2, "user")
    assert hit["cwd"] == str(alpha) and "<" not in hit["snippet"][:1]
    assert "retry budget" in hit["snippet"]
    hit = top("重试预算")
    assert (hit["session_id"], hit["entry"], hit["role"]) == (planted["chinese"], 1, "assistant")
    assert "重试预算" in entry_text(d, hit["session_id"], hit["entry"])
    hit = top("フレーキー", roles=["tool"])
    assert (hit["session_id"], hit["entry"], hit["role"]) == (planted["japanese"], 1, "tool")
    assert "フレーキー" in hit["snippet"]
    hit = top("pinning the seed")  # said before the compaction folded it into a summary
    assert (hit["session_id"], hit["entry"]) == (planted["folded"], 1)
    tr = d.call("session.transcript", {"session_id": planted["folded"]})["entries"]
    assert tr[2]["kind"] == "compression" and "Pinning the seed" in tr[1]["text"]
    assert top("basalt")["entry"] == 1  # the line after a torn one is read
    st = d.call("daemon.status")["search"]
    assert st["junk_files"] == 1 and st["torn_lines"] >= 2 and st["pending"] == 0
    # all words must match; a quoted phrase keeps its order
    assert not search(d, "retry budget pelican")["hits"]
    assert search(d, '"seven attempts"')["hits"][0]["session_id"] == planted["english"]
    assert not search(d, '"attempts seven"')["hits"]


def test_daemon_recorded_and_compacted_conversation(spawn: type[SpawnedDaemon],
                                                    openai_stub: ScriptedOpenAI) -> None:
    openai_stub.default = Reply(content=SUMMARY)
    d = spawn(env={"OPENAI_BASE_URL": openai_stub.base_url, "OPENAI_MODEL": "stub-model",
                   "OPENAI_API_KEY": "test"}).start()
    repo = d.home / "repo"
    (repo / ".git").mkdir(parents=True)
    sid = d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    d.call("session.turn", {"session_id": sid, "kind": "user",
                            "text": "Which queue holds the quokka invoices?"})
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": "The quokka invoices sit in the billing-dlq queue."}})
    t0 = time.monotonic()
    hit = until(lambda: search(d, "quokka billing")["hits"], timeout=2, what="within 2 s")[0]
    assert time.monotonic() - t0 < 2
    assert (hit["session_id"], hit["entry"], hit["role"]) == (sid, 1, "assistant")
    for i in range(3):
        d.call("session.turn", {"session_id": sid, "kind": "user", "text": f"more {i} " * 50})
        d.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"done {i}"}})
    r = d.call("session.compress", {"session_id": sid, "mode": "full"})
    assert r["status"] == "compressed", r
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "after the wombat fold"})
    hit = until(lambda: search(d, "wombat")["hits"], timeout=2, what="the later turn")[0]
    entries = d.call("session.transcript", {"session_id": sid})["entries"]
    assert entries[hit["entry"]]["text"].endswith("after the wombat fold")
    assert any(e["kind"] == "compression" for e in entries[:hit["entry"]])
    folded = search(d, "quokka billing")["hits"]  # still found at its entry after the fold
    assert [(h["session_id"], h["entry"]) for h in folded][:1] == [(sid, 1)]
    # the user's first message: found by what was said, not by the daemon's reminders in it
    hit = search(d, "quokka invoices", roles=["user"])["hits"][0]
    assert hit["entry"] == 0 and hit["snippet"].startswith("Which queue")
    assert not search(d, "system-reminder")["hits"]


def test_files_written_changed_and_removed_by_another_program(daemon: SpawnedDaemon) -> None:
    proj = daemon.home / "elsewhere"
    proj.mkdir()
    settled(daemon)
    sid = write_session(daemon, proj, [("user", "the narwhal migration plan"),
                                       ("model", "Step one: freeze writes.")])
    hit = until(lambda: search(daemon, "narwhal")["hits"], timeout=5, what="a new file")[0]
    assert hit["session_id"] == sid and hit["entry"] == 0
    path = chats(daemon, proj) / f"{sid}.jsonl"
    with path.open("a", encoding="utf-8") as fh:  # an append: read from the indexed offset
        fh.write(qwen_records(proj, sid, [("model", "Step two: the axolotl backfill.")],
                              start=2)[0] + "\n")
    hit = until(lambda: search(daemon, "axolotl")["hits"], timeout=5, what="an append")[0]
    assert (hit["session_id"], hit["entry"]) == (sid, 2)
    path.write_text("\n".join(qwen_records(proj, sid, [("user", "rewritten: pangolin")])) + "\n")
    until(lambda: search(daemon, "pangolin")["hits"] and not search(daemon, "narwhal")["hits"],
          timeout=5, what="a rewritten file")
    path.unlink()
    until(lambda: not search(daemon, "pangolin")["hits"], timeout=5, what="a removed file")
    assert settled(daemon)["indexed"]["sessions"] == 0


def test_a_first_session_long_after_start_is_found_with_no_qwen_dir_at_start(
        daemon: SpawnedDaemon) -> None:
    """A fresh HOME has no ``~/.qwen/projects``; Qwen Code makes it, its project directory
    and ``chats`` at its first record, seconds after the daemon started (after the start-up
    scan and its recheck): the watch follows each level down and the file is found."""
    from qwenctxd.sessions.search.indexer import RECHECK_S

    assert not (daemon.home / ".qwen" / "projects").exists()
    settled(daemon)
    time.sleep(RECHECK_S + 1.0)  # sleep-ok: past the start-up recheck, only the watch sees it
    proj = daemon.home / "late"
    proj.mkdir()
    sid = write_session(daemon, proj, [("user", "the okapi rollout"), ("model", "Done.")])
    hit = until(lambda: search(daemon, "okapi")["hits"], timeout=5, what="the late file")[0]
    assert hit["session_id"] == sid
    other = daemon.home / "later"  # a second project beside it: its chats dir is new too
    other.mkdir()
    time.sleep(RECHECK_S + 1.0)  # sleep-ok: past the recheck again
    sid2 = write_session(daemon, other, [("user", "the tapir budget")])
    hit = until(lambda: search(daemon, "tapir")["hits"], timeout=5, what="a second project")[0]
    assert hit["session_id"] == sid2


def test_filters(daemon: SpawnedDaemon) -> None:
    one, two = daemon.home / "one", daemon.home / "two"
    (one / ".git").mkdir(parents=True)
    (one / "sub").mkdir()
    two.mkdir()
    a = write_session(daemon, one, [("user", "lemur rollout"), ("model", "lemur done"),
                                    ("tool", "lemur log line")])
    b = write_session(daemon, two, [("user", "lemur elsewhere")])
    c = write_session(daemon, one / "sub", [("user", "lemur from a subdirectory")])
    settled(daemon, 3)
    assert {h["session_id"] for h in search(daemon, "lemur")["hits"]} == {a, b, c}
    scoped = search(daemon, "lemur", cwd=str(one / "sub"))["hits"]
    assert {h["session_id"] for h in scoped} == {a, c}  # the project that holds the cwd
    assert {h["session_id"] for h in search(daemon, "lemur", cwd=str(two))["hits"]} == {b}
    assert {h["session_id"] for h in search(daemon, "lemur", session_id=b)["hits"]} == {b}
    roles = {h["role"] for h in search(daemon, "lemur", session_id=a)["hits"]}
    assert roles == {"user", "assistant"}  # the default roles
    tool = search(daemon, "lemur", roles=["tool"])["hits"]
    assert [(h["session_id"], h["entry"]) for h in tool] == [(a, 2)]
    assert len(search(daemon, "lemur", limit=2)["hits"]) == 2
    assert not search(daemon, "lemur", since="2030-01-01")["hits"]
    assert len(search(daemon, "lemur", since="2025-12-31T00:00:00Z")["hits"]) == 4


HOSTILE = ['"', '""', '"unbalanced', "*", "lemur*", "NEAR(lemur rollout)", "lemur OR x",
           "lemur AND", "-lemur", "col:lemur", "body:lemur", "^lemur", "lemur\x00rollout",
           "\x00", "(", ")", "{body}:x", "lemur" * 1000, "lemur " * 1000, "'; DROP TABLE x; --",
           "\\", "部", "、。", "x" * 5000]


def test_hostile_queries_are_text_never_syntax(daemon: SpawnedDaemon) -> None:
    proj = daemon.home / "p"
    proj.mkdir()
    sid = write_session(daemon, proj, [("user", "lemur rollout: grep NEAR(lemur rollout) -x ^"),
                                       ("model", "部署 done")])
    settled(daemon, 1)
    for q in HOSTILE:
        r = search(daemon, q)  # never -32603
        assert isinstance(r["hits"], list), q
    assert search(daemon, "NEAR(lemur rollout)")["hits"][0]["session_id"] == sid
    assert search(daemon, "col:lemur")["hits"] == []  # "col lemur": both words must match
    assert search(daemon, "^lemur")["hits"][0]["session_id"] == sid
    assert search(daemon, "lemur\x00rollout")["hits"][0]["session_id"] == sid
    assert search(daemon, "部")["hits"][0]["entry"] == 1
    assert len(search(daemon, "lemur " * 1000)["hits"]) == 1


@pytest.mark.parametrize(("params", "field"), [
    ({"query": "   "}, "query"),
    ({"query": "x", "limit": 0}, "limit"),
    ({"query": "x", "limit": 101}, "limit"),
    ({"query": "x", "since": "last tuesday"}, "since"),
    ({"query": "x", "roles": ["system"]}, "roles"),
    ({"query": "x", "roles": []}, "roles"),
    ({"query": "x", "session_id": "nope"}, "session_id"),
    ({"query": "x", "cwd": "relative/dir"}, "cwd"),
    ({"query": 5}, "query"),
    ({"query": "x", "colour": "red"}, "colour"),
    ({}, "query"),
])
def test_bad_params_name_the_field(module_daemon: SpawnedDaemon, params: dict[str, Any],
                                   field: str) -> None:
    with pytest.raises(RemoteError) as exc:
        module_daemon.call("session.search", params)
    assert exc.value.code == -32602
    assert str(exc.value.data["field"]).startswith(field), exc.value.data


def test_a_corrupt_index_is_rebuilt(spawn: type[SpawnedDaemon]) -> None:
    d = spawn().start()
    proj = d.home / "p"
    proj.mkdir()
    sid = write_session(d, proj, [("user", "the ocelot threshold is 42")])
    until(lambda: search(d, "ocelot")["hits"], timeout=5, what="indexed")
    d.stop()
    db = d.home / ".local" / "state" / "qwenctxd" / "session_search.sqlite"
    assert db.exists()
    for side in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        side.unlink(missing_ok=True)
    db.write_bytes(b"not a database at all" * 100)
    d.start()
    hit = until(lambda: search(d, "ocelot")["hits"], timeout=10, what="rebuilt")[0]
    assert hit["session_id"] == sid
    assert list(db.parent.glob("session_search.sqlite.corrupt-*"))


def test_every_hostile_query_is_a_match_string_the_engine_accepts() -> None:
    """The one quoting rule (qwenctxd.fts.quote_term), straight against SQLite's FTS5."""
    import random
    import sqlite3

    from qwenctxd.fts import fts_text, quote_term
    from qwenctxd.sessions.search.query import parse

    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
    db.execute("INSERT INTO t(body) VALUES (?)", (fts_text("lemur rollout near(x) 部署流程"),))
    rnd = random.Random(5)
    alphabet = '"*^:()-+ NEARORANDNOT{}[]\x00\x01\\\'部署a1 '
    fuzz = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 40))) for _ in range(500)]
    for q in [*HOSTILE, *fuzz]:
        m = parse(q).match
        if m is not None:
            db.execute("SELECT rowid FROM t WHERE t MATCH ?", (m,)).fetchall()
        db.execute("SELECT rowid FROM t WHERE t MATCH ?", (quote_term(q),)).fetchall()
    assert parse("*  ^ -").match is None
    assert parse('"a  phrase" word').match == '"a phrase" AND "word"'
    assert parse("部").match == '"部"*'
    assert db.execute("SELECT count(*) FROM t WHERE t MATCH ?",
                      (parse("署流 NEAR(x)").match,)).fetchone() == (1,)
