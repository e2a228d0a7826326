"""The listings the watch hub compares across a restart (qwenctxd.watch.listing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from watchfiles import Change

from qwenctxd.watch import listing
from qwenctxd.watch.listing import diff, snapshot


def test_diff_names_every_add_removal_and_edit(tmp_path: Path) -> None:
    (tmp_path / "gone.md").write_text("x")
    (tmp_path / "edited.md").write_text("x")
    (tmp_path / "same.md").write_text("x")
    sub = tmp_path / "sub"
    sub.mkdir()
    before = snapshot([str(tmp_path)])
    (tmp_path / "gone.md").unlink()
    (tmp_path / "edited.md").write_text("edited")
    (tmp_path / "new.md").write_text("x")
    (sub / "deep.md").write_text("x")  # non-recursive: the subdirectory itself did not change
    assert diff(before, snapshot([str(tmp_path)])) == {
        (Change.deleted, str(tmp_path / "gone.md")),
        (Change.modified, str(tmp_path / "edited.md")),
        (Change.added, str(tmp_path / "new.md")),
    }


def test_a_directory_that_appears_or_vanishes(tmp_path: Path) -> None:
    d = tmp_path / "mem"
    missing = snapshot([str(d)])
    assert missing == {str(d): None}
    d.mkdir()
    (d / "a.md").write_text("x")
    present = snapshot([str(d)])
    assert diff(missing, present) == {(Change.added, str(d / "a.md"))}
    (d / "a.md").unlink()
    d.rmdir()
    assert diff(present, snapshot([str(d)])) == {(Change.deleted, str(d / "a.md"))}
    # only directories listed on both sides are compared
    assert diff(present, {}) == set()


def test_past_the_stat_limit_replacements_still_show(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "STAT_LIMIT", 0)
    (tmp_path / "a.md").write_text("x")
    before = snapshot([str(tmp_path)])
    (tmp_path / "b.md").write_text("y")
    os.replace(tmp_path / "b.md", tmp_path / "a.md")  # an atomic write: a new inode
    (tmp_path / "c.md").write_text("z")
    assert diff(before, snapshot([str(tmp_path)])) == {
        (Change.modified, str(tmp_path / "a.md")),
        (Change.added, str(tmp_path / "c.md")),
    }
