"""Memory of several projects through the socket: loading another project's memory restarts the
daemon's one watcher (its directory set grows), and the changes made in the projects already
loaded while it restarts must still reach their memory.list (they were lost: the old watcher
dropped what it had not reported yet, and nothing watched until the new one registered)."""

from __future__ import annotations

from pathlib import Path

from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until
from tests.test_shared_loads_daemon import project_memory, repo_in, write_memories

BOUND_S = 10.0


def listed(d: SpawnedDaemon, repo: Path) -> dict[str, str]:
    """memory.list for ``repo``: path -> name."""
    return {x["path"]: x["name"]
            for x in d.call("memory.list", {"cwd": str(repo)})["docs"]}


def names(paths: list[Path], word: str = "deploys") -> dict[str, str]:
    return {str(p): f"{word} fact {int(p.stem.split('-')[1])}" for p in paths}


class Project:
    """A repo with three memories on disk; ``change`` adds, removes and edits one of them."""

    def __init__(self, d: SpawnedDaemon, name: str) -> None:
        self.repo = repo_in(d.home, name)
        self.mem = project_memory(d.home, self.repo)
        self.paths = write_memories(self.mem, 3)
        self.expected = names(self.paths)

    def change(self) -> None:
        gone, edited, kept = self.paths
        gone.unlink()
        write_memories(self.mem, 1, word="rollback", start=1)  # fact-0001, rewritten in place
        added = write_memories(self.mem, 1, start=3)
        self.expected = {**names([kept, *added]), **names([edited], word="rollback")}


def quiet(d: SpawnedDaemon) -> None:
    """Every watch live and no background job left (a just-loaded project's re-check against
    its files is one): from here only the watcher can bring a change in."""
    def idle() -> bool:
        st = d.call("daemon.status")
        return bool(st["watch"]["synced"] and not st["background"]["in_flight"]
                    and not st["background"]["queued"])
    until(idle, timeout=BOUND_S, what="the daemon to be idle")


def settles(d: SpawnedDaemon, p: Project) -> None:
    until(lambda: listed(d, p.repo) == p.expected, timeout=BOUND_S,
          what=f"memory.list of {p.repo.name} to show every change")


def test_changes_in_two_loaded_projects_all_show(daemon: SpawnedDaemon) -> None:
    d = daemon
    a, b = Project(d, "a"), Project(d, "b")
    assert listed(d, a.repo) == a.expected
    quiet(d)
    assert listed(d, b.repo) == b.expected  # B's load restarts the watcher
    a.change()  # at once: while the watcher restarts
    b.change()
    for p in (a, b):
        settles(d, p)


def test_a_change_made_before_another_load_still_shows(daemon: SpawnedDaemon) -> None:
    d = daemon
    a, b = Project(d, "a"), Project(d, "b")
    assert listed(d, a.repo) == a.expected
    quiet(d)
    a.change()  # still within the watcher's debounce when B's load restarts it
    assert listed(d, b.repo) == b.expected
    settles(d, a)
    # and A is watched for real afterwards
    later = write_memories(a.mem, 1, start=7)
    a.expected = {**a.expected, **names(later)}
    settles(d, a)


def test_three_projects_loaded_in_quick_succession(daemon: SpawnedDaemon) -> None:
    d = daemon
    projects = [Project(d, name) for name in ("a", "b", "c")]
    first = projects[0]
    assert listed(d, first.repo) == first.expected
    quiet(d)
    extra = write_memories(first.mem, 1, start=5)  # while B and C restart the watcher
    for p in projects[1:]:
        assert listed(d, p.repo) == p.expected
    for p in projects:
        p.change()
    first.expected = {**first.expected, **names(extra)}
    for p in projects:
        settles(d, p)
