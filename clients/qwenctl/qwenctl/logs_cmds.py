"""``qwenctl logs``: the log of a daemon qwenctl auto-started.

That daemon writes JSON lines to ``$XDG_STATE_HOME/qwenctxd/qwenctxd.log`` (rotated to
``qwenctxd.log.1`` at 8 MiB when the next daemon starts). ``logs`` prints the last ``-n`` events
one per line — time, level, event, then its fields — or the raw JSON lines with ``--json``;
``--follow`` keeps printing new ones (and follows a rotation) until Ctrl-C. A daemon run by
systemd logs to the journal instead (``journalctl --user -u qwenctxd``); ``make run`` logs to
its terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from qwenctl.daemon_link import EXIT_DAEMON_ERROR, EXIT_OK, log_path

if TYPE_CHECKING:
    from qwenctl.context import Ctx

_FIRST = ("timestamp", "level", "event")
FOLLOW_POLL_S = 0.25


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    lg = sub.add_parser("logs", parents=[common],
                        help="the last events of an auto-started daemon's log (--follow)")
    lg.add_argument("-n", "--lines", type=int, default=40, metavar="N",
                    help="how many of the last events (default 40)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new events")


def tail_lines(path: Path, n: int, block: int = 64 * 1024) -> list[str]:
    """The last ``n`` complete lines of ``path`` without reading the whole file."""
    if n <= 0:
        return []
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        pos = end
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-n:]


def human(line: str) -> str:
    """``2026-11-30 07:16:26  info     request  method=session.turn duration_ms=1.6`` — a line
    that is not a JSON object (a crash before logging was set up) comes back unchanged."""
    import json  # lazily: qwenctl's start-up imports only what every command needs

    try:
        ev = json.loads(line)
    except ValueError:
        return line
    if not isinstance(ev, dict):
        return line
    stamp = str(ev.get("timestamp", "")).replace("T", " ")[:19]
    head = f"{stamp}  {str(ev.get('level', '-')):<8} {ev.get('event', '-')}"
    rest = []
    for key, value in ev.items():
        if key in _FIRST or value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if "\n" in text:  # an exception: print it under the line
            rest.append(f"{key}=\n{text.rstrip()}")
        else:
            rest.append(f"{key}={text}")
    return head + ("  " + " ".join(rest) if rest else "")


def _emit(lines: list[str], raw: bool, out: TextIO) -> None:
    for line in lines:
        if line.strip():
            out.write((line if raw else human(line)) + "\n")
    out.flush()


def _follow(path: Path, raw: bool, out: TextIO) -> None:
    f = open(path, "rb")  # noqa: SIM115 - reopened on rotation
    f.seek(0, os.SEEK_END)
    pending = b""
    try:
        while True:
            chunk = f.read()
            if chunk:
                pending += chunk
                *done, pending = pending.split(b"\n")
                _emit([d.decode("utf-8", "replace") for d in done], raw, out)
                continue
            time.sleep(FOLLOW_POLL_S)
            try:
                rotated = os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                continue
            if rotated or os.stat(path).st_size < f.tell():
                f.close()
                f = open(path, "rb")  # noqa: SIM115
    finally:
        f.close()


def cmd_logs(ctx: Ctx) -> int:
    path = log_path()
    raw = bool(ctx.args.json)
    if not path.exists():
        sys.stderr.write(
            f"qwenctl: no log at {path}: only a daemon qwenctl auto-started writes one. "
            "Under systemd: journalctl --user -u qwenctxd\n")
        return EXIT_DAEMON_ERROR
    _emit(tail_lines(path, ctx.args.lines), raw, sys.stdout)
    if ctx.args.follow:
        _follow(path, raw, sys.stdout)
    return EXIT_OK
