"""The suite's guard against files left outside tmp dirs (tests/conftest.py,
:mod:`qwenctxd.testing.leaks`) notices what it is meant to and ignores other processes' churn."""

from __future__ import annotations

from pathlib import Path

from qwenctxd.testing import leaks


def test_new_entries_are_reported_by_each_watch_rule(tmp_path: Path) -> None:
    root, tmp, home = tmp_path / "root", tmp_path / "tmp", tmp_path / "home"
    for d in (root, tmp, home / ".config"):
        d.mkdir(parents=True)
    ours = tmp / "qcd-ours"
    watches = [leaks.Watch(root, lambda n: True),
               leaks.Watch(tmp, lambda n: n in leaks.OUR_NAMES or tmp / n == ours),
               leaks.Watch(home, lambda n: n not in (".cache", ".config")),
               leaks.Watch(home / ".config", lambda n: n == "qwenctxd")]
    before = leaks.snapshot(watches)
    assert leaks.leaks(before, watches) == []
    (root / "QWEN.md").write_text("x")  # what the fuzzer once left in /
    (tmp / "QWEN.md").write_text("x")
    ours.mkdir()
    (tmp / "qcd-someone-elses").mkdir()  # another suite's scratch tree: not ours to judge
    (tmp / "pip-build-xyz").mkdir()
    (home / ".cache").mkdir()
    (home / ".qwen").mkdir()
    (home / ".config" / "qwenctxd").mkdir()
    (home / ".config" / "other-tool").mkdir()
    assert leaks.leaks(before, watches) == sorted(map(str, [
        root / "QWEN.md", tmp / "QWEN.md", ours, home / ".qwen", home / ".config" / "qwenctxd"]))


def test_the_suite_watches_slash_the_real_home_and_tmp() -> None:
    watches = leaks.default_watches(Path("/root-like-home-that-is-missing"), set)
    assert [w.root for w in watches] == [Path("/"), Path("/tmp")]
    tmp_rule = watches[1].counts
    assert tmp_rule("QWEN.md") and tmp_rule(".qwen") and not tmp_rule("pytest-of-root")
    assert not tmp_rule("tmpab12cd") and not tmp_rule("qcd-xyz")
