"""qwenctl prompt / qwenctl instructions against a spawned daemon with a real instruction tree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from qwenctxd.protocol import instructions as iwire
from qwenctxd.testing.qwenctl_runs import qwenctl, qwenctl_bytes
from qwenctxd.testing.spawn import SpawnedDaemon


def build_tree(home: Path) -> Path:
    """~/.qwen/QWEN.md; a repo with QWEN.md (importing docs/extra.md), sub/AGENTS.md over
    the 64 KiB cap, a baseline rule and a conditional one. Returns the repo."""
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "sub").mkdir()
    (repo / ".qwen" / "rules").mkdir(parents=True)
    (home / ".qwen").mkdir()
    (home / ".qwen" / "QWEN.md").write_text("Global preference: be brief.\n")
    (repo / "QWEN.md").write_text("# Repo\nUse tabs. ünïcode ✓\n@./docs/extra.md\n")
    (repo / "docs" / "extra.md").write_text("Extra doc from an import.\n")
    (repo / "sub" / "AGENTS.md").write_text("Sub agents.\n" + "x" * (70 * 1024))
    (repo / ".qwen" / "rules" / "style.md").write_text("Style rule: short functions.\n")
    (repo / ".qwen" / "rules" / "ts.md").write_text(
        '---\npaths: ["src/**/*.ts"]\n---\nTypeScript rule.\n')
    return repo


@pytest.fixture
def tree(spawn) -> tuple[SpawnedDaemon, Path]:  # type: ignore[no-untyped-def]
    d = spawn()
    d.env.pop("SANDBOX", None)  # the daemon (and qwenctl by default) run without it
    repo = build_tree(d.home)
    return d.start(), repo


# -- prompt -----------------------------------------------------------------------------------
def test_prompt_stdout_is_the_text_byte_for_byte(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    sub = repo / "sub"
    direct = d.call("prompt.system", {"cwd": str(sub)})
    expected = direct["text"].encode("utf-8") + b"\n"
    r = qwenctl_bytes(d, "prompt", "--cwd", str(sub))
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected
    assert "ünïcode ✓".encode() in r.stdout
    # --cwd defaults to the current directory
    r = qwenctl_bytes(d, "prompt", cwd=sub)
    assert r.returncode == 0 and r.stdout == expected
    # a relative --cwd is made absolute
    r = qwenctl_bytes(d, "prompt", "--cwd", "sub", cwd=repo)
    assert r.returncode == 0 and r.stdout == expected


def test_prompt_summary_on_stderr(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    sub = repo / "sub"
    direct = d.call("prompt.system", {"cwd": str(sub)})
    r = qwenctl(d, "prompt", "--cwd", str(sub))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == ("system prompt for ~/repo/sub (project root ~/repo; paths below "
                        "are relative to it)")
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines if ln.startswith("  ") and ln.split()}
    for s in direct["sections"]:
        assert rows[s["name"]] == [str(s["chars"]), str(s["est_tokens"])]
    assert "instructions" in rows and "identity" in rows
    assert rows["total"] == [str(sum(s["chars"] for s in direct["sections"])),
                             str(sum(s["est_tokens"] for s in direct["sections"]))]
    assert int(rows["total"][0]) == len(direct["text"])
    files = [ln.split() for ln in lines if ln.split()[:1] in (["user"], ["project"])]
    assert files == [["user", "~/.qwen/QWEN.md"], ["project", "QWEN.md"],
                     ["project", "sub/AGENTS.md"]]
    assert f"prefix hash: {direct['prefix_hash'][:16]}" in lines
    assert any(ln.split()[:2] == ["too_large", "sub/AGENTS.md"] for ln in lines)
    # nothing of the summary leaks into stdout
    assert "prefix hash" not in r.stdout


def test_prompt_json(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    sub = str(repo / "sub")
    r = qwenctl(d, "prompt", "--cwd", sub, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert re.fullmatch(r"[0-9a-f]{64}", res["prefix_hash"])
    assert res == d.call("prompt.system", {"cwd": sub})
    assert set(res) >= {"text", "sections", "files", "prefix_hash", "project_root", "errors"}
    assert r.stderr == ""
    # global option before the command too
    assert json.loads(qwenctl(d, "--json", "prompt", "--cwd", sub).stdout) == res


def test_prompt_options_pass_through(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    sub = str(repo / "sub")
    r = qwenctl_bytes(d, "prompt", "--cwd", sub, "--model", "qwen3-coder-plus",
                      "--append", "APPENDED-BY-TEST", "--mode", "headless")
    assert r.returncode == 0, r.stderr
    direct = d.call("prompt.system", {"cwd": sub, "model": "qwen3-coder-plus",
                                      "append": "APPENDED-BY-TEST",
                                      "interaction_mode": "headless"})
    assert r.stdout == direct["text"].encode() + b"\n"
    assert b"APPENDED-BY-TEST" in r.stdout
    assert any(ln.split()[:1] == ["append"] for ln in r.stderr.decode().splitlines())
    assert qwenctl(d, "prompt", "--mode", "bogus").returncode == 2


def test_prompt_uses_qwenctls_own_environment(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    sub = str(repo / "sub")
    assert "SANDBOX" not in d.env
    plain = d.call("prompt.system", {"cwd": sub})["text"]
    assert "# macOS Seatbelt" not in plain
    r = qwenctl(d, "prompt", "--cwd", sub, "--json", env={"SANDBOX": "sandbox-exec"})
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["text"] != plain and "# macOS Seatbelt" in res["text"]
    assert res == d.call("prompt.system", {"cwd": sub, "env": {"SANDBOX": "sandbox-exec"}})
    # the daemon's own default is untouched
    assert d.call("prompt.system", {"cwd": sub})["text"] == plain
    assert qwenctl(d, "prompt", "--cwd", sub).stdout == plain + "\n"


# -- instructions -----------------------------------------------------------------------------
def test_instructions_human(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    r = qwenctl(d, "instructions", "--cwd", str(repo / "sub"))
    assert r.returncode == 0, r.stderr  # problems are information, not a failure
    lines = r.stdout.splitlines()
    # from a subdirectory every project path is relative to the project root (never a mix of
    # cwd-relative and absolute ones)
    assert lines[0] == ("instructions for ~/repo/sub (project root ~/repo; paths below are "
                        "relative to it)")
    assert lines[1] == "files (load order)"
    paths = [ln.split()[2] for ln in lines if re.match(r"\s+\d+\s", ln)]
    assert paths == ["~/.qwen/QWEN.md", "QWEN.md", "sub/AGENTS.md"]
    i = next(n for n, ln in enumerate(lines) if ln.split()[2:3] == ["QWEN.md"])
    assert lines[i + 1].split() == ["imports", "docs/extra.md"]
    assert lines[i + 1].index("imports") > lines[i].index("QWEN.md")  # indented under it
    agents = next(ln for ln in lines if ln.split()[2:3] == ["sub/AGENTS.md"])
    assert "KiB" in agents and "truncated" in agents
    rules = lines.index("rules")
    assert lines[rules + 2].split()[:2] == ["baseline", ".qwen/rules/style.md"]
    cond = lines[rules + 3].split()
    assert cond[:2] == ["conditional", ".qwen/rules/ts.md"] and cond[-1] == "src/**/*.ts"
    assert not any("~/repo/" in ln for ln in lines[1:])
    problems = lines.index("problems")
    assert lines[problems + 2].split()[:2] == ["too_large", "sub/AGENTS.md"]
    assert "over the 65536-byte cap" in lines[problems + 2]


def test_instructions_relative_to_cwd_and_no_problems(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    (repo / "sub" / "AGENTS.md").write_text("Small now.\n")
    r = qwenctl(d, "instructions", cwd=repo)  # --cwd defaults to the current directory
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("instructions for ~/repo (project root ~/repo; paths below are "
                        "relative to it)")
    assert [ln.split()[2] for ln in lines if re.match(r"\s+\d+\s", ln)] == \
        ["~/.qwen/QWEN.md", "QWEN.md"]
    assert any(ln.split() == ["imports", "docs/extra.md"] for ln in lines)
    assert any(ln.split()[:2] == ["conditional", ".qwen/rules/ts.md"] for ln in lines)
    assert lines[-1] == "problems: none"
    bare = d.home / "bare"
    bare.mkdir()
    (d.home / ".qwen" / "QWEN.md").unlink()
    r = qwenctl(d, "instructions", "--cwd", str(bare))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["instructions for ~/bare (no project root)",
                                     "files: none", "rules: none", "problems: none"]


def test_instructions_json(tree) -> None:  # type: ignore[no-untyped-def]
    d, repo = tree
    sub = str(repo / "sub")
    r = qwenctl(d, "instructions", "--cwd", sub, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res == d.call("instructions.files", {"cwd": sub})
    assert set(res) == {"files", "errors", "rules", "project_root"}
    assert res["project_root"] == str(repo)
    assert [f["path"] for f in res["files"]] == [
        str(d.home / ".qwen" / "QWEN.md"), str(repo / "QWEN.md"), str(repo / "sub" / "AGENTS.md")]
    qwen = res["files"][1]
    assert set(qwen) == {"path", "type", "imports", "bytes", "truncated"}
    assert qwen["imports"] == [str(repo / "docs" / "extra.md")] and qwen["type"] == "project"
    assert res["files"][2]["truncated"] is True and res["files"][2]["bytes"] > 64 * 1024
    assert {(x["path"].rsplit("/", 1)[1], x["conditional"], tuple(x["paths"]))
            for x in res["rules"]} == {("style.md", False, ()), ("ts.md", True, ("src/**/*.ts",))}
    assert [(e["kind"], e["path"]) for e in res["errors"]] == \
        [("too_large", str(repo / "sub" / "AGENTS.md"))]


@pytest.mark.parametrize("command", ["instructions", "prompt"])
def test_bad_cwd_is_a_daemon_error(tree, command: str) -> None:  # type: ignore[no-untyped-def]
    d, _ = tree
    r = qwenctl(d, command, "--cwd", "/nonexistent")
    assert r.returncode == 1
    assert "daemon error -32602" in r.stderr
    assert "not an existing directory: /nonexistent" in r.stderr
    assert r.stdout == ""
    r = qwenctl(d, command, "--cwd", "/nonexistent", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == -32602


def test_instructions_autostarts_the_daemon(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    repo = build_tree(d.home)
    r = qwenctl(d, "instructions", "--cwd", str(repo), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["project_root"] == str(repo)
    assert qwenctl(d, "stop").returncode == 0


def test_reports_render_with_rich_on_a_tty() -> None:
    import io

    from qwenctl import render

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    files = {"files": [{"path": "/h/r/[b].md", "type": "project", "imports": ["/h/r/d.md"],
                        "bytes": 3, "truncated": False}],
             "errors": [], "rules": [], "project_root": "/h/r"}
    out = Tty()
    render.instructions_report(msgspec.convert(files, iwire.InstructionsFilesResult),
                               cwd="/h/r", home="/h", stream=out)
    assert "[b].md" in out.getvalue() and "imports d.md" in out.getvalue()
    assert out.getvalue().rstrip().endswith("problems: none")
    prompt = {"text": "x", "sections": [{"name": "identity", "chars": 1, "est_tokens": 1}],
              "files": [], "prefix_hash": "0123456789abcdef" * 4, "project_root": None,
              "errors": [{"path": "/etc/x", "kind": "refused", "message": "m"}]}
    out = Tty()
    render.prompt_report(msgspec.convert(prompt, iwire.PromptSystemResult), cwd="/h", home="/h",
                         stream=out)
    assert "prefix hash: 0123456789abcdef\n" in out.getvalue() and "refused" in out.getvalue()
