"""Reliability: kill -9 under load (nothing acknowledged is lost), and RSS over a long run.

Issue 19: "N clients × M turns with kill -9 at random moments, counting acknowledged records
against the JSONL, and RSS before/after".

1. Kill run (:func:`kill_run`). A spawned daemon on a scratch HOME, no model configured.
   ``KILL_CLIENTS`` client threads, each with its own connection and session, drive
   ``KILL_TURNS`` rounds of a user ``session.turn`` followed by a ``session.record_model``
   text reply; every text carries a unique marker, and a client remembers the marker of every
   call the daemon acknowledged (answered with a result). ``KILLS`` times, when the count of
   acknowledged calls passes a seeded random point of the run, the daemon gets SIGKILL (within
   20 ms; the clients go on meanwhile at ``KILL_PACE_S`` between calls, so a daemon fast enough
   to finish the run in that time cannot outrun the kill) and is started again on the same tree; each client notices its connection is gone, reconnects,
   re-opens its session with ``session.open {session_id, resume: true}`` and carries on with a
   new user turn (a user turn whose reply was lost is merged by the daemon: that is the
   protocol's rule, and both markers stay in the merged message). At the end the daemon is
   stopped and every session's JSONL is read with the daemon's own readers
   (``records.read_records`` for the raw lines, ``records.resume`` for the history a resume
   rebuilds): every acknowledged marker must be in a decodable record *and* in the resumed
   history. Torn lines are counted (a SIGKILL can cut at most the line being written, one per
   session per kill).
2. Long run (:func:`rss_run`). One daemon, no kills: ``RSS_CLIENTS`` clients × ``RSS_TURNS``
   rounds (the clients keep a ``SessionHistory`` copy and send ``known``, as real clients do),
   two rounds of fresh sessions, each closed at the end. The daemon's RSS
   (``/proc/<pid>/status`` VmRSS) is read idle after a warm-up, with the sessions of round 1
   still open, after they are closed, and after round 2 is closed: growth from round 1 closed
   to round 2 closed is what a leak would show (the same work done again).

Seeded (``SEED``); bounded: every wait has a deadline and the whole bench finishes in well
under 3 minutes on 2 loaded cores. ``python -m bench reliability``; results in
``bench/results/reliability.json``.
"""

from __future__ import annotations

import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench.common import save
from qwenctxd.client import Client
from qwenctxd.client.errors import ClientError, RemoteError
from qwenctxd.client.history import SessionHistory
from qwenctxd.sessions import records
from qwenctxd.testing.spawn import SpawnedDaemon

SEED = 19
KILL_CLIENTS = 16
KILL_TURNS = 40
KILL_PACE_S = 0.005  # between a client's calls while a kill is pending
KILLS = 6
RSS_CLIENTS = 64
RSS_TURNS = 200
RSS_ROUNDS = 2
RECONNECT_DEADLINE_S = 60.0
CALL_TIMEOUT_S = 30.0
MARKER_RE = re.compile(rb"mk[0-9]+c[0-9]+t[0-9]+[ua]")
OPEN_PARAMS = {"model": "bench-model", "window_tokens": 1_000_000}


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def marker(run: int, client: int, turn: int, kind: str) -> str:
    return f"mk{run}c{client}t{turn}{kind}"


# -- 1. kill -9 under load -------------------------------------------------------------------------
@dataclass
class ClientLog:
    """What one client saw: its session, the markers acknowledged, what went wrong."""

    index: int
    session_id: str | None = None
    path: str | None = None
    acked: list[str] = field(default_factory=list)
    reconnects: int = 0
    unacked: int = 0  # calls whose reply never came (the daemon died first)
    errors: list[str] = field(default_factory=list)


class KillRun:
    def __init__(self, daemon: SpawnedDaemon, cwd: Path, clients: int, turns: int, run: int):
        self.daemon = daemon
        self.cwd = cwd
        self.turns = turns
        self.run = run
        self.logs = [ClientLog(i) for i in range(clients)]
        self.acked_total = 0
        self.lock = threading.Lock()
        self.restarted = threading.Condition(self.lock)
        self.generation = 0  # bumped by every restart
        self.done = threading.Event()
        #: a kill point was reached and its kill has not landed yet: the clients go on, at a
        #: slower pace, so a fast daemon cannot finish the run before the killer acts
        self.kill_pending = threading.Event()
        self.killer_errors: list[str] = []

    def _ack(self, log: ClientLog, mark: str) -> None:
        log.acked.append(mark)
        with self.lock:
            self.acked_total += 1

    def _connect(self, log: ClientLog) -> tuple[Client, SessionHistory]:
        """A connection with the client's session open (created the first time, resumed after).
        Retries until the daemon answers (it may be between a kill and its restart)."""
        deadline = time.monotonic() + RECONNECT_DEADLINE_S
        while True:
            try:
                c = Client(self.daemon.socket, timeout=CALL_TIMEOUT_S)
            except ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
                continue
            try:
                params: dict[str, Any] = {"cwd": str(self.cwd), **OPEN_PARAMS}
                if log.session_id is not None:
                    params.update(session_id=log.session_id, resume=True)
                opened = c.call("session.open", params)
            except RemoteError:
                c.close()
                raise
            except (ClientError, OSError):
                c.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
                continue
            log.session_id = opened["session_id"]
            log.path = opened["path"]
            return c, SessionHistory(log.session_id)

    def client_main(self, log: ClientLog) -> None:
        try:
            self._drive(log)
        except Exception as exc:  # reported, and fails the run
            log.errors.append(f"{type(exc).__name__}: {exc}")

    def _drive(self, log: ClientLog) -> None:
        c, hist = self._connect(log)
        turn = 0
        step = "user"
        while turn < self.turns:
            if self.kill_pending.is_set():
                time.sleep(KILL_PACE_S)
            kind = "u" if step == "user" else "a"
            mark = marker(self.run, log.index, turn, kind)
            try:
                if step == "user":
                    hist.turn(c, {"kind": "user", "text": f"question {mark}: what next?"})
                else:
                    c.call("session.record_model", {"session_id": log.session_id, "message": {
                        "role": "assistant", "content": f"answer {mark}: carry on."}})
            except RemoteError:
                raise
            except (ClientError, OSError):
                log.unacked += 1
                c.close()
                log.reconnects += 1
                c, hist = self._connect(log)
                # a lost reply: start the next round with a user turn (an unanswered user turn
                # before it is merged into it by the daemon)
                turn += 1
                step = "user"
                continue
            self._ack(log, mark)
            if step == "user":
                step = "model"
            else:
                step = "user"
                turn += 1
        c.close()

    def killer_main(self, kills: int, rng: random.Random, kill_log: list[dict[str, Any]]) -> None:
        try:
            self._kill_at_points(kills, rng, kill_log)
        except Exception as exc:  # reported, and fails the run
            self.killer_errors.append(f"{type(exc).__name__}: {str(exc)[:4000]}")

    def _kill_at_points(self, kills: int, rng: random.Random,
                        kill_log: list[dict[str, Any]]) -> None:
        total = len(self.logs) * self.turns * 2
        points = sorted(int(rng.uniform(0.1, 0.85) * total) for _ in range(kills))
        for point in points:
            while not self.done.is_set():
                with self.lock:
                    if self.acked_total >= point:
                        break
                time.sleep(0.002)
            if self.done.is_set():
                return
            self.kill_pending.set()
            time.sleep(rng.uniform(0.0, 0.02))  # a random moment within the ongoing calls
            t0 = time.perf_counter()
            self.daemon.kill9()
            self.kill_pending.clear()
            self.daemon.stop()  # closes the old log handle; the process is gone already
            self.daemon.start(timeout=30)
            kill_log.append({"at_acked": point, "restart_s": round(time.perf_counter() - t0, 3)})


def check_sessions(logs: list[ClientLog]) -> dict[str, Any]:
    """Every acknowledged marker of every client, looked up in its session's JSONL."""
    missing_raw: list[str] = []
    missing_resumed: list[str] = []
    torn: list[dict[str, Any]] = []
    lines = 0
    for log in logs:
        if log.path is None:
            continue
        read = records.read_records(log.path)
        lines += len(read.records) + len(read.torn)
        found: set[bytes] = set()
        for rec in read.records:
            if rec.message is not None:
                found.update(MARKER_RE.findall(msgspec.json.encode(rec.message)))
        state = records.resume(log.path)
        resumed: set[bytes] = set()
        for m in state.messages:
            resumed.update(MARKER_RE.findall(msgspec.json.encode(m)))
        for mark in log.acked:
            if mark.encode() not in found:
                missing_raw.append(mark)
            if mark.encode() not in resumed:
                missing_resumed.append(mark)
        torn += [{"session": log.session_id, "line": t.line_no, "reason": t.reason[:80]}
                 for t in read.torn]
    return {"lines": lines, "missing_in_jsonl": missing_raw,
            "missing_in_resumed_history": missing_resumed, "torn_lines": torn}


def kill_run(clients: int = KILL_CLIENTS, turns: int = KILL_TURNS, kills: int = KILLS,
             seed: int = SEED) -> dict[str, Any]:
    """The kill -9 run; returns the figures (see the module docstring)."""
    rng = random.Random(seed)
    d = SpawnedDaemon()
    try:
        cwd = d.home / "proj"
        (cwd / ".git").mkdir(parents=True)
        d.start(timeout=30)
        run = KillRun(d, cwd, clients, turns, run=seed)
        kill_log: list[dict[str, Any]] = []
        threads = [threading.Thread(target=run.client_main, args=(log,), daemon=True)
                   for log in run.logs]
        killer = threading.Thread(target=run.killer_main, args=(kills, rng, kill_log),
                                  daemon=True)
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        killer.start()
        for t in threads:
            t.join(timeout=150)
        run.done.set()
        killer.join(timeout=60)
        wall = time.perf_counter() - t0
        hung = sum(t.is_alive() for t in threads)
        d.stop()
        check = check_sessions(run.logs)
        acked = sum(len(log.acked) for log in run.logs)
        lost = len(check["missing_in_jsonl"])
        return {
            "clients": clients, "turns": turns, "seed": seed,
            "kills_planned": kills, "kills": len(kill_log), "kill_log": kill_log,
            "acknowledged": acked, "found_in_jsonl": acked - lost,
            "found_ratio": round((acked - lost) / acked, 6) if acked else None,
            "missing_in_jsonl": check["missing_in_jsonl"][:20],
            "missing_in_resumed_history": check["missing_in_resumed_history"][:20],
            "lost": lost, "lost_in_resume": len(check["missing_in_resumed_history"]),
            "unacknowledged_calls": sum(log.unacked for log in run.logs),
            "reconnects": sum(log.reconnects for log in run.logs),
            "jsonl_lines": check["lines"], "torn_lines": check["torn_lines"],
            "client_errors": [e for log in run.logs for e in log.errors][:20],
            "killer_errors": run.killer_errors,
            "hung_clients": hung, "wall_s": round(wall, 2),
        }
    finally:
        d.cleanup()


# -- 2. RSS over a long run --------------------------------------------------------------------
def _long_client(sock: Path, cwd: Path, index: int, turns: int, run: int,
                 errors: list[str]) -> str | None:
    try:
        with Client(sock, timeout=CALL_TIMEOUT_S) as c:
            sid = c.call("session.open", {"cwd": str(cwd), **OPEN_PARAMS})["session_id"]
            hist = SessionHistory(sid)
            for t in range(turns):
                hist.turn(c, {"kind": "user", "text": f"question {marker(run, index, t, 'u')}"})
                c.call("session.record_model", {"session_id": sid, "message": {
                    "role": "assistant", "content": f"answer {marker(run, index, t, 'a')}"}})
            if len(hist.messages) != 2 * turns - 1:
                errors.append(f"client {index}: history {len(hist.messages)} != {2 * turns - 1}")
            return sid
    except Exception as exc:
        errors.append(f"client {index}: {type(exc).__name__}: {exc}")
        return None


def rss_run(clients: int = RSS_CLIENTS, turns: int = RSS_TURNS,
            rounds: int = RSS_ROUNDS) -> dict[str, Any]:
    d = SpawnedDaemon()
    try:
        cwd = d.home / "proj"
        (cwd / ".git").mkdir(parents=True)
        d.start(timeout=30)
        assert d.proc is not None
        pid = d.proc.pid
        errors: list[str] = []
        _long_client(d.socket, cwd, 9999, 5, 0, errors)  # warm-up: first imports, first prompt
        rss: dict[str, int] = {"idle_after_warmup_kib": vm_rss_kib(pid)}
        t0 = time.perf_counter()
        for r in range(1, rounds + 1):
            sids: list[str | None] = [None] * clients

            def one(i: int, r: int = r, sids: list[str | None] = sids) -> None:
                sids[i] = _long_client(d.socket, cwd, i, turns, r, errors)

            threads = [threading.Thread(target=one, args=(i,), daemon=True)
                       for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=240)
            rss[f"round{r}_sessions_open_kib"] = vm_rss_kib(pid)
            with Client(d.socket, timeout=CALL_TIMEOUT_S) as c:
                for sid in sids:
                    if sid is not None:
                        c.call("session.close", {"session_id": sid})
            rss[f"round{r}_closed_kib"] = vm_rss_kib(pid)
        wall = time.perf_counter() - t0
        calls = rounds * clients * turns * 2
        last = rss[f"round{rounds}_closed_kib"]
        return {
            "clients": clients, "turns": turns, "rounds": rounds, "calls": calls,
            "wall_s": round(wall, 2), "calls_per_s": round(calls / wall, 1),
            "rss_kib": rss,
            "end_over_start": round(last / rss["idle_after_warmup_kib"], 3),
            "round2_over_round1_closed": round(last / rss["round1_closed_kib"], 3)
            if rounds >= 2 else None,
            "errors": errors[:20],
        }
    finally:
        d.cleanup()


def main() -> None:
    kr = kill_run()
    print(f"kill run: {kr['clients']} clients × {kr['turns']} rounds, {kr['kills']} × kill -9 "
          f"in {kr['wall_s']} s; acknowledged {kr['acknowledged']}, found in the JSONL "
          f"{kr['found_in_jsonl']} (ratio {kr['found_ratio']}), missing from the resumed "
          f"history {kr['lost_in_resume']}; {kr['unacknowledged_calls']} calls unanswered "
          f"(daemon died first), {kr['reconnects']} reconnects, torn lines "
          f"{len(kr['torn_lines'])} of {kr['jsonl_lines']}; client errors "
          f"{len(kr['client_errors'])}, hung {kr['hung_clients']}")
    for e in kr["client_errors"][:5]:
        print(f"  client error: {e}")
    rr = rss_run()
    rss = rr["rss_kib"]
    print(f"long run: {rr['clients']} clients × {rr['turns']} rounds × {rr['rounds']} "
          f"(no kills, {rr['calls']} calls in {rr['wall_s']} s, {rr['calls_per_s']}/s); RSS "
          + ", ".join(f"{k.removesuffix('_kib')} {v / 1024:.1f} MiB" for k, v in rss.items())
          + f"; end/start {rr['end_over_start']}×, round 2 closed / round 1 closed "
          f"{rr['round2_over_round1_closed']}×; errors {len(rr['errors'])}")
    ok = (kr["lost"] == 0 and kr["lost_in_resume"] == 0 and not kr["client_errors"]
          and kr["hung_clients"] == 0 and kr["kills"] == kr["kills_planned"]
          and not rr["errors"])
    print(f"verdict: {'PASS' if ok else 'FAIL'} (nothing acknowledged lost across "
          f"{kr['kills']} kills; RSS figures above)")
    path = save("reliability", {"kill_run": kr, "rss_run": rr, "pass": ok})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
