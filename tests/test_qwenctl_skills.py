"""qwenctl skills (list / show) against a spawned daemon with a real skill tree."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from qwenctxd.protocol import skills as kwire
from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon

LONG = ("Project review checklist - run the linters, read the whole diff twice, check that the "
        "tests cover the change and that the docs say what changed and why")




def skill(base: Path, name: str, description: str, extra: str = "", body: str = "Do it.") -> Path:
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    path = d / "SKILL.md"
    path.write_text(f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}\n")
    return path


def build_tree(home: Path) -> Path:
    """A repo whose .qwen skill ``review-checklist`` shadows the user one, a conditional
    skill, a user skill the model may not invoke, and a broken SKILL.md. Returns the repo."""
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    proj, user = repo / ".qwen" / "skills", home / ".qwen" / "skills"
    skill(proj, "review-checklist", LONG, body="# Review\n1. Lint.\n2. Read the diff.")
    skill(user, "review-checklist", "the user's own checklist")
    skill(proj, "py-style", '"Python style rules\\nsecond line of the description"',
          'paths: ["src/**/*.py", "tests/*.py"]\n', body="Use type hints.")
    skill(home / ".agents" / "skills", "deploy", "Deploy steps", "disable-model-invocation: true\n")
    (proj / "broken").mkdir()
    (proj / "broken" / "SKILL.md").write_text("---\nname: broken\ndescription: [unclosed\n---\n")
    return repo


@pytest.fixture
def tree(spawn) -> tuple[SpawnedDaemon, Path]:  # type: ignore[no-untyped-def]
    d = spawn()
    repo = build_tree(d.home)
    return d.start(), repo


def rows_of(lines: list[str], title: str) -> list[list[str]]:
    """The indented rows under the table titled ``title`` (header row included)."""
    i = next(n for n, ln in enumerate(lines) if ln == title or ln.startswith(title + " ("))
    out = []
    for ln in lines[i + 1:]:
        if not ln.startswith("  "):
            break
        out.append(ln.split())
    return out


# -- list -------------------------------------------------------------------------------------
def test_list_human(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    r = qwenctl(d, "skills", "--cwd", str(repo), env={"COLUMNS": "300"})
    assert r.returncode == 0, r.stderr  # load errors are information, not a failure
    lines = r.stdout.splitlines()
    assert lines[0] == "skills for ~/repo"
    listed = d.call("skills.list", {"cwd": str(repo)})
    skills = rows_of(lines, "skills")
    assert lines[1] == f"skills ({len(listed['skills'])})"
    assert skills[0] == ["name", "level", "applies", "to", "model-invocable", "description"]
    by_name = {row[0]: row for row in skills[1:]}
    assert [row[0] for row in skills[1:]] == [s["name"] for s in listed["skills"]]
    assert by_name["review-checklist"][1:4] == ["project", "always", "yes"]
    assert " ".join(by_name["review-checklist"][4:]) == LONG  # 300 columns: room enough
    assert by_name["py-style"][1:5] == ["project", "src/**/*.py,", "tests/*.py", "yes"]
    assert by_name["py-style"][5:] == ["Python", "style", "rules"]  # first line only
    assert by_name["deploy"][1:4] == ["user", "always", "no"]
    assert "stuck" in by_name and by_name["stuck"][1] == "bundled"
    assert "broken" not in by_name
    shadowed = rows_of(lines, "shadowed")
    assert shadowed[0] == ["name", "level", "path"]
    assert ["review-checklist", "user", "~/.qwen/skills/review-checklist/SKILL.md"] in shadowed
    errors = rows_of(lines, "errors")
    assert errors[0] == ["path", "message"]
    assert [e[0] for e in errors[1:]] == [".qwen/skills/broken/SKILL.md"]
    assert "invalid YAML" in " ".join(errors[1])
    # `skills list` is the same command; --cwd defaults to the current directory
    assert qwenctl(d, "skills", "list", "--cwd", str(repo),
                   env={"COLUMNS": "300"}).stdout == r.stdout
    assert qwenctl(d, "skills", env={"COLUMNS": "300"}, cwd=repo).stdout == r.stdout
    assert qwenctl(d, "skills", "list", env={"COLUMNS": "300"}, cwd=repo).stdout == r.stdout


def test_list_truncates_descriptions_to_fit(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    r = qwenctl(d, "skills", "--cwd", str(repo), env={"COLUMNS": "90"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = lines.index(next(ln for ln in lines if ln.startswith("skills (")))
    end = lines.index(next(ln for ln in lines if ln.startswith("shadowed")))
    rows = {ln.split()[0]: ln for ln in lines[start + 2:end]}
    line = rows["review-checklist"]
    assert len(line) <= 90 and line.endswith("…")
    assert LONG.startswith(line.split("yes", 1)[1].strip().removesuffix("…"))
    for n in ("review-checklist", "py-style", "deploy", "stuck"):
        assert len(rows[n]) <= 90


def test_list_nothing_shadowed_no_errors(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn().start()
    bare = d.home / "bare"
    bare.mkdir()
    r = qwenctl(d, "skills", "--cwd", str(bare))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "skills for ~/bare"
    assert lines[-2:] == ["shadowed: none", "errors: none"]
    assert {row[1] for row in rows_of(lines, "skills")[1:]} == {"bundled"}


def test_list_json(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    r = qwenctl(d, "skills", "--cwd", str(repo), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res == d.call("skills.list", {"cwd": str(repo)})
    assert set(res) == {"skills", "errors", "shadowed"}
    keys = {"name", "description", "level", "path", "conditional", "active", "paths",
            "model_invocable"}
    assert all(set(s) == keys for s in res["skills"] + res["shadowed"])
    by_name = {s["name"]: s for s in res["skills"]}
    assert by_name["py-style"]["conditional"] is True
    assert by_name["py-style"]["paths"] == ["src/**/*.py", "tests/*.py"]
    assert by_name["deploy"]["model_invocable"] is False
    assert by_name["review-checklist"]["path"] == \
        str(repo / ".qwen" / "skills" / "review-checklist" / "SKILL.md")
    assert [(s["name"], s["level"]) for s in res["shadowed"] if s["level"] == "user"] == \
        [("review-checklist", "user")]
    assert [e["path"] for e in res["errors"]] == \
        [str(repo / ".qwen" / "skills" / "broken" / "SKILL.md")]
    assert r.stderr == ""
    # the global option before the command too
    assert json.loads(qwenctl(d, "--json", "skills", "list", "--cwd", str(repo)).stdout) == res


# -- show -------------------------------------------------------------------------------------
def test_show_human(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    loaded = d.call("skills.load", {"cwd": str(repo), "name": "review-checklist"})
    r = qwenctl(d, "skills", "show", "review-checklist", "--cwd", str(repo))
    assert r.returncode == 0, r.stderr
    head, sep, content = r.stdout.partition("\n\n")
    assert sep and content == loaded["content"]  # the full loaded text, verbatim
    assert "1. Lint.\n2. Read the diff." in content
    lines = head.splitlines()
    assert lines[0] == "skill review-checklist"
    meta = {ln.split()[0]: ln.split()[1:] for ln in lines[1:] if ln.split()}
    assert meta["name"] == ["review-checklist"]
    assert meta["level"] == ["project"]
    assert meta["path"] == [".qwen/skills/review-checklist/SKILL.md"]
    assert meta["base"] == ["dir", ".qwen/skills/review-checklist"]
    assert meta["applies"] == ["to", "always"]
    assert meta["model-invocable"] == ["yes"]
    assert " ".join(meta["description"]) == LONG  # in full, not truncated
    assert meta["shadows"] == ["user", "~/.qwen/skills/review-checklist/SKILL.md"]
    # a conditional skill: its globs, every line of its description; --cwd defaults to "."
    r = qwenctl(d, "skills", "show", "py-style", cwd=repo)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[lines.index("skill py-style") + 5].split() == \
        ["applies", "to", "src/**/*.py,", "tests/*.py"]
    i = next(n for n, ln in enumerate(lines) if ln.split()[:1] == ["description"])
    assert lines[i].split()[1:] == ["Python", "style", "rules"]
    assert lines[i + 1].split() == ["second", "line", "of", "the", "description"]
    assert "shadows" not in r.stdout
    assert r.stdout.endswith("Use type hints.\n")


def test_show_json(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    r = qwenctl(d, "skills", "show", "review-checklist", "--cwd", str(repo), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    loaded = d.call("skills.load", {"cwd": str(repo), "name": "review-checklist"})
    listed = d.call("skills.list", {"cwd": str(repo)})
    info = next(s for s in listed["skills"] if s["name"] == "review-checklist")
    assert res == {**info, "base_dir": loaded["base_dir"], "content": loaded["content"],
                   "shadowed": [s for s in listed["shadowed"] if s["name"] == "review-checklist"]}
    assert res["base_dir"] == str(repo / ".qwen" / "skills" / "review-checklist")
    assert [s["level"] for s in res["shadowed"]][:1] == ["user"]


def test_show_unknown_is_a_daemon_error(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    r = qwenctl(d, "skills", "show", "no-such-skill", "--cwd", str(repo))
    assert r.returncode == 1
    assert r.stdout == ""
    assert "daemon error -32602" in r.stderr
    assert "no skill named 'no-such-skill'" in r.stderr and "review-checklist" in r.stderr
    # a skill whose SKILL.md did not parse is unknown too
    assert qwenctl(d, "skills", "show", "broken", "--cwd", str(repo)).returncode == 1
    r = qwenctl(d, "skills", "show", "no-such-skill", "--cwd", str(repo), "--json")
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert err["code"] == -32602 and "no skill named 'no-such-skill'" in err["message"]
    assert qwenctl(d, "skills", "show").returncode == 2  # NAME is required


def test_bad_cwd_is_a_daemon_error(tree) -> None:  # type: ignore[no-untyped-def]
    d, _ = tree
    for args in (["skills"], ["skills", "show", "deploy"]):
        r = qwenctl(d, *args, "--cwd", "/nonexistent")
        assert r.returncode == 1
        assert "not an existing directory: /nonexistent" in r.stderr


def test_skills_render_with_rich_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from qwenctl import render

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "80")
    s = {"name": "a[b]", "description": "x" * 300, "level": "project",
         "path": "/h/r/.qwen/skills/a/SKILL.md", "conditional": True, "active": False,
         "paths": ["src/**"], "model_invocable": False}
    res = {"skills": [s], "errors": [{"path": "/h/r/e/SKILL.md", "message": "bad [bold]"}],
           "shadowed": [{**s, "level": "user", "path": "/h/.qwen/skills/a/SKILL.md"}]}
    out = Tty()
    render.skills_report(msgspec.convert(res, kwire.ListResult), cwd="/h/r", home="/h",
                         stream=out)
    text = out.getvalue()
    assert "a[b]" in text and "src/**" in text and "x…" in text and "bad [bold]" in text
    assert "~/.qwen/skills/a/SKILL.md" in text
    out = Tty()
    render.skill_detail(msgspec.convert(s, kwire.SkillInfo), msgspec.convert(
        {"name": "a[b]", "base_dir": "/h/r/.qwen/skills/a", "content": "Body [red]text[/red]\n"},
        kwire.LoadResult), [], cwd="/h/r", home="/h", stream=out)
    assert out.getvalue().endswith("\nBody [red]text[/red]\n")
