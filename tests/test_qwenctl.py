"""qwenctl against a spawned daemon: --json output, human output, exit codes, autostart."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from qwenctxd.testing.qwenctl_runs import qwenctl
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def test_status_json_and_human(daemon: SpawnedDaemon) -> None:
    r = qwenctl(daemon, "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["pid"] == daemon.proc.pid and st["state"] == "serving"
    assert st["model"]["configured"] is False
    r = qwenctl(daemon, "status")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0] == "qwenctxd status"
    assert any(line.split() == ["pid", str(daemon.proc.pid)] for line in lines)
    assert any(line.startswith("socket") and str(daemon.socket) in line for line in lines)
    assert any(line.startswith("model") and "not configured" in line for line in lines)
    # global options work after the command too
    assert json.loads(qwenctl(daemon, "--json", "status").stdout)["pid"] == daemon.proc.pid


def test_socket_prints_the_path(daemon: SpawnedDaemon) -> None:
    r = qwenctl(daemon, "socket")
    assert r.returncode == 0 and r.stdout.strip() == str(daemon.socket)
    r = qwenctl(daemon, "socket", "--socket", "/tmp/elsewhere.sock", "--json")
    assert json.loads(r.stdout) == {"socket": "/tmp/elsewhere.sock"}


def test_drain_shows_progress_then_lands(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"QWENCTXD_DEBUG_METHODS": "1"}).start()
    release = d.root / "release-the-dream"  # the job lands once qwenctl has seen it pending
    d.call("debug.sleep_task", {"seconds": 30, "kind": "dream", "until_exists": str(release)})
    with ThreadPoolExecutor(1) as pool:
        drain = pool.submit(qwenctl, d, "drain", "--timeout", "10")
        until(lambda: "daemon.drain" in d.requests() or drain.done(),
              what="qwenctl's first drain call to be answered (not drained)")
        release.touch()
        r = drain.result(60)
    assert r.returncode == 0, r.stderr
    assert "waiting: 1 pending (running: dream)" in r.stdout
    assert r.stdout.strip().endswith("drained: no background work pending")
    d.call("debug.sleep_task", {"seconds": 30})
    r = qwenctl(d, "drain", "--timeout", "0.5", "--json")
    assert r.returncode == 1 and json.loads(r.stdout) == {"drained": False, "pending": 1}


def test_stop(daemon: SpawnedDaemon) -> None:
    r = qwenctl(daemon, "stop", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"stopped": True, "pid": daemon.proc.pid}
    assert daemon.wait_exit() == 0
    assert not daemon.socket.exists()


def test_unreachable_without_autostart_exits_3(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    r = qwenctl(d, "status", "--no-autostart")
    assert r.returncode == 3
    assert len(r.stderr.strip().splitlines()) == 1
    assert "not running" in r.stderr and "start it with `qwenctxd`" in r.stderr
    # stop and drain never start a daemon just to stop it
    assert qwenctl(d, "stop").returncode == 3
    assert not d.socket.exists()


def test_autostart_starts_a_detached_daemon(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    t0 = time.monotonic()
    r = qwenctl(d, "status", "--json", fresh=True)  # a real `python -m qwenctl` start-up
    assert r.returncode == 0, r.stderr
    pid = json.loads(r.stdout)["pid"]
    assert time.monotonic() - t0 < 10
    log = d.home / ".local" / "state" / "qwenctxd" / "qwenctxd.log"
    assert '"event": "serving"' in log.read_text()
    # it outlives qwenctl; stop it through qwenctl
    assert json.loads(qwenctl(d, "status", "--json").stdout)["pid"] == pid
    r = qwenctl(d, "stop")
    assert r.returncode == 0 and f"pid {pid}" in r.stdout


def test_usage_error_exits_2(daemon: SpawnedDaemon) -> None:
    assert qwenctl(daemon, "frobnicate").returncode == 2
    assert qwenctl(daemon).returncode == 2


def test_install_service_writes_units(daemon: SpawnedDaemon) -> None:
    target = daemon.root / "units"
    r = qwenctl(daemon, "install-service", "--dir", str(target), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert sorted(out["written"]) == [str(target / "qwenctxd.service"),
                                      str(target / "qwenctxd.socket")]
    assert "systemctl --user enable --now qwenctxd.socket" in out["next"]
    service = (target / "qwenctxd.service").read_text()
    exec_line = next(x for x in service.splitlines() if x.startswith("ExecStart="))
    exe = exec_line.removeprefix("ExecStart=").split()[0]
    assert shutil.which(exe) is not None, exec_line  # an absolute, runnable path
    assert "Type=notify" in service and "WatchdogSec=" in service
    sock = (target / "qwenctxd.socket").read_text()
    assert "SocketMode=0600" in sock and "DirectoryMode=0700" in sock
    # default target: $XDG_CONFIG_HOME/systemd/user
    r = qwenctl(daemon, "install-service")
    assert r.returncode == 0
    assert (daemon.home / ".config" / "systemd" / "user" / "qwenctxd.socket").exists()
    assert "systemctl --user daemon-reload" in r.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_pass_systemd_analyze(daemon: SpawnedDaemon) -> None:
    target = daemon.root / "units"
    qwenctl(daemon, "install-service", "--dir", str(target))
    r = subprocess.run(
        ["systemd-analyze", "verify", "--user", "--man=no",
         str(target / "qwenctxd.socket"), str(target / "qwenctxd.service")],
        capture_output=True, text=True, env=daemon.env, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "qwenctxd" not in r.stderr


def test_methods_lists_and_describes_from_rpc_discover(daemon: SpawnedDaemon) -> None:
    r = qwenctl(daemon, "methods")
    assert r.returncode == 0, r.stderr
    rows = dict(line.split(None, 1) for line in r.stdout.splitlines())
    served = [m["name"] for m in daemon.call("rpc.discover")["methods"]]
    assert list(rows) == served
    assert rows["session.set_title"] == "{session_id, title}"
    assert rows["daemon.drain"] == "{timeout_s?}" and rows["daemon.ping"] == "{}"
    r = qwenctl(daemon, "methods", "session.turn")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "session.turn" and lines[-1] == "result  AssembledPrompt"
    fields = {ln.split()[0]: ln.split(None, 2)[1:] for ln in lines[2:-1]}
    assert fields["session_id"] == ["required", "str"]
    assert fields["kind"] == ["required", '"cron"|"tool_results"|"user"']
    assert fields["tool_results"] == ["optional", "[ToolResult] | null"]
    as_json = json.loads(qwenctl(daemon, "--json", "methods", "daemon.drain").stdout)
    assert as_json["name"] == "daemon.drain" and as_json["params"][0]["name"] == "timeout_s"
    unknown = qwenctl(daemon, "methods", "no.such")
    assert unknown.returncode == 2 and "no method 'no.such'" in unknown.stderr


def test_call_sends_raw_requests(daemon: SpawnedDaemon) -> None:
    r = qwenctl(daemon, "call", "daemon.ping")
    assert r.returncode == 0 and json.loads(r.stdout) == "pong"
    r = qwenctl(daemon, "call", "prompt.system", json.dumps({"cwd": str(daemon.home)}))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == daemon.call("prompt.system",
                                                       {"cwd": str(daemon.home)})["text"]
    piped = subprocess.run([sys.executable, "-m", "qwenctl", "call", "session.list", "-"],
                           input=json.dumps({"cwd": str(daemon.home)}), env=daemon.env,
                           capture_output=True, text=True, timeout=30)
    assert piped.returncode == 0 and json.loads(piped.stdout) == {"sessions": []}
    bad = qwenctl(daemon, "--json", "call", "session.list", '{"cwd": 5}')
    assert bad.returncode == 1 and "-32602" in bad.stderr
    assert json.loads(bad.stdout)["error"]["data"]["field"] == "cwd"
    assert qwenctl(daemon, "call", "no.such").returncode == 1
    for params in ("[1", "5"):
        r = qwenctl(daemon, "call", "daemon.ping", params)
        assert r.returncode == 2 and "PARAMS" in r.stderr
    assert daemon.call("daemon.ping") == "pong"


def test_logs_of_an_autostarted_daemon_rotation_and_follow(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn()
    log = d.home / ".local" / "state" / "qwenctxd" / "qwenctxd.log"
    missing = qwenctl(d, "logs")
    assert missing.returncode == 1 and "journalctl --user -u qwenctxd" in missing.stderr
    # an oversized log from earlier daemons is set aside when the next one is started
    log.parent.mkdir(parents=True)
    with open(log, "wb") as f:
        f.write(b'{"event": "old"}\n')
        f.truncate(8 * 1024 * 1024)
    assert qwenctl(d, "status").returncode == 0  # auto-starts the daemon
    assert (log.parent / "qwenctxd.log.1").stat().st_size == 8 * 1024 * 1024
    assert log.stat().st_size < 64 * 1024
    r = qwenctl(d, "logs", "-n", "50")
    assert r.returncode == 0, r.stderr
    serving = next(ln for ln in r.stdout.splitlines() if " serving " in ln + " ")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  info     serving  socket=", serving)
    raw = qwenctl(d, "--json", "logs", "-n", "3").stdout.splitlines()
    assert len(raw) == 3 and all(isinstance(json.loads(x), dict) for x in raw)
    follower = subprocess.Popen([sys.executable, "-m", "qwenctl", "logs", "-n", "0", "-f"],
                                env=d.env, stdout=subprocess.PIPE, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follower.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        def followed() -> bool:
            qwenctl(d, "sessions", "--all")  # logs a session.list line once the follower runs
            return any("method=session.list" in ln for ln in seen)

        until(followed, timeout=30, what="logs -f to print a new session.list line")
    finally:
        follower.terminate()
        follower.wait(5)
        reader.join(5)
        follower.stdout.close()  # type: ignore[union-attr]
    assert qwenctl(d, "stop").returncode == 0


def test_log_lines_for_people() -> None:
    from qwenctl.logs_cmds import human

    line = json.dumps({"method": "session.turn", "duration_ms": 0.6, "session": None,
                       "error_code": -32602, "event": "request", "level": "info",
                       "timestamp": "2026-11-30T07:16:26.147300Z"})
    assert human(line) == ("2026-11-30 07:16:26  info     request  method=session.turn "
                           "duration_ms=0.6 error_code=-32602")
    crash = json.dumps({"event": "method failed", "level": "error", "timestamp": "",
                        "exception": "Traceback (most recent call last):\n  boom\n"})
    assert human(crash).endswith("method failed  exception=\nTraceback (most recent call "
                                 "last):\n  boom")
    assert human("Fatal Python error: Aborted") == "Fatal Python error: Aborted"
