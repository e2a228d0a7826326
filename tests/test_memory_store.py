"""Auto memory layout, scaffold, topic-file scan, state files and scope classification."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from qwenctxd.memory import paths as mpaths
from qwenctxd.memory import store
from qwenctxd.paths import project_slug
from qwenctxd.project.roots import find_project_root


def roots_at(cwd: Path, **kw: object) -> mpaths.MemoryRoots:
    """The memory roots for ``cwd``, its git root found as the daemon's registry would."""
    return mpaths.roots_for(cwd, git_root=find_project_root(cwd), **kw)  # type: ignore[arg-type]


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    b = tmp_path / "base"
    monkeypatch.setenv("QWEN_CODE_MEMORY_BASE_DIR", str(b))
    monkeypatch.delenv("QWEN_CODE_MEMORY_LOCAL", raising=False)
    return b


def make_repo(path: Path) -> Path:
    (path / ".git").mkdir(parents=True)
    return path


def write_mem(root: Path, rel: str, *, name: str | None = "n", description: str | None = "d",
              type_: str | None = "feedback", body: str = "body", mtime: float | None = None
              ) -> Path:
    data = {k: v for k, v in (("name", name), ("description", description), ("type", type_))
            if v is not None}
    text = "---\n" + yaml.safe_dump(data, allow_unicode=True) + "---\n\n" + body + "\n"
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def snapshot(*roots: Path) -> dict[str, tuple[int, bytes] | None]:
    out: dict[str, tuple[int, bytes] | None] = {}
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            out[dirpath] = None
            for f in files:
                p = Path(dirpath) / f
                out[str(p)] = (p.stat().st_mtime_ns, p.read_bytes())
    return out


# -- layout -----------------------------------------------------------------------------------


def test_layout_for_a_repository(tmp_path: Path, base: Path) -> None:
    repo = make_repo(tmp_path / "my repo")
    cwd = repo / "src" / "pkg"
    cwd.mkdir(parents=True)
    roots = roots_at(cwd, team_enabled=False)
    assert roots.project == base / "projects" / project_slug(repo) / "memory"
    assert roots.state == roots.project.parent
    assert roots.user == base / "memories"
    assert roots.team is None
    assert roots.git_root == repo
    team = roots_at(cwd, team_enabled=True).team
    assert team == repo / ".qwen" / "team-memory"


def test_worktree_gets_its_own_memory(tmp_path: Path, base: Path) -> None:
    main = make_repo(tmp_path / "main")
    wt = tmp_path / "wt"
    wt.mkdir()
    (main / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (wt / ".git").write_text(f"gitdir: {main}/.git/worktrees/wt\n")
    r_main = roots_at(main, team_enabled=True)
    r_wt = roots_at(wt, team_enabled=True)
    assert r_wt.project == base / "projects" / project_slug(wt) / "memory"
    assert r_wt.project != r_main.project
    assert r_wt.team == wt / ".qwen" / "team-memory"


def test_no_git_root_falls_back_to_cwd_and_has_no_team(tmp_path: Path, base: Path) -> None:
    cwd = tmp_path / "plain"
    cwd.mkdir()
    roots = roots_at(cwd, team_enabled=True)
    assert roots.project == base / "projects" / project_slug(cwd) / "memory"
    assert roots.team is None and roots.git_root is None


def test_local_memory_and_explicit_environ(tmp_path: Path, base: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "r")
    monkeypatch.setenv("QWEN_CODE_MEMORY_LOCAL", "1")
    roots = roots_at(repo / "x", team_enabled=False)
    assert roots.project == repo / ".qwen" / "memory"
    assert roots.state == repo / ".qwen"
    assert roots.user == base / "memories"
    env = {"QWEN_CODE_MEMORY_BASE_DIR": str(tmp_path / "other")}
    roots = roots_at(repo, environ=env)
    assert roots.project == tmp_path / "other" / "projects" / project_slug(repo) / "memory"


def test_base_dir_defaults_to_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWEN_CODE_MEMORY_BASE_DIR", raising=False)
    monkeypatch.setenv("QWEN_RUNTIME_DIR", str(tmp_path / "rt"))
    assert mpaths.memory_base_dir() == tmp_path / "rt"
    assert mpaths.memory_base_dir({}) == tmp_path / "rt"


# -- scaffold ---------------------------------------------------------------------------------


def test_scaffold_is_idempotent_and_leaves_files_alone(tmp_path: Path, base: Path) -> None:
    repo = make_repo(tmp_path / "r")
    roots = roots_at(repo, team_enabled=True)
    created = store.ensure_scaffold(roots)
    assert roots.project is not None and roots.state is not None and roots.team is not None
    for root in (roots.project, roots.user):
        assert (root / "MEMORY.md").read_bytes() == b""
        for t in mpaths.MEMORY_TYPES:
            assert (root / t).is_dir()
    assert not roots.team.exists()
    meta_text = (roots.state / "meta.json").read_text()
    meta = json.loads(meta_text)
    assert list(meta) == ["version", "createdAt", "updatedAt"] and meta["version"] == 1
    assert meta_text == json.dumps(meta, indent=2) + "\n"
    assert meta["createdAt"].endswith("Z") and len(meta["createdAt"]) == 24
    assert json.loads((roots.state / "extract-cursor.json").read_text()) == {
        "updatedAt": meta["createdAt"]}
    assert roots.state / "meta.json" in created

    (roots.project / "MEMORY.md").write_text("- [x](feedback/x.md) — y")
    before = snapshot(base)
    assert store.ensure_scaffold(roots) == []
    assert snapshot(base) == before


def test_scaffold_does_not_follow_a_dangling_index_link(tmp_path: Path, base: Path) -> None:
    roots = roots_at(make_repo(tmp_path / "r"))
    assert roots.project is not None
    roots.project.mkdir(parents=True)
    target = tmp_path / "elsewhere.md"
    (roots.project / "MEMORY.md").symlink_to(target)
    store.ensure_scaffold(roots)
    assert not target.exists()


# -- scan -------------------------------------------------------------------------------------


def test_scan_reads_docs_and_reports_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "mem"
    write_mem(root, "feedback/testing.md", name="Run tests", description="always", mtime=100)
    write_mem(root, "user/role.md", name=None, description=None, type_="user", mtime=200)
    write_mem(root, "project/deep/nested.md", type_="project", mtime=50)
    write_mem(root, "bad/type.md", type_="opinion")
    write_mem(root, "bad/notype.md", type_=None)
    (root / "bad" / "plain.md").write_text("just text\n")
    (root / "bad" / "broken.md").write_text("---\nname: [unclosed\n---\nx\n")
    (root / "bad" / "notes.txt").write_text("---\ntype: user\n---\n")
    (root / "MEMORY.md").write_text("---\ntype: user\n---\n")
    (root / "feedback" / "link.md").symlink_to(root / "feedback" / "testing.md")
    res = store.scan(root, "project")
    assert [d.relative_path for d in res.docs] == [
        "user/role.md", "feedback/testing.md", "project/deep/nested.md"]
    role = res.docs[0]
    assert (role.name, role.description, role.type, role.scope) == ("role", "", "user", "project")
    assert role.path == root / "user" / "role.md" and role.body == "body"
    assert role.size == role.path.stat().st_size and role.mtime == 200
    reported = {p.relative_to(root).as_posix(): m for p, m in res.problems}
    assert set(reported) == {"bad/type.md", "bad/notype.md", "bad/plain.md", "bad/broken.md",
                             "feedback/link.md"}
    assert "opinion" in reported["bad/type.md"]
    assert "frontmatter" in reported["bad/plain.md"]


def test_scan_order_ties_and_cap(tmp_path: Path) -> None:
    root = tmp_path / "mem"
    write_mem(root, "user/b.md", mtime=10)
    write_mem(root, "feedback/b.md", mtime=10)
    write_mem(root, "project/a.md", mtime=10)
    docs = store.scan(root, "user").docs
    assert [d.relative_path for d in docs] == ["project/a.md", "feedback/b.md", "user/b.md"]
    for i in range(205):
        write_mem(root, f"reference/r{i:03}.md", mtime=1000 + i)
    assert len(store.scan(root, "user").docs) == 200
    assert store.scan(root, "user").docs[0].relative_path == "reference/r204.md"
    assert len(store.scan(root, "user", uncapped=True).docs) == 208


def test_team_scan_uses_code_unit_order(tmp_path: Path) -> None:
    root = tmp_path / "team"
    names = ["b.md", "\uff21.md", "\U0001f600.md", "a.md", "B.md"]
    for i, n in enumerate(names):
        write_mem(root, f"feedback/{n}", mtime=1000 - i)
    got = [d.relative_path for d in store.scan(root, "team").docs]
    # UTF-16: the emoji's high surrogate (D83D) sorts before U+FF21
    assert got == [f"feedback/{n}" for n in ["B.md", "a.md", "b.md", "\U0001f600.md", "\uff21.md"]]


def test_scan_keywords_and_missing_root(tmp_path: Path) -> None:
    root = tmp_path / "mem"
    p = root / "user" / "k.md"
    p.parent.mkdir(parents=True)
    p.write_text("---\ntype: user\nname: 42\nkeywords: [a, b, a, " + ", ".join(
        f"k{i}" for i in range(20)) + "]\n---\nx")
    doc = store.scan(root, "user").docs[0]
    assert doc.name == "42"
    assert doc.keywords == ("a", "b", "k0", "k1", "k2", "k3", "k4", "k5")
    assert store.scan(tmp_path / "missing", "user").docs == []


def test_symlinked_private_root_is_not_scanned(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write_mem(real, "user/x.md", type_="user")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert store.scan(link, "project").docs == []
    assert store.scan(link, "project").problems
    assert len(store.scan(link, "user").docs) == 1


def test_sanitize_prompt_field() -> None:
    s = store.sanitize_prompt_field
    assert s("\uff21\uff22  c\n\td\x07e\u200bf\u202eg", 100) == "AB c d efg"
    assert s("x" * 10, 4) == "xxxx"
    assert s("ab\U0001f600", 3) == "ab"
    assert s("a\ud835b", 10) == "ab"
    assert s("  \u00a0 ", 10) == ""


# -- state files and removal ------------------------------------------------------------------


def test_meta_and_cursor_round_trip(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    assert store.read_meta(state) == {}
    assert store.read_cursor(state) == {"updatedAt": "1970-01-01T00:00:00.000Z"}
    meta = store.write_meta(state, lastDreamAt="2024-01-01T00:00:00.000Z", lastDreamStatus="noop")
    assert store.read_meta(state) == meta and meta["version"] == 1
    created = meta["createdAt"]
    meta2 = store.write_meta(state, lastDreamStatus=None, lastExtractionTouchedTopics=["a"])
    assert "lastDreamStatus" not in meta2 and meta2["createdAt"] == created
    text = (state / "meta.json").read_text()
    assert text == json.dumps(meta2, indent=2, ensure_ascii=False) + "\n"
    cur = store.write_cursor(state, "s-1", 12)
    assert store.read_cursor(state) == cur
    assert list(cur) == ["sessionId", "processedOffset", "updatedAt"]
    (state / "meta.json").write_text("{not json")
    assert store.read_meta(state) == {}


def test_remove_docs(tmp_path: Path) -> None:
    a = write_mem(tmp_path, "a.md")
    d = tmp_path / "dir.md"
    d.mkdir()
    assert store.remove_docs([a, tmp_path / "gone.md", d]) == [a]
    assert not a.exists() and d.is_dir()


# -- scope classification ---------------------------------------------------------------------


def test_scope_of(tmp_path: Path, base: Path) -> None:
    repo = make_repo(tmp_path / "r")
    roots = roots_at(repo, team_enabled=True)
    store.ensure_scaffold(roots)
    assert roots.project is not None and roots.team is not None
    assert mpaths.scope_of(roots.project / "feedback" / "x.md", roots) == "project"
    assert mpaths.scope_of(roots.project, roots) == "project"
    assert mpaths.scope_of(roots.user / "user" / "new" / "y.md", roots) == "user"
    assert mpaths.scope_of(roots.team / "feedback" / "z.md", roots) == "team"
    assert mpaths.scope_of(repo / "src" / "a.py", roots) is None
    sibling = roots.project.parent / "memory-other" / "x.md"
    assert mpaths.scope_of(sibling, roots) is None
    assert mpaths.scope_of(roots.project / ".." / "meta.json", roots) is None
    assert mpaths.scope_of(roots.user / ".." / "memories2" / "x.md", roots) is None


def test_dangling_symlink_into_team_memory_is_team(tmp_path: Path, base: Path) -> None:
    repo = make_repo(tmp_path / "r")
    roots = roots_at(repo, team_enabled=True)
    store.ensure_scaffold(roots)
    assert roots.team is not None and roots.project is not None
    (roots.team / "feedback").mkdir(parents=True)
    decoy = repo / "decoy.md"
    decoy.symlink_to(Path(".qwen") / "team-memory" / "feedback" / "leak.md")  # relative, dangling
    assert not decoy.exists()
    assert mpaths.scope_of(decoy, roots) == "team"
    inside = roots.project / "feedback" / "decoy.md"
    inside.symlink_to(roots.team / "feedback" / "leak2.md")
    assert mpaths.scope_of(inside, roots) == "team"
    chain = repo / "chain.md"
    chain.symlink_to(decoy)
    assert mpaths.scope_of(chain, roots) == "team"
    loop = repo / "loop.md"
    loop.symlink_to(loop)
    assert mpaths.scope_of(loop, roots) is None
