"""``qwenctl doctor``: one command that says why something does not work.

Checks, each ``ok``, ``warn`` or ``problem``:

* socket — the daemon answers on the socket in use (never auto-started here: a doctor that
  starts what it examines hides the problem);
* service — the systemd user units installed by ``qwenctl install-service``, whether their
  ``ExecStart`` program exists, and ``systemctl --user is-active`` when systemctl is there;
* config — the files in play, and a bad edit the daemon is ignoring;
* model — ``model.probe``: configured or not, where each setting came from (config file /
  environment / settings.json), the endpoint reachable, and which request shapes it accepted;
* inotify — the kernel's watch and instance limits against the daemon's watches;
* memory-modes — memory files and folders others may read (:mod:`qwenctl.modes`; the daemon
  creates them 0600/0700 but never re-modes existing ones silently): ``warn`` with the list,
  and ``--fix-modes`` takes the group/other bits away.

Exit 0 when nothing is a ``problem``, 1 otherwise (3 when the daemon is unreachable); ``--json``
prints ``{checks: [{name, status, summary, details}], problems}``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenctl.context import emit_json, wire
from qwenctl.daemon_link import EXIT_DAEMON_ERROR, EXIT_OK, EXIT_UNREACHABLE, Unreachable
from qwenctxd.client import ClientError, RemoteError
from qwenctxd.paths import socket_path
from qwenctxd.protocol import methods
from qwenctxd.protocol import model as mwire

if TYPE_CHECKING:
    from qwenctl.context import Ctx

INOTIFY_DIR = Path("/proc/sys/fs/inotify")
WATCH_WARN_FRACTION = 0.8


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser("doctor", parents=[common],
                       help="check socket, service, config, model endpoint, inotify limits and memory modes")
    d.add_argument("--probe-timeout", type=float, default=None,
                   help="seconds per model request shape (default: model.timeout_s)")
    d.add_argument("--fix-modes", action="store_true",
                   help="make memory files 0600 and memory folders 0700 (removes group and "
                        "other permissions)")


def _check(name: str, status: str, summary: str, **details: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "summary": summary, "details": details}


# -- the checks -------------------------------------------------------------------------------
def check_socket(ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any] | None]:
    path = socket_path(ctx.args.socket)
    try:
        st = wire(ctx.request(methods.DAEMON_STATUS, autostart=False))
    except Unreachable:
        return _check("socket", "problem", f"no daemon answers at {path}; start it with "
                      "`qwenctxd`, `systemctl --user start qwenctxd` or any qwenctl command",
                      socket=str(path)), None
    state = st.get("state", "?")
    status = "ok" if state == "serving" else "warn"
    return _check("socket", status, f"qwenctxd {st['version']} (pid {st['pid']}) {state} at "
                  f"{path}" + (" [socket-activated]" if st.get("activated") else ""),
                  socket=str(path), pid=st["pid"], state=state), st


def _unit_dir() -> Path:
    from qwenctl import units

    return units.unit_dir()


def check_service() -> dict[str, Any]:
    unit = _unit_dir() / "qwenctxd.service"
    details: dict[str, Any] = {"unit": str(unit), "installed": unit.exists()}
    if not unit.exists():
        return _check("service", "ok", "no systemd user unit installed (optional: "
                      "`qwenctl install-service`)", **details)
    text = unit.read_text(errors="replace")
    m = re.search(r"^ExecStart=(\S+)", text, flags=re.M)
    exe = m.group(1) if m else None
    details["exec_start"] = exe
    active = None
    if shutil.which("systemctl"):
        try:
            out = subprocess.run(["systemctl", "--user", "is-active", "qwenctxd.socket",
                                  "qwenctxd.service"], capture_output=True, text=True,
                                 timeout=5)
            active = out.stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            active = None
    details["active"] = active
    if exe and not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return _check("service", "problem", f"the unit's ExecStart program {exe} is missing; "
                      "rerun `qwenctl install-service` from the installation you use", **details)
    state = f" (socket {active[0]}, service {active[1]})" if active and len(active) == 2 else ""
    return _check("service", "ok", f"unit installed, runs {exe}{state}", **details)


def check_config(st: dict[str, Any]) -> dict[str, Any]:
    cfg = st.get("config") or {}
    files = cfg.get("files") or []
    if cfg.get("last_error"):
        return _check("config", "problem", f"a bad edit is being ignored: {cfg['last_error']}",
                      files=files)
    return _check("config", "ok", f"{len(files)} file(s) in play" +
                  (": " + ", ".join(files) if files else " (defaults and environment only)"),
                  files=files)


def check_model(ctx: Ctx) -> dict[str, Any]:
    probe = ctx.request(methods.MODEL_PROBE, mwire.ProbeParams(timeout_s=ctx.args.probe_timeout),
                        autostart=False)
    p = wire(probe)  # the checks read the wire shape: it is what --json reports
    src = p.get("sources") or {}
    details = {k: p.get(k) for k in ("base_url", "model", "fast_model", "api_key_set",
                                     "reachable", "models")}
    details["sources"] = src
    details["shapes"] = p.get("shapes") or []
    if not p["configured"]:
        missing = [k for k in ("base_url", "model") if not p.get(k)]
        return _check("model", "problem",
                      f"not configured: no {' and no '.join(missing)}; set OPENAI_BASE_URL and "
                      "OPENAI_MODEL (and OPENAI_API_KEY) in the daemon's environment, or "
                      "[model] base_url/model/api_key in config.toml", **details)
    shapes = {s["shape"]: s for s in p.get("shapes") or []}
    accepted = [k for k, s in shapes.items() if s["status"] == "ok"]
    failed = {k: s for k, s in shapes.items() if s["status"] == "failed"}
    # a shape that timed out was not refused: the server is slow or busy (a local model
    # answering someone else), which is worded apart from a real refusal
    slow = [f"{k} ({round(s['ms'] / 1000, 1):g} s)" for k, s in failed.items()
            if s["reason"] == "timeout"]
    refused = [f"{k} ({s['reason']})" for k, s in failed.items() if s["reason"] != "timeout"]
    where = f"{p['base_url']} model {p['model']}"
    details["slots"] = _local_slots(p.get("base_url"))
    if not p["reachable"]:
        chat = shapes.get("chat") or {}
        if chat.get("reason") == "timeout":
            return _check("model", "warn", f"endpoint slow: {where} did not answer within "
                          f"{round((chat.get('ms') or 0) / 1000, 1):g} s (busy, or a slow local model; "
                          "raise --probe-timeout or model.timeout_s)", **details)
        return _check("model", "problem", f"endpoint broken: {where} did not answer "
                      f"({chat.get('reason') or 'unknown'})", **details)
    chat_ok = (shapes.get("chat") or {}).get("status") == "ok"
    json_ok = any((shapes.get(k) or {}).get("status") == "ok"
                  for k in ("json_schema", "json_object"))
    status = "ok" if chat_ok and json_ok else "problem"
    summary = f"{where} answers; accepted: {', '.join(accepted) or 'none'}"
    if refused:
        summary += f"; refused: {', '.join(refused)}"
    if slow:
        summary += f"; slow (no answer in time): {', '.join(slow)}"
    if details["slots"] == 1:
        summary += ("; a one-slot local server: an agent that uses it too waits behind the "
                    "daemon's side queries, so those yield to the agent's own requests and the "
                    "per-turn recall selector stays off for it (memory.recallSelector)")
    chat_slow = (failed.get("chat") or {}).get("reason") == "timeout"
    if chat_slow:
        status = "warn"
        summary += (f"; chat completions did not answer within "
                    f"{round(shapes['chat']['ms'] / 1000, 1):g} s "
                    "(busy, or a slow local model; raise --probe-timeout or model.timeout_s)")
    elif not chat_ok:
        summary += "; plain chat completions fail, so side queries will too"
    elif not json_ok:
        summary += "; no JSON output shape works, so recall and extraction cannot run"
    return _check("model", status, summary, **details)


def _local_slots(base_url: str | None) -> int | None:
    """How many requests a local llama.cpp server runs at once (``/props`` total_slots), or
    None when the endpoint is not on this machine or does not say."""
    from urllib.parse import urlsplit

    import httpx2 as httpx

    if not base_url:
        return None
    parts = urlsplit(base_url)
    if parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        return None
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(root + "/props", timeout=2.0)
        slots = r.json().get("total_slots") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return slots if isinstance(slots, int) else None


def check_inotify(st: dict[str, Any] | None) -> dict[str, Any]:
    limits: dict[str, int | None] = {}
    for name in ("max_user_watches", "max_user_instances", "max_queued_events"):
        try:
            limits[name] = int((INOTIFY_DIR / name).read_text().strip())
        except (OSError, ValueError):
            limits[name] = None
    used = int((st or {}).get("inotify_watches") or 0)
    watches = limits["max_user_watches"]
    details = {**limits, "daemon_watches": used}
    if watches is None:
        return _check("inotify", "warn", "cannot read /proc/sys/fs/inotify limits", **details)
    summary = (f"daemon uses {used} watches; limits: {watches} watches, "
               f"{limits['max_user_instances']} instances per user")
    if used >= watches * WATCH_WARN_FRACTION:
        return _check("inotify", "problem", summary + "; near the limit: raise "
                      "fs.inotify.max_user_watches (sysctl)", **details)
    return _check("inotify", "ok", summary, **details)


# -- the command ------------------------------------------------------------------------------
MARK = {"ok": "ok", "warn": "warn", "problem": "PROBLEM"}


def _print(checks: list[dict[str, Any]]) -> None:
    width = max(len(c["name"]) for c in checks)
    for c in checks:
        sys.stdout.write(f"{MARK[c['status']]:<7}  {c['name']:<{width}}  {c['summary']}\n")
        if c["name"] == "model":
            d = c["details"]
            for key in ("base_url", "model", "fast_model", "api_key"):
                shown = (d.get(key) if key != "api_key" else
                         ("set" if d.get("api_key_set") else "not set"))
                source = (d.get("sources") or {}).get(key) or "unset (default)"
                sys.stdout.write(f"{'':<7}  {'':<{width}}    {key}: {shown or '-'}  "
                                 f"from {source}\n")
            for s in d.get("shapes") or []:
                tail = f" ({s['reason']})" if s.get("reason") else ""
                ms = f" {s['ms']} ms" if s.get("ms") is not None else ""
                sys.stdout.write(f"{'':<7}  {'':<{width}}    {s['shape']}: {s['status']}"
                                 f"{tail}{ms}\n")
        if c["name"] == "memory-modes":
            for item in c["details"].get("loose", [])[:20]:
                sys.stdout.write(f"{'':<7}  {'':<{width}}    {item['mode']} {item['kind']} "
                                 f"{item['path']}\n")


def cmd_doctor(ctx: Ctx) -> int:
    checks: list[dict[str, Any]] = []
    sock, st = check_socket(ctx)
    checks.append(sock)
    checks.append(check_service())
    if st is not None:
        checks.append(check_config(st))
        try:
            checks.append(check_model(ctx))
        except (RemoteError, ClientError, OSError) as exc:
            checks.append(_check("model", "problem", f"model.probe failed: {exc}"))
    checks.append(check_inotify(st))
    from qwenctl.modes import check_memory_modes

    checks.append(check_memory_modes(bool(getattr(ctx.args, "fix_modes", False))))
    problems = [c["name"] for c in checks if c["status"] == "problem"]
    if ctx.args.json:
        emit_json({"checks": checks, "problems": problems})
    else:
        _print(checks)
        sys.stdout.write(f"\n{len(problems)} problem(s)" +
                         (f": {', '.join(problems)}\n" if problems else "\n"))
    if st is None:
        return EXIT_UNREACHABLE
    return EXIT_DAEMON_ERROR if problems else EXIT_OK
