"""qwenctl memory (list / recall / forget / status) against a spawned daemon without a model,
so recall and forget use the lexical path."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

DOC_KEYS = {"path", "scope", "type", "name", "description", "age", "hits"}


#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL)


def remember(root: Path, type_: str, slug: str, name: str, description: str, body: str) -> Path:
    path = root / type_ / f"{slug}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\ntype: {type_}\n---\n{body}\n")
    return path


def rows(stdout: str) -> list[list[str]]:
    """The indented table rows of plain (piped) output, split on runs of 2+ spaces."""
    return [re.split(r"\s{2,}", ln.strip()) for ln in stdout.splitlines() if ln.startswith("  ")]


def tilde(d: SpawnedDaemon, path: Path) -> str:
    return "~/" + str(path.relative_to(d.home))


@dataclass
class World:
    d: SpawnedDaemon
    repo: Path
    project_root: Path
    user_root: Path
    release: Path  # project/project
    tabs: Path  # user/user
    dashboard: Path  # project/reference

    def listed(self) -> set[str]:
        return {x["path"] for x in self.d.call("memory.list", {"cwd": str(self.repo)})["docs"]}


@pytest.fixture
def world(daemon: SpawnedDaemon) -> World:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    st = daemon.call("memory.status", {"cwd": str(repo)})
    project, user = Path(st["roots"]["project"]), Path(st["roots"]["user"])
    release = remember(project, "project", "release", "Release freeze",
                       "release freeze starts every Thursday at noon",
                       "No merges to main after Thursday noon.\n**Why:** QA needs a stable branch.")
    tabs = remember(user, "user", "tabs", "Indentation preference",
                    "user prefers tabs over spaces in Go code", "Always use tabs in Go files.")
    dashboard = remember(project, "reference", "dashboard", "Grafana dashboard",
                         "latency dashboard for the checkout service",
                         "https://grafana.example/d/checkout")
    w = World(daemon, repo, project, user, release, tabs, dashboard)
    until(lambda: len(w.listed()) >= 3, what="the three memory files to be indexed")
    return w


# -- list -------------------------------------------------------------------------------------
def test_list_human_and_json(world: World) -> None:
    d = world.d
    r = qwenctl(d, "memory", "list", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "memories for ~/repo: 3"
    table = rows(r.stdout)
    assert table[0] == ["scope", "type", "name", "age", "hits", "path"]
    got = {t[5]: t[:5] for t in table[1:]}
    assert got == {
        tilde(d, world.release): ["project", "project", "Release freeze", "today", "0"],
        tilde(d, world.tabs): ["user", "user", "Indentation preference", "today", "0"],
        tilde(d, world.dashboard): ["project", "reference", "Grafana dashboard", "today", "0"],
    }
    assert lines[-1] == "problems: none"
    # bare `memory` is `list`; a relative --cwd is made absolute; --scope filters
    r = qwenctl(d, "memory", "--cwd", "repo", "--scope", "user", cwd=d.home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "memories for ~/repo (scope user): 1"
    assert [t[5] for t in rows(r.stdout)[1:]] == [tilde(d, world.tabs)]
    # --json is the daemon's answer
    r = qwenctl(d, "memory", "list", "--json", "--cwd", str(world.repo))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res) == {"docs", "problems"} and res["problems"] == []
    assert all(set(x) == DOC_KEYS for x in res["docs"])
    assert {x["path"] for x in res["docs"]} == {str(world.release), str(world.tabs),
                                                str(world.dashboard)}
    assert res == d.call("memory.list", {"cwd": str(world.repo)})
    assert qwenctl(d, "memory", "list", "--scope", "nope").returncode == 2


def test_list_shows_problems(world: World) -> None:
    d = world.d
    link = world.project_root / "project" / "elsewhere.md"
    os.symlink(world.release, link)

    def reported() -> bool:
        if d.call("memory.list", {"cwd": str(world.repo)})["problems"]:
            return True
        os.utime(link, follow_symlinks=False)  # nudge the watcher, not the target
        return False

    until(reported, what="the symlink to be reported as a problem")
    r = qwenctl(d, "memory", "list", "--cwd", str(world.repo))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "problems: none" not in lines
    i = lines.index("problems (1)")
    assert rows("\n".join(lines[i:]))[1] == [tilde(d, link),
                                            "symlink inside a memory directory; not followed"]


# -- recall -----------------------------------------------------------------------------------
def test_recall_heuristic_finds_the_doc(world: World) -> None:
    d = world.d
    r = qwenctl(d, "memory", "recall", "when", "is", "the", "release", "freeze?", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "strategy: heuristic"
    table = rows(r.stdout)
    assert table[0] == ["#", "scope", "type", "name", "score", "path"]
    n, scope, type_, name, score, path = table[1]
    assert (n, scope, type_, name, path) == ("1", "project", "project", "Release freeze",
                                             tilde(d, world.release))
    assert float(score) > 0
    assert "## Relevant memory" not in r.stdout  # only with --show-prompt
    r = qwenctl(d, "memory", "recall", "release freeze", "--show-prompt", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    assert "## Relevant memory" in r.stdout and "No merges to main" in r.stdout
    r = qwenctl(d, "memory", "recall", "release", "freeze", "--json", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["strategy"] == "heuristic" and res["fell_back"] is None
    assert res["docs"][0]["path"] == str(world.release) and "Release freeze" in res["prompt"]
    # recall counts as a hit in the listing
    hits = {x["path"]: x["hits"] for x in d.call("memory.list", {"cwd": str(world.repo)})["docs"]}
    assert hits[str(world.release)] == 3
    # nothing relevant
    r = qwenctl(d, "memory", "recall", "xylophone", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["strategy: none", "recalled: none"]
    assert qwenctl(d, "memory", "recall", " ", cwd=world.repo).returncode == 2
    assert qwenctl(d, "memory", "recall", cwd=world.repo).returncode == 2  # QUERY is required


# -- forget -----------------------------------------------------------------------------------
def test_forget_without_a_tty_needs_yes(world: World) -> None:
    d = world.d
    before = world.listed()
    r = qwenctl(d, "memory", "forget", "e", cwd=world.repo)
    assert r.returncode == 1
    assert "refusing to forget 3 memories without --yes" in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "3 memories match 'e'"
    table = rows(r.stdout)
    assert table[0] == ["#", "scope", "name", "reason", "path"]
    assert [t[0] for t in table[1:]] == ["1", "2", "3"]
    assert {t[4] for t in table[1:]} == {tilde(d, p) for p in
                                         (world.release, world.tabs, world.dashboard)}
    assert all(t[3] == "contains 'e'" for t in table[1:])
    assert "forgot" not in r.stdout
    assert world.listed() == before
    assert world.release.exists() and world.tabs.exists() and world.dashboard.exists()
    # --json: the refusal is an error object naming the candidates
    r = qwenctl(d, "memory", "forget", "tabs", "--json", cwd=world.repo)
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert [c["path"] for c in err["data"]["candidates"]] == [str(world.tabs)]
    assert world.tabs.exists()


def test_forget_yes_deletes_exactly_the_candidates(world: World) -> None:
    d = world.d
    r = qwenctl(d, "memory", "forget", "tabs", "--yes", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "1 memory matches 'tabs'"
    assert rows(r.stdout)[1] == ["1", "user", "Indentation preference", "contains 'tabs'",
                                 tilde(d, world.tabs)]
    assert lines[-1] == f"forgot {world.tabs}"
    assert not world.tabs.exists() and world.release.exists() and world.dashboard.exists()
    assert world.listed() == {str(world.release), str(world.dashboard)}
    # --limit and --pick narrow the set; --json reports candidates, selection and removals
    r = qwenctl(d, "memory", "forget", "e", "--limit", "2", "--pick", "2", "-y", "--json",
                cwd=world.repo)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert len(res["candidates"]) == 2
    second = res["candidates"][1]["path"]
    assert res["selected"] == res["removed"] == [second]
    assert not Path(second).exists()
    assert world.listed() == {str(world.release), str(world.dashboard)} - {second}


def test_forget_nothing_matches_and_bad_pick(world: World) -> None:
    d = world.d
    before = world.listed()
    r = qwenctl(d, "memory", "forget", "no", "such", "thing", "--yes", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "nothing matches 'no such thing'\n"
    r = qwenctl(d, "memory", "forget", "xylophone", "--json", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"candidates": [], "selected": [], "removed": []}
    for pick in ("4", "0", "x", "1-9"):
        r = qwenctl(d, "memory", "forget", "e", "--pick", pick, "--yes", cwd=world.repo)
        assert r.returncode == 2 and "--pick" in r.stderr and "forgot" not in r.stdout, pick
    assert qwenctl(d, "memory", "forget", "e", "--limit", "0", cwd=world.repo).returncode == 2
    assert world.listed() == before


def test_forget_asks_on_a_tty(world: World) -> None:
    d = world.d

    def answer(text: bytes, *args: str) -> subprocess.CompletedProcess[str]:
        master, slave = os.openpty()
        try:
            os.write(master, text)
            return qwenctl(d, "memory", "forget", *args, cwd=world.repo, stdin=slave)
        finally:
            os.close(slave)
            os.close(master)

    r = answer(b"n\n", "tabs")
    assert r.returncode == 1 and "forgot" not in r.stdout
    assert r.stderr.startswith("forget this memory? [y/N] ")
    assert world.tabs.exists()
    r = answer(b"y\n", "tabs")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"forgot {world.tabs}" and not world.tabs.exists()
    # --pick on a terminal still asks, for the picked subset
    r = answer(b"yes\n", "e", "--pick", "1,2")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("forget these 2 memories? [y/N] ")
    forgot = [ln.removeprefix("forgot ") for ln in r.stdout.splitlines()
              if ln.startswith("forgot ")]
    assert len(forgot) == 2 and not any(Path(p).exists() for p in forgot)
    assert world.listed() == {str(world.release), str(world.dashboard)} - set(forgot)


# -- status -----------------------------------------------------------------------------------
def test_status_shows_roots(world: World) -> None:
    d = world.d
    r = qwenctl(d, "memory", "status", cwd=world.repo)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "memory status for ~/repo"
    fields = dict(t for t in rows(r.stdout) if len(t) == 2)
    assert fields["project root"] == tilde(d, world.project_root)
    assert fields["user root"] == "~/.qwen/memories" == tilde(d, world.user_root)
    assert fields["team root"] == "-"
    assert fields["memories"] == "project 2, user 1 (3 total)"
    assert fields["index size"].endswith("(MEMORY.md)")
    assert fields["last dream"] == "never"
    assert fields["extract cursor"] == "nothing extracted yet"
    assert lines[-1] == "problems: none"
    r = qwenctl(d, "memory", "status", "--json", "--cwd", str(world.repo))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["roots"] == {"project": str(world.project_root), "user": str(world.user_root),
                            "team": None}
    assert res["counts"] == {"project": 2, "user": 1}
    assert res == d.call("memory.status", {"cwd": str(world.repo)})


def test_memory_add_project_and_global(daemon: SpawnedDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    r = qwenctl(daemon, "memory", "add", "prefer", "tabs", cwd=repo / "sub")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "added to ~/repo/QWEN.md"
    assert (repo / "QWEN.md").read_text() == "## Qwen Added Memories\n- prefer tabs\n"
    r = qwenctl(daemon, "--json", "memory", "add", "--global", "answer in English", cwd=repo)
    assert r.returncode == 0, r.stderr
    target = daemon.home / ".qwen" / "QWEN.md"
    assert json.loads(r.stdout) == {"path": str(target)}
    assert target.read_text().endswith("- answer in English\n")
    prompt = daemon.call("prompt.system", {"cwd": str(repo)})["text"]
    assert "- prefer tabs" in prompt and "- answer in English" in prompt
    empty = qwenctl(daemon, "memory", "add", "--", "-*-", cwd=repo)
    assert empty.returncode == 1 and "text is empty" in empty.stderr
