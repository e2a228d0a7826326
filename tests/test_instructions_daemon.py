"""Instructions and the system prompt through the daemon (its dispatcher in-process, or a
spawned daemon where a test needs one), with real trees in a scratch HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from qwenctxd.client import RemoteError
from qwenctxd.testing.inprocess import InProcessDaemon
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def markers(text: str) -> list[str]:
    return [line[len("--- Context from: "):-len(" ---")] for line in text.splitlines()
            if line.startswith("--- Context from: ")]


def rule_markers(text: str) -> list[str]:
    return [line[len("--- Rule from: "):-len(" ---")] for line in text.splitlines()
            if line.startswith("--- Rule from: ")]


@pytest.fixture
def daemon(inprocess_daemon: InProcessDaemon) -> InProcessDaemon:
    """This module's handler tests need no process: they run on the in-process daemon."""
    return inprocess_daemon


def test_output_language_file_loads_after_the_agents_chain_and_before_the_local_file(
        daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    write(daemon.home / ".qwen" / "output-language.md",
          "# Output language preference: auto\nRespond in the user's language.\n")
    r = prompt(daemon, cwd)
    names = markers(r["text"])
    assert names[-3:] == ["../AGENTS.md", "../../../../../.qwen/output-language.md",
                          "../../../.qwen/QWEN.local.md"]
    assert ("--- Context from: ../../../../../.qwen/output-language.md ---\n"
            "# Output language preference: auto\nRespond in the user's language.\n"
            "--- End of Context from: ../../../../../.qwen/output-language.md ---") in r["text"]
    rule = r["text"].index("--- Rule from: .qwen/rules/style.md ---")
    assert r["text"].index("--- End of Context from: ../../../.qwen/QWEN.local.md ---") < rule
    assert "--- End of Rule from: .qwen/rules/style.md ---" in r["text"]


def prompt(d: SpawnedDaemon | InProcessDaemon, cwd: Path, **kw) -> dict:  # type: ignore[no-untyped-def]
    return d.call("prompt.system", {"cwd": str(cwd), **kw})


def prompt_with(d: SpawnedDaemon | InProcessDaemon, cwd: Path, needle: str) -> dict | None:
    """The prompt for ``cwd`` if its text contains ``needle``, else None (for ``until``)."""
    r = prompt(d, cwd)
    return r if needle in r["text"] else None


def build_tree(home: Path) -> tuple[Path, Path]:
    write(home / ".qwen" / "QWEN.md", "global qwen\n")
    write(home / ".qwen" / "AGENTS.md", "global agents\n")
    repo = home / "work" / "repo"
    (repo / ".git").mkdir(parents=True)
    write(repo / "QWEN.md", "root qwen\n")
    (repo / "middle").mkdir()
    write(repo / "middle" / "sub" / "QWEN.md", "sub qwen\n")
    write(repo / "middle" / "sub" / "AGENTS.md", "sub agents\n")
    write(repo / ".qwen" / "QWEN.local.md", "my local notes\n")
    write(repo / ".qwen" / "rules" / "style.md", "Use four spaces.\n")
    cwd = repo / "middle" / "sub" / "deeper"
    cwd.mkdir(parents=True)
    return repo, cwd


def test_layered_order_and_markers(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    r = prompt(daemon, cwd)
    assert markers(r["text"]) == [
        "../../../../../.qwen/QWEN.md",
        "../../../QWEN.md",
        "../QWEN.md",
        "../../../../../.qwen/AGENTS.md",
        "../AGENTS.md",
        "../../../.qwen/QWEN.local.md",
    ]
    # rules sit in Qwen Code's own markers, the path relative to the project root
    assert rule_markers(r["text"]) == [".qwen/rules/style.md"]
    assert "--- Context from: ../QWEN.md ---\nsub qwen\n--- End of Context from: ../QWEN.md ---" in r["text"]
    # the instructions sit behind exactly one --- separator after the base prompt
    base, sep, rest = r["text"].partition("\n\n---\n\n")
    assert sep and rest.startswith("--- Context from: ../../../../../.qwen/QWEN.md ---")
    types = [(Path(f["path"]).name, f["type"]) for f in r["files"]]
    assert types == [("QWEN.md", "user"), ("QWEN.md", "project"), ("QWEN.md", "project"),
                     ("AGENTS.md", "user"), ("AGENTS.md", "project"), ("QWEN.local.md", "local")]
    files = daemon.call("instructions.files", {"cwd": str(cwd)})
    assert files["project_root"] == str(repo)
    assert [r_["path"] for r_ in files["rules"]] == [str(repo / ".qwen" / "rules" / "style.md")]


def test_cwd_is_home(daemon: InProcessDaemon) -> None:
    build_tree(daemon.home)
    write(daemon.home / "QWEN.md", "home qwen\n")
    r = prompt(daemon, daemon.home)
    assert markers(r["text"]) == [".qwen/QWEN.md", "QWEN.md", ".qwen/AGENTS.md"]
    assert all(f["type"] == "user" for f in r["files"])


def test_worktree_git_file_marks_the_root(daemon: InProcessDaemon) -> None:
    wt = daemon.home / "wt"
    write(wt / ".git", "gitdir: /nonexistent/.git/worktrees/wt\n")
    write(wt / "QWEN.md", "worktree qwen\n")
    write(wt / ".qwen" / "QWEN.local.md", "wt local\n")
    write(daemon.home / "QWEN.md", "above the root's parent\n")
    cwd = wt / "pkg"
    cwd.mkdir()
    r = prompt(daemon, cwd)
    # the scan checks the root and its parent (home), then stops; the local slot loads last
    assert markers(r["text"]) == ["../../QWEN.md", "../QWEN.md", "../.qwen/QWEN.local.md"]
    assert r["project_root"] == str(wt)


def test_no_git_at_all(daemon: InProcessDaemon) -> None:
    plain = daemon.home / "plain" / "a" / "b"
    plain.mkdir(parents=True)
    write(daemon.home / "plain" / "QWEN.md", "plain qwen\n")
    write(daemon.home / "plain" / ".qwen" / "QWEN.local.md", "never loaded without a root\n")
    r = prompt(daemon, plain)
    assert markers(r["text"]) == ["../../QWEN.md"]
    assert r["project_root"] is None
    assert "# Git" not in r["text"]  # no git → no git sections


def test_local_slot_symlink_is_refused(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    local = repo / ".qwen" / "QWEN.local.md"
    local.unlink()
    target = write(daemon.home / "elsewhere.md", "sneaky\n")
    local.symlink_to(target)
    r = prompt(daemon, cwd)
    assert "sneaky" not in r["text"]
    assert any(e["kind"] == "refused" and "symlink" in e["message"] for e in r["errors"])


def test_imports_through_the_socket(daemon: InProcessDaemon) -> None:
    repo = daemon.home / "imp"
    (repo / ".git").mkdir(parents=True)
    write(repo / "a.md", "A says @./b.md\n")
    write(repo / "b.md", "B says @./a.md\n")
    write(repo / "x.md", "X content\n")
    write(repo / "QWEN.md", "\n".join([
        "Inline `@./x.md` stays.",
        "```",
        "@./x.md in a fence stays",
        "```",
        "mail me at a@b.com",
        "cycle: @./a.md",
        "escape: @../../etc/passwd",
        "gone: @./missing.md",
        "real: @./x.md",
    ]) + "\n")
    text = prompt(daemon, repo)["text"]
    assert "Inline `@./x.md` stays." in text
    assert "@./x.md in a fence stays" in text
    assert "a@b.com" in text
    assert "<!-- File already processed: ./a.md -->" in text
    assert "<!-- Import failed: ../../etc/passwd - Path traversal attempt -->" in text
    assert "gone: @./missing.md" in text
    assert "real: <!-- Imported from: ./x.md -->\nX content" in text
    files = daemon.call("instructions.files", {"cwd": str(repo)})
    root_file = next(f for f in files["files"] if f["path"] == str(repo / "QWEN.md"))
    assert str(repo / "x.md") in root_file["imports"] and str(repo / "a.md") in root_file["imports"]
    kinds = {e["kind"] for e in files["errors"]}
    assert {"import_cycle", "import_traversal"} <= kinds
    # flat format from the project's own settings
    write(repo / ".qwen" / "settings.json", '{"context": {"importFormat": "flat"}}')
    text = until(lambda: prompt_with(daemon, repo, "--- File: x.md ---"),
                 what="the flat import format in the prompt")["text"]
    assert text.count("--- File: x.md ---") == 1 and text.count("--- File: a.md ---") == 1


@pytest.mark.parametrize(("model", "needle"), [
    ("qwen3-coder-plus", "<function="),
    ("qwen-vl-max", '<tool_call>\n{"name": "list_directory"'),
    ("gpt-4o", "[tool_call: "),
    ("x" * 140 + "coder", "[tool_call: "),
])
def test_tool_call_style_by_model(daemon: SpawnedDaemon, model: str, needle: str) -> None:
    text = prompt(daemon, daemon.home, model=model)["text"]
    assert needle in text


def test_tool_call_style_env_overrides(daemon: InProcessDaemon) -> None:
    text = prompt(daemon, daemon.home, model="gpt-4o",
                  env={"QWEN_CODE_TOOL_CALL_STYLE": "qwen-coder"})["text"]
    assert "<function=" in text


def test_system_md_switches(daemon: InProcessDaemon) -> None:
    repo = daemon.home / "sysmd"
    repo.mkdir()
    with pytest.raises(RemoteError) as exc:
        prompt(daemon, repo, env={"QWEN_SYSTEM_MD": "1"})
    assert exc.value.code == -32010
    assert str(repo / ".qwen" / "system.md") in exc.value.message
    assert exc.value.data["path"] == str(repo / ".qwen" / "system.md")
    builtin = prompt(daemon, repo, env={"QWEN_SYSTEM_MD": "0"})["text"]
    assert builtin == prompt(daemon, repo)["text"]
    write(repo / ".qwen" / "system.md", "You are a custom agent.\n")
    custom = prompt(daemon, repo, env={"QWEN_SYSTEM_MD": "true"})
    assert custom["text"].startswith("You are a custom agent.")
    assert [s["name"] for s in custom["sections"]][0] == "custom_system_md"
    out = daemon.home / "written" / "base.md"
    prompt(daemon, repo, env={"QWEN_WRITE_SYSTEM_MD": str(out)})
    assert out.read_text().strip() and out.read_text().strip() in builtin
    assert daemon.call("daemon.ping") == "pong"


def test_append_and_sections(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    plain = prompt(daemon, cwd)
    r = prompt(daemon, cwd, append="Extra words.")
    assert r["text"] == plain["text"] + "\n\n---\n\nExtra words."
    assert r["prefix_hash"] != plain["prefix_hash"]
    assert prompt(daemon, cwd, append="   ")["text"] == plain["text"]  # empty adds nothing
    assert sum(s["chars"] for s in r["sections"]) == len(r["text"])
    assert [s["name"] for s in r["sections"]][-3:] == ["instructions", "memory", "append"]


def test_git_status_section(daemon: InProcessDaemon) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = daemon.home / "gitrepo"
    repo.mkdir()
    subprocess.run([*GIT, "init", "-q", "-b", "main", str(repo)], check=True)
    for i in range(7):
        subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", f"commit {i}"],
                       check=True)
    text = prompt(daemon, repo)["text"]
    assert "main" in text and "commit 6" in text and "commit 2" in text
    assert "commit 1" not in text  # five most recent only
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "commit 7"],
                   check=True)
    until(lambda: prompt_with(daemon, repo, "commit 7"),
          what="the new commit in the git section")


def test_edits_are_live_and_unrelated_churn_costs_nothing(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    first = prompt(daemon, cwd)
    # the prompt subscribed its directories; once they are registered no change goes unseen
    status = until(lambda: (st := daemon.call("daemon.status"))["watch"]["synced"] and st,
                   what="the watch hub to register the project's directories")
    rebuilds = status["counters"]["instructions_rebuilds"]
    handled = status["watch"]["changes"]
    # 1 000 unrelated files in watched directories of the project: same prefix, no rebuild.
    # The hub counts a change once every subscriber's callback returned, so once it has
    # handled 1 000 more the churn has reached the instructions cache (at least one change
    # per new file) and the cache had its chance to go stale.
    for i in range(500):
        (repo / f"build_{i}.o").write_bytes(b"x")
        (cwd / f"gen_{i}.txt").write_bytes(b"y")
    until(lambda: daemon.call("daemon.status")["watch"]["changes"] >= handled + 1000,
          what="the watch hub to hand out the 1 000 new files")
    assert prompt(daemon, cwd)["prefix_hash"] == first["prefix_hash"]
    assert daemon.call("daemon.status")["counters"]["instructions_rebuilds"] == rebuilds
    # an edit to sub/QWEN.md shows in the next prompt (bench measures the ≤300 ms figure)
    (repo / "middle" / "sub" / "QWEN.md").write_text("sub qwen, edited\n")
    r = until(lambda: prompt_with(daemon, cwd, "sub qwen, edited"),
              what="the edit to sub/QWEN.md in the prompt")
    assert r["prefix_hash"] != first["prefix_hash"]
    # a QWEN.md appearing in the empty middle dir is picked up too
    write(repo / "middle" / "QWEN.md", "middle appears\n")
    until(lambda: prompt_with(daemon, cwd, "middle appears"),
          what="the new middle/QWEN.md in the prompt")


def test_problems_are_listed_and_the_prompt_still_assembles(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    repo, cwd = build_tree(d.home)
    big = write(repo / "middle" / "sub" / "QWEN.md", "big line\n" * 10_000)
    locked = write(repo / "QWEN.md", "secret root\n")
    write(repo / "middle" / "sub" / "AGENTS.md", "broken import @./nowhere/../../../../../../etc/hostname\n")
    os.chmod(locked, 0)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root reads anything: drop the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    d.start(argv_prefix=prefix)
    files = d.call("instructions.files", {"cwd": str(cwd)})
    by_kind = {e["kind"]: e for e in files["errors"]}
    assert by_kind["unreadable"]["path"] == str(locked)
    assert by_kind["too_large"]["path"] == str(big)
    assert "import_traversal" in by_kind
    assert any(f["path"] == str(big) and f["truncated"] for f in files["files"])
    r = prompt(d, cwd)
    assert "secret root" not in r["text"]
    assert "[... truncated: QWEN.md is 90000 bytes, over the 65536-byte cap" in r["text"]
    assert "sub agents" not in r["text"] and "broken import" in r["text"]
    assert {e["kind"] for e in r["errors"]} >= {"unreadable", "too_large", "import_traversal"}


def test_conditional_rules_match_touched_paths(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    write(repo / ".qwen" / "rules" / "ts.md",
          '---\npaths: ["src/**/*.ts", "*.js"]\n---\nPrefer strict TypeScript.\n')
    r = prompt(daemon, cwd)
    assert "Prefer strict TypeScript" not in r["text"]  # conditional: never in the prompt
    m = daemon.call("instructions.match_rules",
                    {"cwd": str(repo), "paths": [".eslintrc.js", "src/a/b.ts", "/etc/x.js"]})
    assert len(m["rules"]) == 1
    assert m["rules"][0]["matched"] == [".eslintrc.js", "src/a/b.ts"]
    assert "Prefer strict TypeScript." in m["rules"][0]["reminder"]
    assert daemon.call("instructions.match_rules",
                       {"cwd": str(repo), "paths": ["README.md"]}) == {"rules": []}


def test_add_memory(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    before = prompt(daemon, cwd)
    r = daemon.call("instructions.add_memory", {"cwd": str(cwd), "scope": "project",
                                                "text": "prefers tabs\nover spaces"})
    assert r["path"] == str(repo / "QWEN.md")
    assert (repo / "QWEN.md").read_text() == "root qwen\n\n## Qwen Added Memories\n- prefers tabs over spaces\n"
    daemon.call("instructions.add_memory", {"cwd": str(cwd), "scope": "project", "text": "second"})
    assert (repo / "QWEN.md").read_text().endswith("- prefers tabs over spaces\n- second\n")
    after = prompt(daemon, cwd)  # visible at once: our own write invalidates the cache
    assert "- second" in after["text"] and after["prefix_hash"] != before["prefix_hash"]
    g = daemon.call("instructions.add_memory", {"cwd": str(cwd), "scope": "global", "text": "g1"})
    assert g["path"] == str(daemon.home / ".qwen" / "QWEN.md")
    with pytest.raises(RemoteError) as exc:
        daemon.call("instructions.add_memory", {"cwd": str(cwd), "scope": "team", "text": "x"})
    assert exc.value.code == -32602 and exc.value.data["field"] == "scope"
    for empty in ("", "  \n", "*", "-*-"):  # nothing left once list markers are dropped
        with pytest.raises(RemoteError) as exc:
            daemon.call("instructions.add_memory", {"cwd": str(cwd), "scope": "project",
                                                    "text": empty})
        assert exc.value.code == -32602 and exc.value.data["field"] == "text"
    assert (repo / "QWEN.md").read_text().endswith("- prefers tabs over spaces\n- second\n")


def test_bad_cwd_is_a_clear_error(daemon: InProcessDaemon) -> None:
    for bad in ("relative/path", "/nonexistent/dir"):
        with pytest.raises(RemoteError) as exc:
            daemon.call("prompt.system", {"cwd": bad})
        assert exc.value.code == -32602 and exc.value.data["field"] == "cwd"
    assert daemon.call("daemon.ping") == "pong"


def test_extension_context_files_load_after_the_hierarchy(daemon: InProcessDaemon) -> None:
    repo, cwd = build_tree(daemon.home)
    ext = daemon.home / ".qwen" / "extensions" / "helper"
    write(ext / "qwen-extension.json", '{"name": "helper", "contextFileName": "HELPER.md"}')
    write(ext / "HELPER.md", "extension says hi\n")
    r = prompt(daemon, cwd)
    names = markers(r["text"])
    assert names[-2:] == ["../../../../../.qwen/extensions/helper/HELPER.md",
                          "../../../.qwen/QWEN.local.md"]
    assert ("extension" in [f["type"] for f in r["files"]])
