"""The one agent tool set over its two filesystems: the same tool-call script, run against the
real tree and against a speculation overlay of the same project, gives the same results —
identical reads, listings, globs, greps and edits, and the same refusals for every escape
(a symlink out of the tree, ``..``, an absolute outside path, a dangling link, a FIFO) — and
applying the overlay leaves the project exactly as the real run left it.

A hypothesis property drives random scripts over random spellings of paths (relative,
absolute, through ``.``/``..``, through symlinks in and out of the tree).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.containment import contained_key
from qwenctxd.agents.overlay import OverlayFS
from qwenctxd.agents.permissions import MemoryWriteScope
from qwenctxd.agents.tools import ToolContext, call_tool

Call = tuple[str, dict[str, Any]]


def make_project(base: Path) -> tuple[Path, Path]:
    """A project with a nested tree, symlinks in and out of it, and a FIFO; and the
    directory outside it."""
    root, outside = base / "proj", base / "outside"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "node_modules" / "dep").mkdir(parents=True)
    outside.mkdir()
    (root / "src" / "app.py").write_text("print('hello')\nneedle = 1\n")
    (root / "src" / "pkg" / "mod.py").write_text("def f():\n    return 'needle'\n")
    (root / "README.md").write_text("# Greeter\nSays hello.\nneedle in docs\n")
    (root / "docs" / "guide.md").write_text("guide\nhello again\n")
    (root / "node_modules" / "dep" / "x.js").write_text("needle\n")
    (outside / "victim.txt").write_text("keep me\nneedle\n")
    os.symlink(outside, root / "escape")
    os.symlink(root / "src", root / "srclink")
    os.symlink(root / "README.md", root / "readme_link")
    os.symlink(outside / "victim.txt", root / "victim_link")
    os.symlink(outside / "missing.txt", root / "dangling_out")
    os.mkfifo(root / "src" / "pipe.py")
    return root, outside


def tree_state(root: Path) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", "")
            elif p.is_file():
                out[rel] = (oct(p.stat().st_mode & 0o777), hashlib.sha256(p.read_bytes())
                            .hexdigest())
            else:
                out[rel] = ("special", "")
    return out


def normalise(result: str) -> str:
    """Refusals are worded per filesystem (the scope's roots vs the project); every other
    result, errors of the edit rule included, must match exactly. Other errors (a directory,
    a missing file) compare as their first line without the errno spelling."""
    if result.startswith("Error: write refused"):
        return "REFUSED"
    if result.startswith("Error:") and not result.startswith("Error: old_string"):
        return "ERROR"
    return result


async def run_script(ctx: ToolContext, script: list[Call]) -> list[str]:
    with anyio.fail_after(60):
        return [await call_tool(ctx, name, args) for name, args in script]


def run_both(base: Path, state: Path, script: list[Call]) -> tuple[list[str], list[str]]:
    """Run ``script`` over an overlay of the project, then over the real project; check the
    overlay never touched it and that applying the overlay to the project made afresh
    gives the real run's tree. The overlay and the audit log live in ``state``, away from what
the scripts can list. The raw results, overlay first."""
    root, outside = make_project(base)
    before, before_out = tree_state(root), tree_state(outside)
    overlay = OverlayFS(root, state / "ov")
    over = ToolContext.over_overlay(root, overlay, allow_shell=True)
    real = ToolContext.real_tree(root, MemoryWriteScope(writable_roots=[root]),
                                 AuditLog(state / "audit"), agent="parity")
    overlay_results = anyio.run(run_script, over, script)
    assert tree_state(root) == before, "the overlay run touched the project"
    real_results = anyio.run(run_script, real, script)
    assert tree_state(outside) == before_out, "a write escaped the project"
    after_real = tree_state(root)
    shutil.rmtree(root)
    shutil.rmtree(outside)
    make_project(base)  # the same project again, at the same place
    overlay.apply()
    assert tree_state(root) == after_real
    assert over.files_written == real.files_written
    return overlay_results, real_results


def test_fixed_script_gives_identical_results(tmp_path: Path) -> None:
    root = tmp_path / "project" / "proj"
    out = tmp_path / "project" / "outside"
    script: list[Call] = [
        ("read_file", {"file_path": str(root / "src" / "app.py")}),
        ("read_file", {"file_path": "src/../README.md", "offset": 2, "limit": 1}),
        ("read_file", {"file_path": str(out / "victim.txt")}),  # reads are confined (issue 23)
        ("list_directory", {"path": str(root)}),
        ("list_directory", {"path": "srclink"}),
        ("glob", {"pattern": "**/*.py"}),
        ("glob", {"pattern": "*.md", "path": "docs"}),
        ("grep_search", {"pattern": "needle"}),
        ("grep_search", {"pattern": "hello", "include": "*.md"}),
        # writes and edits inside, then reads that must see them
        ("write_file", {"file_path": "src/new.py", "content": "needle = 2\n"}),
        ("write_file", {"file_path": str(root / "srclink" / "app.py"), "content": "via link\n"}),
        ("edit", {"file_path": "README.md", "old_string": "hello", "new_string": "hi"}),
        ("edit", {"file_path": "readme_link", "old_string": "needle", "new_string": "pin"}),
        ("edit", {"file_path": "docs/guide.md", "old_string": "absent", "new_string": "x"}),
        ("edit", {"file_path": "docs/guide.md", "old_string": "e", "new_string": "E"}),
        ("edit", {"file_path": "docs/guide.md", "old_string": "e", "new_string": "E",
                  "replace_all": True}),
        ("write_file", {"file_path": "deep/er/file.txt", "content": "deep\n"}),
        ("read_file", {"file_path": str(root / "src" / "app.py")}),
        ("list_directory", {"path": "src"}),
        ("glob", {"pattern": "**/*.py"}),
        ("grep_search", {"pattern": "needle|pin|via"}),
        ("read_file", {"file_path": "docs/guide.md"}),
        # escapes: every one refused by both
        ("write_file", {"file_path": "../outside/x.txt", "content": "no"}),
        ("write_file", {"file_path": str(root / "src" / ".." / ".." / "outside" / "y"),
                        "content": "no"}),
        ("write_file", {"file_path": str(root / "escape" / "z.txt"), "content": "no"}),
        ("write_file", {"file_path": str(out / "victim.txt"), "content": "no"}),
        ("write_file", {"file_path": "victim_link", "content": "no"}),
        ("write_file", {"file_path": "dangling_out", "content": "no"}),
        ("edit", {"file_path": str(root / "escape" / "victim.txt"), "old_string": "keep",
                  "new_string": "lose"}),
        ("write_file", {"file_path": str(root), "content": "no"}),
        # FIFOs and directories: errors, never a hang
        ("read_file", {"file_path": "src/pipe.py"}),
        ("edit", {"file_path": "src/pipe.py", "old_string": "a", "new_string": "b"}),
        ("write_file", {"file_path": "src/pipe.py", "content": "no"}),
        ("write_file", {"file_path": "src", "content": "no"}),
        ("read_file", {"file_path": "missing.txt"}),
        ("list_directory", {"path": "missing"}),
        ("run_shell_command", {"command": "echo no > ../outside/w.txt"}),
        ("glob", {"pattern": "**/*"}),  # directories made by writes are listed too
        # `..` after a symlink to outside: judged, and written, where it is spelled to land
        ("write_file", {"file_path": "escape/../dotdot.txt", "content": "in\n"}),
    ]
    (tmp_path / "project").mkdir()
    over, real = run_both(tmp_path / "project", tmp_path / "state", script)
    assert [normalise(r) for r in over] == [normalise(r) for r in real]
    by_call = dict(zip(range(len(script)), real, strict=True))
    assert by_call[0] == "print('hello')\nneedle = 1"
    assert by_call[1] == "Says hello."
    assert by_call[2].startswith("Error: read refused") and "keep me" not in over[2]
    assert "pipe.py" not in by_call[7] and "node_modules" not in by_call[7]
    assert by_call[9].startswith("Created") and by_call[10].startswith("Wrote")
    assert by_call[17] == "via link"
    assert "src/new.py:1: needle = 2" in by_call[20] and "README.md:3: pin in docs" in by_call[20]
    assert by_call[21] == "guidE\nhEllo again"
    refusals = [normalise(r) for r in real[22:30]]
    assert refusals == ["REFUSED"] * 8, real[22:30]
    assert all("not a regular file" in r for r in (*real[30:32], *over[30:32])), real[30:33]
    assert normalise(real[32]) == "ERROR" == normalise(over[32])
    assert real[36].startswith("Error:") and "read-only" in real[36]
    assert f"{root}/deep/er\n" in real[37] and f"{root}/deep/er/file.txt" in real[37]
    assert real[38] == over[38] == f"Created {root}/dotdot.txt (3 chars)"
    assert (root / "dotdot.txt").read_text() == "in\n"
    assert not (tmp_path / "dotdot.txt").exists() and not (out.parent / "dotdot.txt").exists()


# -- the property -----------------------------------------------------------------------------
SEGMENTS = st.sampled_from(["src", "pkg", "docs", "..", ".", "escape", "srclink", "deep",
                            "new.py", "app.py", "README.md", "readme_link", "victim_link",
                            "victim.txt", "dangling_out", "pipe.py", "x.txt", "outside"])
ANCHORS = st.sampled_from(["relative", "root", "outside", "root-dotdot"])


@st.composite
def spelled_paths(draw: st.DrawFn) -> tuple[str, list[str]]:
    return draw(ANCHORS), draw(st.lists(SEGMENTS, min_size=1, max_size=5))


def spell(base: Path, anchor: str, parts: list[str]) -> str:
    prefix = {"relative": "", "root": f"{base}/proj/", "outside": f"{base}/outside/",
              "root-dotdot": f"{base}/proj/src/../"}[anchor]
    return prefix + "/".join(parts)


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[str, tuple[str, list[str]], str]:
    name = draw(st.sampled_from(["read_file", "list_directory", "glob", "grep_search",
                                 "write_file", "edit"]))
    return name, draw(spelled_paths()), draw(st.sampled_from(["needle", "hello", "e", "x"]))


def build(base: Path, calls: list[tuple[str, tuple[str, list[str]], str]]) -> list[Call]:
    script: list[Call] = []
    for name, (anchor, parts), word in calls:
        path = spell(base, anchor, parts)
        full = os.path.normpath(path if os.path.isabs(path) else f"{base}/proj/{path}")
        if name in ("list_directory", "glob", "grep_search") and \
                not full.startswith(f"{base}/"):
            path = str(base)  # never walk the machine above the test's directory
        if name == "read_file":
            script.append((name, {"file_path": path}))
        elif name == "list_directory":
            script.append((name, {"path": path}))
        elif name == "glob":
            script.append((name, {"pattern": "**/*", "path": path}))
        elif name == "grep_search":
            script.append((name, {"pattern": word, "path": path}))
        elif name == "write_file":
            script.append((name, {"file_path": path, "content": f"{word}\n"}))
        else:
            script.append((name, {"file_path": path, "old_string": word,
                                  "new_string": word.upper(), "replace_all": True}))
    return script


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tool_calls(), min_size=1, max_size=12))
def test_random_scripts_agree_on_both_filesystems(
        calls: list[tuple[str, tuple[str, list[str]], str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as state:
        base = Path(tmp)
        script = build(base, calls)
        over, real = run_both(base, Path(state), script)
        assert [normalise(r) for r in over] == [normalise(r) for r in real], script
        outside = base / "outside"
        for (name, args), result in zip(script, real, strict=True):
            target = args.get("file_path")
            if name in ("write_file", "edit") and target is not None:
                full = target if os.path.isabs(target) else f"{base}/proj/{target}"
                if contained_key(full, base / "proj") is None:
                    assert normalise(result) == "REFUSED", (target, result)
        assert (outside / "victim.txt").read_text() == "keep me\nneedle\n"
