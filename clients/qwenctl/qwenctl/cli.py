"""qwenctl entry point: argument parsing, dispatch to commands, exit codes.

Exit codes: 0 ok; 1 the daemon answered with an error (its message is printed); 2 usage;
3 the daemon is unreachable (a one-line message says how to start it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from qwenctl import (
    compress_cmds,
    context_cmds,
    doctor_cmds,
    instructions_cmds,
    logs_cmds,
    mcp_server,
    memory_cmds,
    render,
    rpc_cmds,
    session_cmds,
    skills_cmds,
)
from qwenctl.context import Ctx, emit_json
from qwenctl.daemon_link import (
    EXIT_DAEMON_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Unreachable,
)
from qwenctl.proxy import command as proxy_cmd
from qwenctxd.client import Client, ClientError, RemoteError
from qwenctxd.client.errors import Busy
from qwenctxd.paths import socket_path
from qwenctxd.protocol import daemon as dwire
from qwenctxd.protocol import methods


# -- commands --------------------------------------------------------------------------------
def cmd_status(ctx: Ctx) -> int:
    st = ctx.request(methods.DAEMON_STATUS)
    if ctx.args.json:
        emit_json(st)
    else:
        render.status(st)
    return EXIT_OK


def cmd_drain(ctx: Ctx) -> int:
    deadline = time.monotonic() + ctx.args.drain_timeout
    last = None
    while True:
        left = max(0.0, deadline - time.monotonic())
        res = ctx.request(methods.DAEMON_DRAIN, dwire.DrainParams(timeout_s=min(0.5, left)),
                          autostart=False)
        if not ctx.args.json and res.pending != last and not res.drained:
            bg = ctx.request(methods.DAEMON_STATUS, autostart=False).background
            kinds = ", ".join(t.kind for t in bg.in_flight) or "-"
            sys.stdout.write(f"waiting: {res.pending} pending (running: {kinds})\n")
            sys.stdout.flush()
            last = res.pending
        if res.drained or left <= 0:
            break
    if ctx.args.json:
        emit_json(res)
    elif res.drained:
        sys.stdout.write("drained: no background work pending\n")
    else:
        sys.stdout.write(f"timed out: {res.pending} background job(s) still pending\n")
    return EXIT_OK if res.drained else EXIT_DAEMON_ERROR


def cmd_stop(ctx: Ctx) -> int:
    client = ctx.client(autostart=False)
    pid = client.request(methods.DAEMON_STATUS).pid
    client.request(methods.DAEMON_SHUTDOWN, dwire.ShutdownParams(
        drain=not ctx.args.no_drain, timeout_s=ctx.args.stop_timeout))
    client.close()
    # while it drains the daemon still answers daemon.status: show progress until it is gone
    last: tuple[int, str] | None = None
    while True:
        try:
            with Client(ctx.args.socket, timeout=5) as probe:
                st = probe.request(methods.DAEMON_STATUS)
        except (ClientError, OSError):
            break
        if st.pid != pid:
            break
        bg = st.background
        pending = len(bg.in_flight) + bg.queued
        kinds = ", ".join(t.kind for t in bg.in_flight) or "-"
        if not ctx.args.json and (pending, kinds) != last:
            sys.stdout.write(f"stopping: {st.state}, {pending} background job(s) pending "
                             f"(running: {kinds})\n")
            sys.stdout.flush()
            last = (pending, kinds)
        time.sleep(0.25)
    deadline = time.monotonic() + 15  # the socket is gone; wait for the process to exit
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break  # exited; its parent has not reaped it yet
        except (OSError, IndexError):
            break
        time.sleep(0.05)
    if ctx.args.json:
        emit_json({"stopped": True, "pid": pid})
    else:
        sys.stdout.write(f"qwenctxd (pid {pid}) stopped\n")
    return EXIT_OK


def cmd_socket(ctx: Ctx) -> int:
    path = str(socket_path(ctx.args.socket))
    if ctx.args.json:
        emit_json({"socket": path})
    else:
        sys.stdout.write(path + "\n")
    return EXIT_OK


def cmd_install_service(ctx: Ctx) -> int:
    from pathlib import Path

    from qwenctl import units

    written = units.install(Path(ctx.args.dir) if ctx.args.dir else None)
    if ctx.args.json:
        emit_json({"written": [str(p) for p in written], "next": list(units.SYSTEMCTL_LINES)})
        return EXIT_OK
    for p in written:
        sys.stdout.write(f"wrote {p}\n")
    sys.stdout.write("\nthen run:\n" + "".join(f"  {line}\n" for line in units.SYSTEMCTL_LINES))
    return EXIT_OK


COMMANDS: dict[str, Callable[[Ctx], int]] = {
    "status": cmd_status,
    "drain": cmd_drain,
    "stop": cmd_stop,
    "socket": cmd_socket,
    "install-service": cmd_install_service,
    "prompt": instructions_cmds.cmd_prompt,
    "instructions": instructions_cmds.cmd_instructions,
    "sessions": session_cmds.cmd_sessions,
    "skills": skills_cmds.cmd_skills,
    "memory": memory_cmds.cmd_memory,
    "context": context_cmds.cmd_context,
    "compress": compress_cmds.cmd_compress,
    "doctor": doctor_cmds.cmd_doctor,
    "logs": logs_cmds.cmd_logs,
    "methods": rpc_cmds.cmd_methods,
    "call": rpc_cmds.cmd_call,
    "mcp": mcp_server.cmd_mcp,
    "proxy": proxy_cmd.cmd_proxy,
}


def _common(sub: bool) -> argparse.ArgumentParser:
    """Global options, accepted before or after the command (``qwenctl status --json``)."""
    c = argparse.ArgumentParser(add_help=False)
    d = (lambda v: argparse.SUPPRESS) if sub else (lambda v: v)
    c.add_argument("--socket", default=d(None), help="daemon socket path (default: "
                   "$QWENCTXD_SOCKET or $XDG_RUNTIME_DIR/qwenctxd/qwenctxd.sock)")
    c.add_argument("--json", action="store_true", default=d(False),
                   help="machine-readable output")
    c.add_argument("--no-autostart", action="store_true", default=d(False),
                   help="do not start the daemon when none answers")
    c.add_argument("--reply-timeout", dest="timeout", type=float, default=d(60.0),
                   help="seconds to wait for a reply (default 60)")
    return c


def build_parser() -> argparse.ArgumentParser:
    common = _common(sub=True)
    p = argparse.ArgumentParser(prog="qwenctl", description="Control and inspect qwenctxd.",
                                parents=[_common(sub=False)])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="daemon state, sessions, background work")
    d = sub.add_parser("drain", parents=[common], help="wait until background work has landed")
    d.add_argument("--timeout", dest="drain_timeout", type=float, default=60.0,
                   help="give up after this many seconds (default 60)")
    s = sub.add_parser("stop", parents=[common], help="drain and stop the daemon")
    s.add_argument("--no-drain", action="store_true", help="cancel background work at once")
    s.add_argument("--drain-timeout", dest="stop_timeout", type=float, default=None)
    sub.add_parser("socket", parents=[common], help="print the socket path in use")
    i = sub.add_parser("install-service", parents=[common],
                       help="write systemd user units and print the systemctl lines")
    i.add_argument("--dir", help="target directory (default ~/.config/systemd/user)")
    pr = sub.add_parser("prompt", parents=[common],
                        help="print the system prompt for a directory (summary on stderr)")
    pr.add_argument("--cwd", help="working directory (default: the current one)")
    pr.add_argument("--model", help="model name the prompt is built for")
    pr.add_argument("--append", help="text appended behind the --- separator")
    pr.add_argument("--mode", choices=instructions_cmds.MODES, default=None,
                    help="interaction mode (default interactive)")
    ins = sub.add_parser("instructions", parents=[common],
                         help="instruction files, imports, rules and problems for a directory")
    ins.add_argument("--cwd", help="working directory (default: the current one)")
    session_cmds.add_parser(sub, common)
    skills_cmds.add_parser(sub, common)
    memory_cmds.add_parser(sub, common)
    context_cmds.add_parser(sub, common)
    compress_cmds.add_parser(sub, common)
    doctor_cmds.add_parser(sub, common)
    rpc_cmds.add_parser(sub, common)
    logs_cmds.add_parser(sub, common)
    mcp_server.add_parser(sub, common)
    proxy_cmd.add_parser(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    if not args.command:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    ctx = Ctx(args)
    try:
        return COMMANDS[args.command](ctx)
    except Unreachable as exc:
        sys.stderr.write(f"qwenctl: {exc}\n")
        return EXIT_UNREACHABLE
    except Busy as exc:
        sys.stderr.write("qwenctl: the daemon is busy (too many connections); try again\n")
        if args.json:
            emit_json({"error": {"code": exc.code, "message": exc.message, "data": exc.data}})
        return EXIT_DAEMON_ERROR
    except RemoteError as exc:
        sys.stderr.write(f"qwenctl: daemon error {exc.code}: {exc.message}\n")
        if args.json:
            emit_json({"error": {"code": exc.code, "message": exc.message, "data": exc.data}})
        return EXIT_DAEMON_ERROR
    except (ClientError, OSError) as exc:
        sys.stderr.write(f"qwenctl: lost the daemon: {exc}\n")
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return 130
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
