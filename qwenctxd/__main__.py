"""``qwenctxd`` / ``python -m qwenctxd``: run the daemon in the foreground.

Exit codes: 0 after a clean shutdown; 1 when another daemon already serves this socket (or
the daemon crashed); 2 for invalid configuration or an unsafe socket directory (the message
names the file, key or path and the problem). The reason for every non-zero exit is written
to stderr synchronously (:func:`qwenctxd.server.logging.fatal`), so it arrives even when
stderr is a pipe the bounded log writer had queued lines for.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwenctxd", description="qwenctxd context daemon")
    p.add_argument("command", nargs="?", default="serve", choices=["serve"],
                   help="serve (default): run the daemon in the foreground")
    p.add_argument("--socket", help="socket path (default: $QWENCTXD_SOCKET, "
                   "$XDG_RUNTIME_DIR/qwenctxd/qwenctxd.sock, /tmp/qwenctxd-UID/...)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["auto", "json", "console"])
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from qwenctxd import __version__

    if args.version:
        sys.stdout.write(f"qwenctxd {__version__}\n")
        return 0

    from qwenctxd.config import ConfigStore
    from qwenctxd.paths import UnsafeDirectory, check_socket_path_length, socket_path
    from qwenctxd.protocol.errors import ConfigError
    from qwenctxd.server import logging as daemon_logging
    from qwenctxd.server import systemd
    from qwenctxd.server.lock import AlreadyRunning

    daemon_logging.configure(args.log_level or os.environ.get("QWENCTXD_LOG_LEVEL", "info"),
                             args.log_format or "auto")
    store = ConfigStore()
    fatal = daemon_logging.fatal
    try:
        settings = store.load_global()
    except ConfigError as exc:
        fatal("invalid configuration; refusing to start", file=exc.file, key=exc.key,
              problem=exc.problem, message=str(exc))
        return 2
    daemon_logging.configure(args.log_level or settings.daemon.log_level,
                             args.log_format or settings.daemon.log_format)

    activated_fd = systemd.inherited_listener_fd()
    path = socket_path(args.socket or settings.daemon.socket)
    try:
        check_socket_path_length(path)
    except ValueError as exc:
        fatal("bad socket path", message=str(exc))
        return 2

    import faulthandler
    import signal

    import anyio

    from qwenctxd.server import exit_guard
    from qwenctxd.server.app import Daemon

    # `kill -USR1 <pid>` writes every thread's stack to stderr (a daemon that seems stuck)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    daemon = Daemon(store, Path(path), activated_fd=activated_fd)
    backend_options = {"use_uvloop": True} if settings.daemon.uvloop and _has_uvloop() else {}
    try:
        code = anyio.run(daemon.run, backend="asyncio", backend_options=backend_options)
        exit_guard.leave_when_threads_linger(code)
        return code
    except AlreadyRunning as exc:
        fatal("already running", pid=exc.pid, message=str(exc))
        return 1
    except UnsafeDirectory as exc:
        fatal("unsafe socket directory", message=str(exc))
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a crash: its reason must reach stderr like any other exit's
        import traceback

        fatal("daemon crashed", error=f"{type(exc).__name__}: {exc}",
              traceback="".join(traceback.format_exception(exc))[-8000:])
        # a crash skips the services' close: a database thread left open must not keep the
        # process alive (it did: `qwenctl stop` then waited for a daemon that never left)
        exit_guard.leave_when_threads_linger(1)
        return 1


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
