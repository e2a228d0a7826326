"""Where the daemon's files live: socket, pid lock, state dir, config file.

Shared by the daemon and every client so both sides agree on the socket path:
``QWENCTXD_SOCKET`` (or ``--socket``) wins; else ``$XDG_RUNTIME_DIR/qwenctxd/qwenctxd.sock``;
else ``/tmp/qwenctxd-<uid>/qwenctxd.sock``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

SOCKET_NAME = "qwenctxd.sock"
PID_NAME = "qwenctxd.pid"
MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes on Linux, NUL-terminated


class UnsafeDirectory(Exception):
    """The socket directory is owned by someone else or writable by others."""


def socket_path(override: str | os.PathLike[str] | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get("QWENCTXD_SOCKET")
    if env:
        return Path(env).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "qwenctxd" / SOCKET_NAME
    return Path(f"/tmp/qwenctxd-{os.getuid()}") / SOCKET_NAME


def pid_path(sock: Path) -> Path:
    """The pid lock lives beside the socket, so one socket path means one daemon."""
    return sock.parent / PID_NAME


def home(environ: Mapping[str, str] | None = None) -> Path:
    """``$HOME`` (else the password database's idea of it)."""
    env = os.environ if environ is None else environ
    return Path(env.get("HOME") or os.path.expanduser("~"))


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(home() / ".local" / "state")
    return Path(base) / "qwenctxd"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(home() / ".config")
    return Path(base) / "qwenctxd"


def qwen_home(environ: Mapping[str, str] | None = None) -> Path:
    """``~/.qwen`` (``QWEN_HOME`` overrides, as Qwen Code allows): the one place it is
    resolved; the daemon's subsystems get it from their :class:`~qwenctxd.project.Project`."""
    env = os.environ if environ is None else environ
    q = env.get("QWEN_HOME")
    return Path(q).expanduser() if q else home(env) / ".qwen"


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing; refuse it if another user owns it or others can write.

    Raises UnsafeDirectory naming the problem; a directory we own with loose permissions is
    tightened to 0700 (as Watchman does) only when no other user could have written into it.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectory(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run: chmod 0700 {path}"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def check_socket_path_length(path: Path) -> None:
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"socket path is {len(os.fsencode(str(path)))} bytes, over the "
            f"{MAX_SOCKET_PATH_BYTES}-byte limit of AF_UNIX: {path}"
        )


def project_slug(path: str | os.PathLike[str]) -> str:
    """Qwen Code's project id for a directory: every character outside [a-zA-Z0-9] → ``-``."""
    import re

    return re.sub(r"[^a-zA-Z0-9]", "-", os.fspath(path))


def runtime_base_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where Qwen Code keeps runtime output (``QWEN_RUNTIME_DIR``, else ``~/.qwen``)."""
    env = os.environ if environ is None else environ
    runtime = env.get("QWEN_RUNTIME_DIR")
    if runtime:
        return Path(runtime).expanduser()
    return qwen_home(env)


def project_dir(project: str | os.PathLike[str]) -> Path:
    """``<runtime base>/projects/<slug>`` — chats/ and the memory state live below it."""
    return runtime_base_dir() / "projects" / project_slug(project)


SESSION_FILE_RE = re.compile(r"^[0-9a-fA-F-]{32,36}\.jsonl$")
"""A session transcript's file name: ``<session id>.jsonl``."""


def chats_dir(project: str | os.PathLike[str]) -> Path:
    """``<runtime base>/projects/<slug>/chats``: the project's session transcripts (JSONL)."""
    return project_dir(project) / "chats"
