"""The reason a daemon exits reaches stderr even when stderr is a pipe (issue 24): the bounded
log writer queues lines for a pipe, and what was queued used to be dropped at exit, so a second
``qwenctxd`` said nothing but ``config.loaded`` before exiting 1."""

from __future__ import annotations

import json
import subprocess
import sys

from qwenctxd.testing.spawn import SpawnedDaemon

TRIES = 15


def _second(d: SpawnedDaemon, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "qwenctxd", *args], env=d.env, cwd=d.root,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60)


def test_a_second_daemon_says_why_it_exits_on_a_pipe_every_time(daemon: SpawnedDaemon) -> None:
    assert daemon.proc is not None
    first = daemon.proc.pid
    for attempt in range(TRIES):
        fmt = ("--log-format", "json") if attempt % 3 else ()  # auto on a pipe is JSON too
        out = _second(daemon, *fmt)
        assert out.returncode == 1, (attempt, out.stderr[-2000:])
        lines = [json.loads(ln) for ln in out.stderr.decode().splitlines() if ln.startswith("{")]
        reasons = [ln for ln in lines if ln.get("event") == "already running"]
        assert len(reasons) == 1, (attempt, out.stderr[-2000:])
        assert reasons[0]["pid"] == first and reasons[0]["level"] == "error"
        assert f"already running (pid {first}" in reasons[0]["message"]
        assert lines[-1]["event"] == "already running"  # nothing queued is lost before it
    assert daemon.call("daemon.ping") == "pong"


def test_a_bad_configuration_is_reported_on_a_pipe(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    conf = d.home / ".config" / "qwenctxd" / "config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text("[no_such_table]\nx = 1\n")
    for _ in range(2):
        out = _second(d)
        assert out.returncode == 2, out.stderr[-2000:]
        text = out.stderr.decode()
        assert "invalid configuration; refusing to start" in text and "config.toml" in text


def test_the_console_format_says_it_in_plain_words(daemon: SpawnedDaemon) -> None:
    out = _second(daemon, "--log-format", "console")
    assert out.returncode == 1
    assert b"qwenctxd: qwenctxd is already running (pid" in out.stderr
