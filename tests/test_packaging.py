"""Installing outside a checkout: build the wheel with hatchling, check it holds both packages
and every data file (bundled skills, unit files, LICENSE), install it into a fresh venv in a
tmp dir, and run the installed entry points from there — a daemon that serves the bundled
skills, and `qwenctl install-service` pointing the unit at the installed qwenctxd. Only the
wheel is installed there (``--no-deps``); the dependencies are the test venv's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from qwenctxd.client import Client, DaemonUnreachable
from qwenctxd.client.errors import ClientError
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"qwenctxd": REPO / "qwenctxd", "qwenctl": REPO / "clients" / "qwenctl" / "qwenctl"}


def data_files() -> set[str]:
    """Every non-Python file of both packages, as wheel paths."""
    out = set()
    for name, root in PACKAGES.items():
        for p in root.rglob("*"):
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts:
                out.add(f"{name}/{p.relative_to(root).as_posix()}")
    return out


def run(*argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path, spawn) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    dist = tmp_path / "dist"
    b = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO),
            cwd=tmp_path, timeout=120)
    assert b.returncode == 0, b.stderr
    (wheel,) = dist.glob("qwenctxd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert data_files() <= names, sorted(data_files() - names)
    assert {"qwenctxd/skills/bundled/stuck/SKILL.md", "qwenctl/units/qwenctxd.service",
            "qwenctl/cli.py", "qwenctxd/__main__.py"} <= names
    info = next(n for n in names if n.endswith(".dist-info/entry_points.txt")).rsplit("/", 1)[0]
    assert f"{info}/licenses/LICENSE" in names
    with zipfile.ZipFile(wheel) as z:
        assert "Apache License" in z.read(f"{info}/licenses/LICENSE").decode()
        meta = z.read(f"{info}/METADATA").decode()
        eps = z.read(f"{info}/entry_points.txt").decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "qwenctxd = qwenctxd.__main__:main" in eps and "qwenctl = qwenctl.cli:main" in eps

    # A fresh venv holding only our wheel; its dependencies come from the test venv's
    # site-packages, added as a plain path (its .pth files, the editable install among them,
    # are not processed), so nothing resolves to the source tree.
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", str(venv),
               cwd=tmp_path).returncode == 0
    bin_ = venv / "bin"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    ours = Path(run(str(bin_ / "python"), "-c", purelib, cwd=tmp_path).stdout.strip())
    deps = run(sys.executable, "-c", purelib, cwd=tmp_path).stdout.strip()
    assert ours.is_dir() and Path(deps).is_dir(), (ours, deps)
    (ours / "_test_venv_dependencies.pth").write_text(deps + "\n")
    pip = run(sys.executable, "-m", "pip", "--python", str(bin_ / "python"), "install", "-q",
              "--no-deps", str(wheel), cwd=tmp_path, timeout=120)
    assert pip.returncode == 0, pip.stderr
    check = run(sys.executable, "-m", "pip", "--python", str(bin_ / "python"), "check",
                cwd=tmp_path)  # every Requires-Dist of the wheel is satisfied
    assert check.returncode == 0, check.stdout + check.stderr
    where = run(str(bin_ / "python"), "-c",
                "import sys, qwenctxd, qwenctl; print(qwenctxd.__file__); print(qwenctl.__file__)"
                "; print(*sys.path, sep='\\n')", cwd=tmp_path)
    files, path = where.stdout.split()[:2], where.stdout.split()[2:]
    assert all(f.startswith(str(venv)) for f in files), where.stdout
    assert not any(p.startswith(str(REPO)) and not p.startswith(deps) for p in path), path
    v = run(str(bin_ / "qwenctxd"), "--version", cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.split()[0] == "qwenctxd"
    h = run(str(bin_ / "qwenctl"), "--help", cwd=tmp_path)
    assert h.returncode == 0 and "doctor" in h.stdout and "compress" in h.stdout

    # the installed daemon, started from the tmp dir in a scratch HOME
    d: SpawnedDaemon = spawn()
    env = {**d.env, "PATH": f"{bin_}:{os.environ.get('PATH', '')}"}
    with open(d.log_path, "ab") as log:
        proc = subprocess.Popen([str(bin_ / "qwenctxd")], cwd=tmp_path, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        def status() -> dict:
            assert proc.poll() is None, d.log_text()
            with Client(d.socket, timeout=2) as c:
                return c.call("daemon.status")

        st = until(status, timeout=max(deadline - time.monotonic(), 1.0),
                   what="the installed daemon answering",
                   ignoring=(DaemonUnreachable, ClientError, OSError))
        assert st["pid"] == proc.pid
        sk = run(str(bin_ / "qwenctl"), "skills", "--json", "--cwd", str(d.home), cwd=tmp_path,
                 env=env)
        assert sk.returncode == 0, sk.stderr
        assert {"stuck", "write-tests", "review-checklist"} <= {
            s["name"] for s in json.loads(sk.stdout)["skills"] if s.get("level") == "bundled"}
        units = tmp_path / "units"
        u = run(str(bin_ / "qwenctl"), "install-service", "--dir", str(units), cwd=tmp_path,
                env=env)
        assert u.returncode == 0, u.stderr
        service = (units / "qwenctxd.service").read_text()
        assert f"ExecStart={bin_ / 'qwenctxd'} serve --log-format json" in service
        assert "EnvironmentFile=-%h/.config/qwenctxd/env" in service
        stop = run(str(bin_ / "qwenctl"), "stop", cwd=tmp_path, env=env)
        assert stop.returncode == 0, stop.stderr
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the installed daemon did not exit after `qwenctl stop`:\n"
                                 + stop.stdout + stop.stderr + d.log_text()[-6000:]) from None
        assert code == 0, d.log_text()[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert time.monotonic() - started < 90
