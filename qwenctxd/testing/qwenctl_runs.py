"""``qwenctl`` runs for tests: one helper in place of a ``subprocess.run([python, -m, qwenctl,
...])`` copy per test module.

Each run is a real process forked from the pre-imported :mod:`~qwenctxd.testing.forkserver`
(its own environment, working directory, stdin, exit code; stdout and stderr captured), so it
skips the ~0.2 s of interpreter start-up and imports a fresh ``python -m qwenctl`` pays, and
behaves as one otherwise. ``fresh=True`` (or ``QWENCTXD_TEST_FORKSERVER=0``) runs the real
``python -m qwenctl`` for what is about that process itself.
"""

from __future__ import annotations

import locale
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Protocol

from qwenctxd.testing import forkserver

__all__ = ["qwenctl", "qwenctl_bytes", "start_qwenctl"]


class HasEnv(Protocol):
    """What a run needs of a daemon: the environment that reaches it (SpawnedDaemon.env)."""

    env: dict[str, str]


def _text(data: bytes) -> str:
    """``data`` as ``subprocess.run(text=True)`` decodes it (locale encoding, universal
    newlines)."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def qwenctl_bytes(d: HasEnv, *args: str, env: dict[str, str] | None = None,
                  cwd: Path | str | None = None, stdin: int | None = None,
                  input: bytes | None = None, timeout: float | None = 30,
                  fresh: bool = False) -> subprocess.CompletedProcess[bytes]:
    """``qwenctl *args`` with ``d.env`` (plus ``env``) in ``cwd``; stdout/stderr as bytes.
    ``stdin`` as for ``subprocess.run`` (None: this process's own), or ``input`` fed on it."""
    full_env = {**d.env, **(env or {})}
    if fresh or not forkserver.enabled():
        return subprocess.run([sys.executable, "-m", "qwenctl", *args], env=full_env, cwd=cwd,
                              stdin=None if input is not None else stdin, input=input,
                              capture_output=True, timeout=timeout)
    return forkserver.run("qwenctl", list(args), env=full_env, cwd=cwd, stdin=stdin,
                          input=input, timeout=timeout)


def qwenctl(d: HasEnv, *args: str, env: dict[str, str] | None = None,
            cwd: Path | str | None = None, stdin: int | None = None, input: str | None = None,
            timeout: float | None = 30, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """:func:`qwenctl_bytes` with stdout and stderr decoded as ``text=True`` would."""
    r = qwenctl_bytes(d, *args, env=env, cwd=cwd, stdin=stdin,
                      input=None if input is None else input.encode(), timeout=timeout,
                      fresh=fresh)
    return subprocess.CompletedProcess(r.args, r.returncode, _text(r.stdout), _text(r.stderr))


def start_qwenctl(*args: str, env: dict[str, str], cwd: Path | str, stdout: IO[Any],
                  stderr: IO[Any]) -> Any:
    """A long-running ``qwenctl *args`` (the proxy) with stdin on /dev/null: a handle with the
    ``Popen`` methods ``poll``, ``wait``, ``terminate``, ``kill`` and ``returncode``."""
    if not forkserver.enabled():
        return subprocess.Popen([sys.executable, "-m", "qwenctl", *args], env=env,
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd)
    with open(os.devnull, "rb") as devnull:
        return forkserver.zygote().start("qwenctl", list(args), env=env, cwd=os.fspath(cwd),
                                         stdin=devnull.fileno(), stdout=stdout.fileno(),
                                         stderr=stderr.fileno())
