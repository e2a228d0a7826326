"""Which window a session is sized for, through the socket: the client's, a resumed session's
recorded choice, Qwen Code's contextWindowSize, ``[model] context_window``, the default — and
``session.open``/``session.context``/``qwenctl context`` say where it came from."""

from __future__ import annotations

import json
from pathlib import Path

from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def _project(d: SpawnedDaemon, name: str, qwen_window: int | None = None) -> Path:
    root = d.home / "work" / name
    (root / ".git").mkdir(parents=True)
    if qwen_window is not None:
        (root / ".qwen").mkdir()
        (root / ".qwen" / "settings.json").write_text(json.dumps(
            {"model": {"generationConfig": {"contextWindowSize": qwen_window}}}))
    return root


def _open(d: SpawnedDaemon, root: Path, **extra: object) -> dict:
    return d.call("session.open", {"cwd": str(root), "model": "m", **extra})


def test_window_precedence_and_source(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    toml = d.home / ".config" / "qwenctxd" / "config.toml"
    toml.parent.mkdir(parents=True)
    toml.write_text("[model]\ncontext_window = 8192\n")
    d.start()
    plain = _project(d, "plain")
    qwen = _project(d, "qwen", qwen_window=32_768)

    r = _open(d, plain)
    assert (r["window_tokens"], r["window_source"]) == (8192, "config")
    ctx = d.call("session.context", {"session_id": r["session_id"]})
    assert (ctx["window_tokens"], ctx["window_source"]) == (8192, "config")
    assert ctx["thresholds"]["auto"] < 8192  # compaction is sized for that window

    r = _open(d, qwen)
    assert (r["window_tokens"], r["window_source"]) == (32_768, "settings")

    r = _open(d, plain, window_tokens=20_000)
    assert (r["window_tokens"], r["window_source"]) == (20_000, "client")
    r = _open(d, plain, window_tokens=12_000, window_source="upstream")
    assert (r["window_tokens"], r["window_source"]) == (12_000, "upstream")

    # qwenctl context names the source
    out = qwenctl(d, "context", r["session_id"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert "upstream model server" in out.stdout


def test_resume_keeps_a_chosen_window_but_not_a_default(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn().start()
    root = _project(d, "p")
    chosen = _open(d, root, window_tokens=16_000)
    defaulted = _open(d, root)
    assert defaulted["window_source"] == "default"
    for sid in (chosen["session_id"], defaulted["session_id"]):
        d.call("session.turn", {"session_id": sid, "kind": "user", "text": "hello"})
        d.call("session.close", {"session_id": sid})
    toml = d.home / ".config" / "qwenctxd" / "config.toml"
    toml.parent.mkdir(parents=True, exist_ok=True)
    gen = d.call("daemon.status")["config"]["generation"]
    toml.write_text("[model]\ncontext_window = 8192\n")
    until(lambda: d.call("daemon.status")["config"]["generation"] > gen, what="config reload")

    again = _open(d, root, session_id=chosen["session_id"], resume=True)
    assert again["resumed"] and (again["window_tokens"], again["window_source"]) == (16_000, "client")
    again = _open(d, root, session_id=defaulted["session_id"], resume=True)
    assert again["resumed"] and (again["window_tokens"], again["window_source"]) == (8192, "config")
