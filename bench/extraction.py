"""Extraction overhead on the turn path: ``session.record_model`` with extraction scheduled.

Issue (extraction): the latency ``session.record_model`` adds when it completes a user-query
turn and schedules the extraction agent (which runs in the background) versus when extraction
is skipped at its gate; goal ≤ 1 ms added at p50.

Two daemons in the same run, each spawned with ``SpawnedDaemon`` in its own scratch HOME, each
with a project ``~/proj`` (a ``.git`` directory):

* A — a model configured (``ScriptedOpenAI`` on loopback). Every extraction-agent request is
  answered after ``EXTRACT_DELAY_S`` with plain text (no tool calls: one model request per run,
  nothing durable), so an extraction is genuinely in flight while we measure; each completed
  user turn calls ``Background.on_turn_complete`` → ``Extractor.schedule`` (gate + submit of a
  keyed job) and the dream gate (which reads meta.json / the lock and is then scan-throttled).
  Jobs coalesce per project: one runs, one waits, a newer submission replaces the waiting one
  — so most ``scheduled: ["extract"]`` replies are absorbed by the queued slot (by design).
* B — NO model: extraction is skipped at the gate (``no_model``) and dream too; the baseline.

The measured loop, identical in A and B, on one connection per daemon: ``session.turn`` kind
user (not timed) → ``session.record_model`` with a final assistant text message, no usage
(timed: client-side round trip) → ``daemon.ping`` (timed: the socket + dispatch floor at the
same moment, showing whether A's background work slows everything or only record_model).
``ROUNDS`` rounds of ``TURNS_PER_ROUND`` turns on a fresh session per daemon per round; A and B
alternate round by round (the order flips every round) so machine noise hits both. A short
untimed warm-up session runs on each daemon first. After the rounds A is drained
(``daemon.drain`` with a timeout) and both daemons are stopped. Reported: p50/p99 of both, the
p50 difference (the verdict), how many A replies said ``scheduled`` contains "extract", the
extraction runs the stub actually served (requests whose system prompt is the extractor's), the
task counters and A's RSS.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import structlog

from bench.common import percentile, save
from qwenctxd.client import Client
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon

ROUNDS = 40
TURNS_PER_ROUND = 15  # 40 × 15 = 600 timed record_model calls per daemon
WARMUP_TURNS = 10
EXTRACT_DELAY_S = 0.2
DRAIN_TIMEOUT_S = 20.0
GOAL_ADDED_P50_MS = 1.0


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def system_of(body: dict[str, Any]) -> str:
    msgs = body.get("messages") or [{}]
    first = msgs[0] if isinstance(msgs[0], dict) else {}
    return str(first.get("content")) if first.get("role") == "system" else ""


def is_extractor(body: dict[str, Any]) -> bool:
    return "memory extractor" in system_of(body)


def make_project(home: Path) -> Path:
    proj = home / "proj"
    (proj / ".git").mkdir(parents=True)
    return proj


class Side:
    """One daemon under test: its client connection and its samples."""

    def __init__(self, name: str, d: SpawnedDaemon, proj: Path) -> None:
        self.name = name
        self.d = d
        self.proj = proj
        self.c: Client | None = None
        self.record_ms: list[float] = []
        self.ping_ms: list[float] = []
        self.replies = 0
        self.scheduled_extract = 0
        self.scheduled_dream = 0
        self.incomplete = 0
        self.extract_in_flight_rounds = 0

    def open(self) -> str:
        assert self.c is not None
        return self.c.call("session.open", {"cwd": str(self.proj), "model": "stub-model",
                                            "window_tokens": 1_000_000})["session_id"]

    def turn(self, sid: str, n: int, *, timed: bool) -> None:
        c = self.c
        assert c is not None
        c.call("session.turn", {"session_id": sid, "kind": "user",
                                "text": f"Question {n}: from now on, prefer pathlib over os.path "
                                        f"in module_{n}.py — and why does its test fail?"})
        t0 = time.perf_counter()
        r = c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"Answer {n}: the fixture path is relative; "
                                            "made it absolute and switched to pathlib."}})
        ms = ms_since(t0)
        t1 = time.perf_counter()
        c.call("daemon.ping")
        ping = ms_since(t1)
        if not timed:
            return
        self.record_ms.append(ms)
        self.ping_ms.append(ping)
        self.replies += 1
        if not r.get("turn_complete"):
            self.incomplete += 1
        sched = r.get("scheduled") or []
        self.scheduled_extract += "extract" in sched
        self.scheduled_dream += "dream" in sched

    def round(self, n_round: int) -> None:
        assert self.c is not None
        sid = self.open()
        for n in range(TURNS_PER_ROUND):
            self.turn(sid, n_round * TURNS_PER_ROUND + n, timed=True)
        bg = self.c.call("daemon.status")["background"]  # untimed: is extraction running now?
        if any(t["kind"] == "extract" for t in bg["in_flight"]):
            self.extract_in_flight_rounds += 1
        self.c.call("session.close", {"session_id": sid})

    def summary(self) -> dict[str, Any]:
        r, p = self.record_ms, self.ping_ms
        return {"calls": len(r), "record_p50_ms": statistics.median(r),
                "record_p90_ms": percentile(r, 0.90), "record_p99_ms": percentile(r, 0.99),
                "record_max_ms": max(r), "record_mean_ms": statistics.fmean(r),
                "ping_p50_ms": statistics.median(p), "ping_p99_ms": percentile(p, 0.99),
                "scheduled_extract": self.scheduled_extract,
                "scheduled_dream": self.scheduled_dream, "incomplete": self.incomplete,
                "extract_in_flight_rounds": self.extract_in_flight_rounds}


def log_problems(d: SpawnedDaemon) -> list[str]:
    return [ln for ln in d.log_text().splitlines()
            if any(f'"level":{sp}"{lv}"' in ln for sp in ("", " ") for lv in ("warning", "error"))]


def run() -> dict[str, Any]:
    def handler(body: dict[str, Any]) -> Reply:
        if is_extractor(body):
            return Reply(content="Nothing durable to save.", delay_s=EXTRACT_DELAY_S)
        return Reply(content="ok", delay_s=EXTRACT_DELAY_S)

    saved_log_config = structlog.get_config()
    # the stub logs every HTTP request at debug level to this process's stdout: keep it quiet
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    stub = ScriptedOpenAI(handler=handler).start()
    da = SpawnedDaemon(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "stub-model",
                            "OPENAI_API_KEY": "bench"})
    db = SpawnedDaemon()
    out: dict[str, Any] = {}
    try:
        a = Side("A", da, make_project(da.home))
        b = Side("B", db, make_project(db.home))
        da.start(timeout=20)
        db.start(timeout=20)
        with da.client() as ca, db.client() as cb:
            a.c, b.c = ca, cb
            model_a = ca.call("daemon.status")["model"]
            model_b = cb.call("daemon.status")["model"]
            for side in (a, b):  # warm-up: first imports, first prompt, first extraction
                sid = side.open()
                for n in range(WARMUP_TURNS):
                    side.turn(sid, n, timed=False)
                (ca if side is a else cb).call("session.close", {"session_id": sid})
            assert ca.call("daemon.drain", {"timeout_s": DRAIN_TIMEOUT_S})["drained"]
            stub.clear_requests()
            bg0 = ca.call("daemon.status")["background"]
            rss_before = ca.call("daemon.status")["rss_bytes"]
            gc.collect()
            gc.freeze()  # keep the harness's own full collections out of the samples
            t0 = time.perf_counter()
            for i in range(ROUNDS):
                for side in ((a, b) if i % 2 == 0 else (b, a)):
                    side.round(i)
            rounds_s = time.perf_counter() - t0
            gc.unfreeze()
            st_a = ca.call("daemon.status")
            t_drain = time.perf_counter()
            drain = ca.call("daemon.drain", {"timeout_s": DRAIN_TIMEOUT_S})
            drain_s = time.perf_counter() - t_drain
            st_a2 = ca.call("daemon.status")
            st_b = cb.call("daemon.status")
            sid = b.open()  # confirm B's gate reason through the socket
            b.turn(sid, 0, timed=False)
            gate_b = cb.call("memory.extract", {"session_id": sid})
        reqs = stub.chat_requests
        extract_runs = sum(is_extractor(r.body) for r in reqs)
        bg1 = st_a2["background"]
        out = {
            "rounds": ROUNDS, "turns_per_round": TURNS_PER_ROUND,
            "extract_delay_s": EXTRACT_DELAY_S, "rounds_wall_s": rounds_s,
            "A": a.summary(), "B": b.summary(),
            "model_a_configured": model_a.get("configured"),
            "model_b_configured": model_b.get("configured"),
            "b_extract_gate": gate_b,
            "stub_chat_requests": len(reqs), "extract_runs": extract_runs,
            "other_model_requests": len(reqs) - extract_runs,
            "tasks_completed": bg1["completed"] - bg0["completed"],
            "tasks_failed": bg1["failed"] - bg0["failed"],
            "tasks_cancelled": bg1["cancelled"] - bg0["cancelled"],
            "a_in_flight_at_end": [t["kind"] for t in st_a["background"]["in_flight"]],
            "a_queued_at_end": st_a["background"]["queued"],
            "drained": drain["drained"], "drain_pending": drain["pending"], "drain_s": drain_s,
            "a_rss_before_mb": rss_before / 1e6, "a_rss_after_mb": st_a["rss_bytes"] / 1e6,
            "a_rss_drained_mb": st_a2["rss_bytes"] / 1e6, "b_rss_mb": st_b["rss_bytes"] / 1e6,
            "log_warnings_a": log_problems(da)[:10], "log_warnings_b": log_problems(db)[:10],
        }
    finally:
        da.cleanup()
        db.cleanup()
        stub.stop()
        structlog.configure(**saved_log_config)
    out["coalesced"] = out["A"]["scheduled_extract"] - out["extract_runs"]
    out["added_p50_ms"] = out["A"]["record_p50_ms"] - out["B"]["record_p50_ms"]
    out["added_p99_ms"] = out["A"]["record_p99_ms"] - out["B"]["record_p99_ms"]
    return out


def main() -> dict[str, Any]:
    t_start = time.perf_counter()
    r = run()
    r["wall_s"] = time.perf_counter() - t_start
    path = save("extraction", r)
    ra, rb = r["A"], r["B"]

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print(f"session.record_model closing a user turn: {ra['calls']} timed calls per daemon "
          f"({ROUNDS} rounds × {TURNS_PER_ROUND}, fresh session per round, A/B alternating); "
          f"A: model configured, extractor replies after {EXTRACT_DELAY_S:g} s; "
          f"B: no model (extraction skipped: no_model)")
    print(f"{'figure':<52}{'value':>10}{'goal':>8}  verdict")
    rows: list[tuple[str, float, str, str]] = [
        ("added by scheduling extraction, p50 (A − B, ms)", r["added_p50_ms"],
         f"≤ {GOAL_ADDED_P50_MS:g}", met(r["added_p50_ms"] <= GOAL_ADDED_P50_MS)),
        ("A record_model p50 (ms)", ra["record_p50_ms"], "", ""),
        ("A record_model p99 (ms)", ra["record_p99_ms"], "", ""),
        ("A record_model max (ms)", ra["record_max_ms"], "", ""),
        ("  baseline: B record_model p50 (ms)", rb["record_p50_ms"], "", ""),
        ("  baseline: B record_model p99 (ms)", rb["record_p99_ms"], "", ""),
        ("  baseline: B record_model max (ms)", rb["record_max_ms"], "", ""),
        ("  added at p99 (A − B, ms)", r["added_p99_ms"], "", ""),
        ("  floor: A daemon.ping p50 (ms)", ra["ping_p50_ms"], "", ""),
        ("  floor: A daemon.ping p99 (ms)", ra["ping_p99_ms"], "", ""),
        ("  floor: B daemon.ping p50 (ms)", rb["ping_p50_ms"], "", ""),
        ("  floor: B daemon.ping p99 (ms)", rb["ping_p99_ms"], "", ""),
    ]
    for name, value, goal, verdict in rows:
        print(f"{name:<52}{value:>10.3f}{goal:>8}  {verdict}")
    print(f"  A replies with scheduled ∋ \"extract\": {ra['scheduled_extract']}/{ra['calls']} "
          f"(\"dream\": {ra['scheduled_dream']}); B: {rb['scheduled_extract']}/{rb['calls']}; "
          f"turn_complete false: A {ra['incomplete']}, B {rb['incomplete']}")
    print(f"  extraction runs actually executed (stub requests with the extractor's system "
          f"prompt): {r['extract_runs']}; coalesced into the queued slot (replaced before running): "
          f"{r['coalesced']};\n  other model requests: {r['other_model_requests']}; A background "
          f"tasks of all kinds (extract, index touches…) completed {r['tasks_completed']}, "
          f"failed {r['tasks_failed']}, cancelled {r['tasks_cancelled']}")
    print(f"  extraction in flight at the end of {ra['extract_in_flight_rounds']}/{ROUNDS} "
          f"A rounds; at the end of timing: in flight {r['a_in_flight_at_end']}, queued "
          f"{r['a_queued_at_end']}; drain → drained={r['drained']} pending="
          f"{r['drain_pending']} in {r['drain_s']:.2f} s")
    print(f"  A RSS: {r['a_rss_before_mb']:.0f} MB before timing, {r['a_rss_after_mb']:.0f} MB "
          f"after, {r['a_rss_drained_mb']:.0f} MB drained; B RSS {r['b_rss_mb']:.0f} MB; "
          f"model configured: A {r['model_a_configured']}, B {r['model_b_configured']}; "
          f"B memory.extract → {r['b_extract_gate']}")
    print(f"  daemon log warnings/errors: A {len(r['log_warnings_a'])}, "
          f"B {len(r['log_warnings_b'])}; timed rounds {r['rounds_wall_s']:.1f} s")
    print("  times are client-side round trips on one connection per daemon; ping follows each "
          "record_model\n  on the same connection (the socket + dispatch floor).")
    print(f"wall time {r['wall_s']:.1f} s")
    print(f"results: {path}")
    return r


if __name__ == "__main__":
    main()
