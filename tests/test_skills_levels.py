"""Skill discovery: base directories, precedence, failures confined to one base, settings.

Tests run as root, where ``chmod 000`` does not stop reads, so an unreadable base is simulated
by making the base a regular file, a dangling symlink, or by making ``os.scandir`` raise
PermissionError for that one path.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from qwenctxd.config.schema import SkillsSettings
from qwenctxd.skills import levels
from qwenctxd.skills.levels import BUNDLED_DIR, aload_skills, base_dirs, load_skills
from qwenctxd.skills.model import BaseDir


def write_skill(base: Path, dirname: str, name: str | None = None, desc: str = "d",
                extra: str = "") -> Path:
    d = base / dirname
    d.mkdir(parents=True, exist_ok=True)
    f = d / "SKILL.md"
    f.write_text(f"---\nname: {name or dirname}\ndescription: {desc}\n{extra}---\nBody of {dirname}\n")
    return f


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    root = tmp_path / "proj"
    home.mkdir()
    root.mkdir()
    return {"home": home, "root": root, "tmp": tmp_path}


def dirs(tree: dict[str, Path], settings: SkillsSettings | None = None, **kw) -> list[BaseDir]:
    return base_dirs(tree["root"], home=tree["home"], settings=settings or SkillsSettings(),
                     cwd=tree["root"], **kw)


def test_base_dir_order(tree: dict[str, Path]) -> None:
    ext = tree["tmp"] / "ext" / "skills"
    bases = dirs(tree, SkillsSettings(directories=["~/custom", "rel/skills"]), extension_dirs=[ext])
    got = [(b.level, b.path) for b in bases]
    r, h = tree["root"], tree["home"]
    assert got == [
        ("project", r / ".qwen" / "skills"),
        ("project", r / ".agents" / "skills"),
        ("user", h / ".qwen" / "skills"),
        ("user", h / ".agents" / "skills"),
        ("user", h / "custom"),
        ("user", r / "rel" / "skills"),
        ("extension", ext),
        ("bundled", BUNDLED_DIR),
    ]
    assert [b.exists for b in bases] == [False] * 7 + [True]


def test_qwen_dir_override_and_dedup(tree: dict[str, Path]) -> None:
    qdir = tree["tmp"] / "qhome"
    s = SkillsSettings(directories=[str(qdir / "skills"), "~/.agents/skills", "", "~/x", "~/x"])
    got = [b.path for b in dirs(tree, s, qwen_dir=qdir) if b.level == "user"]
    assert got == [qdir / "skills", tree["home"] / ".agents" / "skills", tree["home"] / "x"]


def test_project_skipped_when_root_is_home_or_none(tree: dict[str, Path]) -> None:
    s = SkillsSettings()
    same = base_dirs(tree["home"], home=tree["home"], settings=s, cwd=tree["home"])
    assert [b.level for b in same] == ["user", "user", "bundled"]
    none = base_dirs(None, home=tree["home"], settings=s, cwd=tree["home"])
    assert [b.level for b in none] == ["user", "user", "bundled"]


def test_disabled_levels(tree: dict[str, Path]) -> None:
    s = SkillsSettings(disabled_levels=["Project", "bundled"])
    assert {b.level for b in dirs(tree, s, extension_dirs=[tree["tmp"]])} == {"user", "extension"}


def test_relative_directories_resolved_against_cwd(tree: dict[str, Path]) -> None:
    cwd = tree["tmp"] / "work" / "sub"
    cwd.mkdir(parents=True)
    write_skill(cwd.parent / "shared-skills", "from-cwd")
    s = SkillsSettings(directories=["../shared-skills"])
    bases = base_dirs(None, home=tree["home"], settings=s, cwd=cwd)
    custom = [b for b in bases if b.path == tree["tmp"] / "work" / "shared-skills"]
    assert custom and custom[0].exists and custom[0].level == "user"
    assert "from-cwd" in load_skills(bases, settings=s).skills


def test_precedence_and_shadowing(tree: dict[str, Path]) -> None:
    r, h = tree["root"], tree["home"]
    write_skill(r / ".qwen" / "skills", "dup", desc="project-qwen")
    write_skill(r / ".agents" / "skills", "dup", desc="project-agents")
    write_skill(h / ".qwen" / "skills", "dup", desc="user")
    write_skill(h / ".qwen" / "skills", "zeta")
    write_skill(r / ".agents" / "skills", "alpha")
    bundled = tree["tmp"] / "bundled"
    write_skill(bundled, "dup", desc="bundled")
    bases = [b for b in dirs(tree) if b.level != "bundled"] + [BaseDir("bundled", bundled, True)]
    ss = load_skills(bases, settings=SkillsSettings())
    assert ss.errors == []
    assert list(ss.skills) == ["alpha", "dup", "zeta"]
    assert ss.skills["dup"].description == "project-qwen"
    assert ss.skills["dup"].level == "project"
    assert sorted(s.description for s in ss.shadowed) == ["bundled", "project-agents", "user"]


def test_winner_is_frontmatter_name_not_dir(tree: dict[str, Path]) -> None:
    base = tree["root"] / ".qwen" / "skills"
    write_skill(base, "a-dir", name="same")
    write_skill(base, "b-dir", name="same")
    ss = load_skills(dirs(tree), settings=SkillsSettings())
    assert ss.skills["same"].path.parent.name == "a-dir"
    assert [s.path.parent.name for s in ss.shadowed] == ["b-dir"]


def test_bundled_skills_load(tree: dict[str, Path]) -> None:
    ss = load_skills(dirs(tree), settings=SkillsSettings())
    assert ss.errors == []
    assert {"review-checklist", "stuck"} <= set(ss.skills)
    assert all(s.level == "bundled" and s.body for s in ss.skills.values())


def test_settings_disabled_enabled_default_disabled(tree: dict[str, Path]) -> None:
    base = tree["home"] / ".qwen" / "skills"
    for n in ("keep", "nope", "dflt", "dflt-on", "both"):
        write_skill(base, n)
    s = SkillsSettings(disabled=["NOPE", "both"], default_disabled=["dflt", "Dflt-On", "both"],
                       enabled=["dflt-on", "both"], disabled_levels=["bundled"])
    ss = load_skills(dirs(tree, s), settings=s)
    assert list(ss.skills) == ["dflt-on", "keep"]
    assert sorted(x.name for x in ss.disabled) == ["both", "dflt", "nope"]
    assert levels.is_enabled("dflt-on", s) and not levels.is_enabled("BOTH", s)


def test_disabled_hides_all_levels_of_a_name(tree: dict[str, Path]) -> None:
    write_skill(tree["root"] / ".qwen" / "skills", "x")
    write_skill(tree["home"] / ".qwen" / "skills", "x")
    s = SkillsSettings(disabled=["x"])
    assert "x" not in load_skills(dirs(tree, s), settings=s).skills


def test_symlinked_skill_dir_followed_even_outside_base(tree: dict[str, Path]) -> None:
    repo = tree["tmp"] / "skill-repo"
    write_skill(repo, "linked")
    base = tree["home"] / ".qwen" / "skills"
    base.mkdir(parents=True)
    (base / "linked").symlink_to(repo / "linked", target_is_directory=True)
    (base / "dangling").symlink_to(tree["tmp"] / "nowhere")
    (base / "file-link").symlink_to(repo / "linked" / "SKILL.md")
    ss = load_skills(dirs(tree), settings=SkillsSettings())
    assert ss.skills["linked"].path == base / "linked" / "SKILL.md"
    assert [e.path for e in ss.errors] == [str(base / "dangling")]


def test_install_artifacts_git_files_and_empty_dirs_skipped(tree: dict[str, Path]) -> None:
    base = tree["home"] / ".qwen" / "skills"
    write_skill(base, "real")
    write_skill(base, "real.backup-123-1700000000", name="backup")
    write_skill(base, "real.installing-9-17", name="installing")
    write_skill(base, ".git", name="git")
    (base / "notes.txt").write_text("hi")
    (base / "SKILL.md").write_text("---\nname: top\ndescription: d\n---\n")
    (base / "no-skill-md").mkdir()
    (base / "deep" / "nested").mkdir(parents=True)
    write_skill(base / "deep", "nested")  # two levels down: not a skill of this base
    s = SkillsSettings(disabled_levels=["bundled"])
    ss = load_skills(dirs(tree, s), settings=s)
    assert list(ss.skills) == ["real"]
    assert ss.errors == []


def test_parse_errors_collected(tree: dict[str, Path]) -> None:
    base = tree["home"] / ".qwen" / "skills"
    write_skill(base, "good")
    (base / "bad").mkdir()
    (base / "bad" / "SKILL.md").write_text("no frontmatter")
    write_skill(base, "globby", extra="paths: ['ok/**', '{1..2000}']\n")
    s = SkillsSettings(disabled_levels=["bundled"])
    ss = load_skills(dirs(tree, s), settings=s)
    assert set(ss.skills) == {"good", "globby"}
    paths = sorted(e.path for e in ss.errors)
    assert paths == sorted([str(base / "bad" / "SKILL.md"),
                            f"{base / 'globby' / 'SKILL.md'}#paths[{{1..2000}}]"])


def test_oversize_skill_file_reported(tree: dict[str, Path]) -> None:
    base = tree["home"] / ".qwen" / "skills"
    f = write_skill(base, "big")
    f.write_text(f.read_text() + "x" * (300 * 1024))
    s = SkillsSettings(disabled_levels=["bundled"])
    ss = load_skills(dirs(tree, s), settings=s)
    assert "big" not in ss.skills and "256 KiB" in ss.errors[0].message


@pytest.mark.parametrize("kind", ["file", "dangling", "permission"])
def test_failing_base_is_confined(tree: dict[str, Path], kind: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    r, h = tree["root"], tree["home"]
    write_skill(r / ".agents" / "skills", "proj")
    write_skill(h / ".agents" / "skills", "usr")
    broken = r / ".qwen" / "skills"
    broken.parent.mkdir(parents=True)
    if kind == "file":
        broken.write_text("not a dir")
    elif kind == "dangling":
        broken.symlink_to(tree["tmp"] / "gone")
    else:
        write_skill(broken, "hidden")
        real_scandir = os.scandir

        def fake_scandir(path):  # type: ignore[no-untyped-def]
            if Path(path) == broken:
                raise PermissionError(13, "Permission denied", str(path))
            return real_scandir(path)

        monkeypatch.setattr(levels.os, "scandir", fake_scandir)
    ss = load_skills(dirs(tree), settings=SkillsSettings())
    assert {"proj", "usr", "stuck"} <= set(ss.skills)
    assert [e.path for e in ss.errors] == [str(broken)]
    assert "hidden" not in ss.skills


def test_unexpected_exception_confined(tree: dict[str, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    write_skill(tree["home"] / ".qwen" / "skills", "usr")
    real = levels.read_base

    def boom(base: BaseDir):  # type: ignore[no-untyped-def]
        if base.level == "bundled":
            raise RuntimeError("kaput")
        return real(base)

    monkeypatch.setattr(levels, "read_base", boom)
    ss = load_skills(dirs(tree), settings=SkillsSettings())
    assert list(ss.skills) == ["usr"]
    assert len(ss.errors) == 1 and "kaput" in ss.errors[0].message


def test_async_entry_matches_sync(tree: dict[str, Path]) -> None:
    write_skill(tree["root"] / ".qwen" / "skills", "b")
    write_skill(tree["home"] / ".qwen" / "skills", "b")
    write_skill(tree["home"] / ".agents" / "skills", "a")
    bases = dirs(tree)
    sync = load_skills(bases, settings=SkillsSettings())
    asy = anyio.run(lambda: aload_skills(bases, settings=SkillsSettings()))
    assert list(asy.skills) == list(sync.skills)
    assert asy.skills == sync.skills and asy.shadowed == sync.shadowed


def test_many_skills_sorted(tree: dict[str, Path]) -> None:
    bases = []
    for i, lvl in enumerate(("project", "user", "extension", "bundled")):
        b = tree["tmp"] / f"lvl{i}"
        for j in range(10):
            write_skill(b, f"s-{(j * 7 + i) % 23:02d}-{lvl}")
        bases.append(BaseDir(lvl, b, True))  # type: ignore[arg-type]
    ss = load_skills(bases, settings=SkillsSettings())
    assert list(ss.skills) == sorted(ss.skills) and len(ss.skills) == 40


def test_reload_sees_edits_despite_parse_cache(tree: dict[str, Path]) -> None:
    f = write_skill(tree["home"] / ".qwen" / "skills", "edit-me", desc="before")
    s = SkillsSettings(disabled_levels=["bundled"])
    bases = dirs(tree, s)
    assert load_skills(bases, settings=s).skills["edit-me"].description == "before"
    f.write_text(f.read_text().replace("before", "after"))
    again = load_skills(bases, settings=s)
    assert again.skills["edit-me"].description == "after"
    f.write_text("broken")
    third = load_skills(bases, settings=s)
    assert "edit-me" not in third.skills and len(third.errors) == 1
    third.errors[0].message = "mutated by a caller"
    assert load_skills(bases, settings=s).errors[0].message != "mutated by a caller"
