"""The environment reminder of new sessions: one folder walk for sessions starting together in
a directory, a fresh one once the directory changes or the moment has passed."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from qwenctxd.sessions.environment import EnvironmentReminders


@pytest.mark.asyncio
async def test_sessions_starting_together_share_one_walk_until_the_directory_changes(
        tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "README.md").write_text("x\n")
    now = [100.0]
    reminders = EnvironmentReminders(reuse_s=2.0, clock=lambda: now[0])
    texts: list[str] = []

    async def one() -> None:
        texts.append(await reminders.get(tmp_path))

    async with anyio.create_task_group() as tg:  # a burst: 32 sessions at once
        for _ in range(32):
            tg.start_soon(one)
    assert reminders.walks == 1
    assert len(set(texts)) == 1 and "README.md" in texts[0] and "src/" in texts[0]
    assert await reminders.get(tmp_path) == texts[0] and reminders.walks == 1
    (tmp_path / "added.txt").write_text("y\n")  # the directory's own mtime moves
    fresh = await reminders.get(tmp_path)
    assert reminders.walks == 2 and "added.txt" in fresh
    (tmp_path / "src" / "deep.py").write_text("z\n")  # below it: seen once the moment passed
    assert "deep.py" not in await reminders.get(tmp_path)
    now[0] += 2.5
    later = await reminders.get(tmp_path)
    assert reminders.walks == 3 and "deep.py" in later


@pytest.mark.asyncio
async def test_a_missing_directory_still_answers_and_is_not_kept_stale(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    reminders = EnvironmentReminders()
    text = await reminders.get(gone)
    assert f"Working directory: {gone}" in text
    gone.mkdir()
    (gone / "now.txt").write_text("1\n")
    assert "now.txt" in await reminders.get(gone)  # its mtime went from none to one
