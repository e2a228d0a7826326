"""``qwenctl mcp``'s ``save_memory`` with odd input (issue 24): a name of 200 multi-byte
characters is saved (slugs are capped in UTF-8 bytes), and a save whose index cannot be
rebuilt (MEMORY.md is a directory) returns the path written plus a warning, not an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_mcp_server import exists, make_project, mcp_session, ok, read

from qwenctxd.testing.spawn import SpawnedDaemon


def _index_becomes_a_directory(memory_file: Path) -> None:
    index = memory_file.parent.parent / "MEMORY.md"
    index.unlink()
    index.mkdir()


@pytest.mark.asyncio
async def test_save_memory_with_a_long_multibyte_name_and_a_broken_index(
        daemon: SpawnedDaemon) -> None:
    repo = make_project(daemon.home)
    async with mcp_session(daemon, "--cwd", str(repo)) as s:
        name = "記憶" * 100
        path = Path(await ok(s, "save_memory", {"type": "user", "name": name,
                                                 "description": "d", "body": "remember"}))
        assert exists(path) and len(path.name.encode()) <= 255
        assert f"name: {name}" in read(path)
        _index_becomes_a_directory(path)
        out = await ok(s, "save_memory", {"type": "feedback", "name": "tabs",
                                          "description": "indent", "body": "Use tabs."})
        first, *notes = out.splitlines()
        assert exists(first) and "Use tabs." in read(Path(first))
        assert len(notes) == 1 and notes[0].startswith("warning: ") and "MEMORY.md" in notes[0]
