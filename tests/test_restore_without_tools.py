"""File restoration after compaction for a session that declared no tools (issue 24): the
daemon adds its own ``skill`` tool to every session, which must not count as a declaration, so
Qwen Code's file tools (``read_file`` / ``write_file`` / ``edit`` / ``replace``) name the files
to restore. Through the socket, with upstream ``composePostCompactHistory``'s cases: the
workspace-root skip, large files as references, the longer fence, the maxFiles / maxImages caps
(POST_COMPACT_MAX_FILES_TO_RESTORE = 5, 5 000 tokens a file, POST_COMPACT_MAX_IMAGES_TO_RESTORE
= 3; qwen-code-facts.md §5.4)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

SUMMARY = "<analysis>a</analysis><state_snapshot><next_step>go on</next_step></state_snapshot>"
EMBEDDED = "re-read from disk just now"  # the daemon's own wording of upstream's two headers
REFERENCED = "listed for reference only"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


def _handler(body: dict[str, Any]) -> Reply:
    system = [m for m in body.get("messages", []) if m.get("role") == "system"]
    if system and "state_snapshot" in str(system[0].get("content")):
        return Reply(content=SUMMARY, usage={"prompt_tokens": 100, "completion_tokens": 20})
    return Reply(content="ok")


@pytest.fixture(scope="module")
def d() -> Iterator[SpawnedDaemon]:
    with ScriptedOpenAI(handler=_handler) as stub:
        daemon = SpawnedDaemon(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub",
                                    "OPENAI_API_KEY": "k", "QWENCTXD_FAST_MODEL": "stub"})
        try:
            yield daemon.start()
        finally:
            daemon.cleanup()


def _session(d: SpawnedDaemon, repo: Path, tools: list[dict[str, Any]] | None = None) -> str:
    params: dict[str, Any] = {"cwd": str(repo), "model": "stub"}
    if tools is not None:
        params["tools"] = tools
    return str(d.call("session.open", params)["session_id"])


def _read(d: SpawnedDaemon, sid: str, n: int, path: str, tool: str = "read_file",
          image: bool = False) -> None:
    """One user turn in which the model reads ``path`` with Qwen Code's tool (a user image
    rides along when asked)."""
    turn: dict[str, Any] = {"session_id": sid, "kind": "user", "text": f"look at {path}"}
    if image:
        turn["images"] = [{"type": "image_url",
                           "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    d.call("session.turn", turn)
    d.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{n}", "type": "function",
            "function": {"name": tool, "arguments": json.dumps({"file_path": path})}}]}})
    d.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
        {"tool_call_id": f"c{n}", "content": "(file content)"}]})
    d.call("session.record_model", {"session_id": sid,
                                    "message": {"role": "assistant", "content": f"read {n}"}})


def _compacted(d: SpawnedDaemon, sid: str) -> tuple[str, list[Any]]:
    """Compress, then the restored attachments message: (its text, its image parts)."""
    r = d.call("session.compress", {"session_id": sid, "mode": "full"})
    assert r["status"] == "compressed", r
    messages = d.call("session.turn", {"session_id": sid, "kind": "user",
                                       "text": "continue"})["messages"]
    text, images = "", []
    for m in messages[:4]:
        content = m.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        if m["role"] != "user":
            continue
        text += "".join(p.get("text", "") for p in parts if p.get("type") == "text")
        images += [p for p in parts if p.get("type") == "image_url"]
    return text, images


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    return repo


def test_files_read_with_qwen_codes_tools_come_back_without_declared_tools(
        d: SpawnedDaemon, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "a.py").write_text("def a():\n    return 1\n")
    (repo / "notes.md").write_text("see:\n```py\nx = 1\n```\nand ````` five\n")
    (repo / "big.txt").write_text("word " * 5_000)  # 25 000 chars: over 5 000 tokens
    outside = tmp_path / "outside.py"
    outside.write_text("SECRET_OUTSIDE = 1\n")
    sid = _session(d, repo)  # no tools: the daemon's own `skill` is the only one it has
    for n, path in enumerate((outside, repo / "big.txt", repo / "notes.md", repo / "a.py")):
        _read(d, sid, n, str(path), tool="edit" if path.name == "notes.md" else "read_file")
    (repo / "a.py").write_text("def a():\n    return 2\n")  # restored as it is on disk now
    text, _ = _compacted(d, sid)
    assert EMBEDDED in text, text[:2000]
    assert f"## {repo / 'a.py'}\n\n```\ndef a():\n    return 2\n```" in text
    assert f"## {repo / 'notes.md'}\n\n``````\nsee:" in text  # one backtick more than the file
    assert REFERENCED in text and str(repo / "big.txt") in text
    assert "word word" not in text
    assert "SECRET_OUTSIDE" not in text and str(outside) not in text  # outside the workspace


def test_at_most_five_files_and_three_images_the_newest(d: SpawnedDaemon,
                                                         tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    for i in range(7):
        (repo / f"f{i}.py").write_text(f"value_{i} = {i}\n")
    sid = _session(d, repo)
    for i in range(7):
        _read(d, sid, i, str(repo / f"f{i}.py"), image=i < 4)
    text, images = _compacted(d, sid)
    restored = [i for i in range(7) if f"value_{i} = {i}" in text]
    assert restored == [2, 3, 4, 5, 6], text[:3000]
    assert len(images) == 3, images


def test_a_session_that_declares_other_tools_uses_those(d: SpawnedDaemon,
                                                        tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "a.py").write_text("declared = 1\n")
    (repo / "b.py").write_text("undeclared = 1\n")
    tools = [{"type": "function", "function": {"name": "Read", "parameters": {
        "type": "object", "properties": {"file_path": {"type": "string"}}}}}]
    sid = _session(d, repo, tools)
    _read(d, sid, 0, str(repo / "a.py"), tool="Read")
    _read(d, sid, 1, str(repo / "b.py"), tool="read_file")  # not one of this session's tools
    text, _ = _compacted(d, sid)
    assert "declared = 1" in text and "undeclared = 1" not in text
