"""Shared per-project loads through the socket: a superseded recall prefetch must never cancel
the first load of a project's memory (issue 18), for the first load and for re-syncs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.paths import project_slug
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def repo_in(home: Path, name: str) -> Path:
    repo = home / name
    (repo / ".git").mkdir(parents=True, exist_ok=True)
    return repo


def project_memory(home: Path, repo: Path) -> Path:
    """Where the daemon keeps the project's memory (see test_memory_daemon's layout test)."""
    return home / ".qwen" / "projects" / project_slug(repo) / "memory"


def write_memories(root: Path, n: int, *, word: str = "deploys", start: int = 0) -> list[Path]:
    out = []
    for i in range(start, start + n):
        path = root / "project" / f"fact-{i:04d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\nname: {word} fact {i}\ndescription: how the {word} fact {i} "
                        f"works, marker{i:04d}\ntype: project\n---\n{word} fact body {i}.\n")
        out.append(path)
    return out


def two_quick_user_turns(d: SpawnedDaemon, sid: str, gap_s: float) -> None:
    """Two user turns on two connections, the second ``gap_s`` after the first was sent: the
    second supersedes (cancels) the first one's recall prefetch."""
    errors: list[BaseException] = []

    def first() -> None:
        try:
            d.call("session.turn", {"session_id": sid, "kind": "user",
                                    "text": "deploys fact one"})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    if gap_s:
        time.sleep(gap_s)  # sleep-ok: the gap under test, not a synchronisation
    d.call("session.turn", {"session_id": sid, "kind": "user", "text": "deploys fact two"})
    t.join(30)
    assert not t.is_alive() and not errors, errors


def recall_agrees_with_list(d: SpawnedDaemon, repo: Path, expected: set[str],
                            probe: int) -> None:
    listed = {x["path"] for x in d.call("memory.list", {"cwd": str(repo)})["docs"]}
    assert listed == expected
    r = d.call("memory.recall", {"cwd": str(repo), "query": "deploys fact"})
    assert r["strategy"] == "heuristic", r
    assert r["docs"] and {x["path"] for x in r["docs"]} <= expected
    # a document only the index can find by its own marker: the index holds all of them (the
    # semantic tier may add its near twins after it)
    marker = f"marker{probe:04d}"
    r = d.call("memory.recall", {"cwd": str(repo), "query": marker})
    names = [Path(x["path"]).name for x in r["docs"]]
    assert names[0] == f"fact-{probe:04d}.md", r
    assert r["docs"][0]["why"]["lexical_rank"] == 1 and all(
        "lexical_rank" not in x["why"] for x in r["docs"][1:]), r


def test_superseded_first_prefetch_keeps_recall(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    repo = repo_in(d.home, "repo")
    paths = write_memories(project_memory(d.home, repo), 200)
    d.start()
    sid = d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    two_quick_user_turns(d, sid, 0.0)
    recall_agrees_with_list(d, repo, {str(p) for p in paths}, probe=137)
    status = d.call("memory.status", {"cwd": str(repo)})
    assert status["counts"] == {"project": 200}


def test_prefetches_cancelled_at_random_points(daemon: SpawnedDaemon) -> None:
    """Each example: a fresh project with memories on disk, user turns superseding each
    other's prefetch at random gaps (during the first load and during a re-sync after files
    changed), then recall and memory.list agree with the files."""
    d = daemon

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def example(data: st.DataObject) -> None:
        n = data.draw(st.integers(20, 300), label="memories")
        repo = repo_in(d.home, f"repo{time.monotonic_ns()}")
        mem = project_memory(d.home, repo)
        paths = write_memories(mem, n)
        sid = d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
        for _ in range(data.draw(st.integers(1, 3), label="rounds")):
            two_quick_user_turns(d, sid, data.draw(st.floats(0, 0.08), label="gap"))
        expected = {str(p) for p in paths}
        recall_agrees_with_list(d, repo, expected, probe=n - 1)
        # files change on disk; prefetches superseded while the re-sync runs
        drop = data.draw(st.integers(0, n // 2), label="removed")
        for p in paths[:drop]:
            p.unlink()
        added = write_memories(mem, data.draw(st.integers(1, 50), label="added"), start=n)
        expected = {str(p) for p in paths[drop:]} | {str(p) for p in added}
        for _ in range(data.draw(st.integers(1, 3), label="rounds after")):
            two_quick_user_turns(d, sid, data.draw(st.floats(0, 0.08), label="gap after"))
        until(lambda: {x["path"] for x in d.call("memory.list", {"cwd": str(repo)})["docs"]}
              == expected, what="the re-sync to catch up with the files")
        recall_agrees_with_list(d, repo, expected, probe=n + len(added) - 1)

    example()
