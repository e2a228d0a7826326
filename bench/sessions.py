"""Sessions: warm ``session.turn``, micro-compaction of a long history, resume of a big JSONL.

Issue (sessions): warm ``session.turn`` (200-message history, no model call) p50 ≤ 2 ms and
p99 ≤ 10 ms; micro-compaction of a 10 000-message history ≤ 20 ms; resume of a 100 000-record
JSONL ≤ 1.5 s with peak RSS ≤ 3× the file size. SPEC: the warm turn has cached instructions
(a QWEN.md tree) and no model.

1. Warm turn, through the socket (sync ``Client``, client-side round trip of ``session.turn``
   alone). A daemon with no model configured; ``~/proj`` has a ``.git`` directory and QWEN.md
   files at the root and in the cwd ``~/proj/pkg`` (plus ``~/.qwen/QWEN.md``); two tool
   declarations; window 1 000 000 so nothing compacts. Each session is built to 200 messages
   through the socket (50 × user turn → reply with a read_file call → ~1 KB tool result →
   text reply), every reply carrying API usage (the figure the daemon just estimated, so the
   count is API-anchored). Measured loop: user turn (timed) → text reply with usage (not
   timed) → ``daemon.ping`` (timed: the baseline, same connection, same moment).
   Because every turn adds two messages, the headline figure re-opens fresh sessions in rounds
   (``ROUNDS`` sessions × ``TURNS_PER_ROUND`` turns: the history is 200…238 messages when
   timed); a separate series keeps one session growing for ``GROW_TURNS`` turns (200 → 2 200
   messages) to show how the per-turn cost scales with history length.
2. Micro-compaction, in-process: ``micro_compact(keep=5, trigger="force")`` on a 10 000-message
   history (2 KB tool results, data-URL images in user messages and inside screenshot tool
   results, reasoning on every assistant message), median of ``MICRO_RUNS`` on the same
   uncompacted input (the function is pure; checked). Baseline: a plain loop that only does
   the unavoidable part of the job (copy the list, replace all but the last 5 tool contents
   with the placeholder on shallow copies) — no token accounting, no media, no read-path
   eviction: the floor any implementation pays. ``copy.deepcopy`` is shown for context only
   (it does not do the job, and it shares the big strings anyway).
3. Resume: a 100 000-record JSONL of ~1 KB ChatRecords (user / assistant with tool_calls /
   tool_result / assistant text with usage), written with msgspec in Qwen Code's format (Gemini
   Content payloads, ``usageMetadata``) as the daemon writes them, so ``resume`` pays the
   conversion back to OpenAI messages. Each measurement runs in a
   FRESH interpreter (``RESUME_RUNS`` each, alternating): ``records.resume(path)`` vs the stdlib
   baseline ``json.loads`` per line keeping the message dicts. Wall time of the call only
   (not interpreter start-up), peak RSS from ``ru_maxrss`` (whole process, interpreter
   included — the verdict uses it) and the growth over the RSS before the call.
"""

from __future__ import annotations

import ast
import base64
import copy
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from bench.common import percentile, save
from qwenctxd.client import Client
from qwenctxd.compaction.micro import CLEARED_TOOL_RESULT, micro_compact
from qwenctxd.sessions import gemini_format
from qwenctxd.sessions.records import ChatRecord
from qwenctxd.testing.spawn import SpawnedDaemon

HISTORY_CYCLES = 50  # × 4 messages = 200
ROUNDS = 50
TURNS_PER_ROUND = 20  # 50 × 20 = 1 000 timed turns at 200…238 messages
GROW_TURNS = 1000
GROW_BUCKET = 100
MICRO_MESSAGES = 10_000
MICRO_RUNS = 25
DEEPCOPY_RUNS = 5
RESUME_RECORDS = 100_000
RESUME_RUNS = 3
GOAL_TURN_P50_MS = 2.0
GOAL_TURN_P99_MS = 10.0
GOAL_MICRO_MS = 20.0
GOAL_RESUME_S = 1.5
GOAL_RSS_X = 3.0

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file from the workspace.",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}},
                       "required": ["file_path"]}}},
    {"type": "function", "function": {
        "name": "run_shell_command", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
]
CODE_LINE = "    total += compute(item, factor=3)  # keep it short\n"  # 52 chars


def code_blob(chars: int) -> str:
    return (CODE_LINE * (chars // len(CODE_LINE) + 1))[:chars]


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


# -- 1. warm session.turn through the socket -----------------------------------------------------
def make_project(home: Path) -> Path:
    proj = home / "proj"
    cwd = proj / "pkg"
    (proj / ".git").mkdir(parents=True)
    cwd.mkdir()
    (home / ".qwen").mkdir()
    (home / ".qwen" / "QWEN.md").write_text("# Global\n\n- Prefer small, reviewable diffs.\n" * 20)
    (proj / "QWEN.md").write_text("# Project\n\n- Run `make test` before finishing.\n" * 30)
    (cwd / "QWEN.md").write_text("# Package\n\n- Public functions need docstrings.\n" * 30)
    return cwd


def build_history(c: Client, sid: str) -> dict[str, Any]:
    """50 tool-using cycles = 200 messages; every reply carries usage (API-anchored count)."""
    p: dict[str, Any] = {}
    for i in range(HISTORY_CYCLES):
        p = c.call("session.turn", {"session_id": sid, "kind": "user",
                                    "text": f"Question {i}: why does module_{i}.py fail its test?"})
        call_id = f"call_{sid[:8]}_{i}"
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function", "function": {
                    "name": "read_file",
                    "arguments": json.dumps({"file_path": f"/src/pkg/module_{i}.py"})}}]},
            "usage": {"prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 30}})
        p = c.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": call_id, "name": "read_file", "content": code_blob(1024)}]})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": f"module_{i}.py divides by zero on empty input; "
                                            "guard it and add a test."},
            "usage": {"prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 40}})
    return p


def timed_turn(c: Client, sid: str, n: int) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    p = c.call("session.turn", {"session_id": sid, "kind": "user",
                                "text": f"Follow-up {n}: and what about the edge case?"})
    ms = ms_since(t0)
    c.call("session.record_model", {"session_id": sid, "message": {
        "role": "assistant", "content": f"Answer {n}: covered by the new guard."},
        "usage": {"prompt_tokens": p["usage"]["prompt_tokens"], "completion_tokens": 12}})
    return ms, p


def timed_ping(c: Client) -> float:
    t0 = time.perf_counter()
    c.call("daemon.ping")
    return ms_since(t0)


def check_prompt(p: dict[str, Any], problems: list[str]) -> None:
    if p["events"]:
        problems.append(f"events on a warm turn: {p['events'][:2]}")
    if not p["usage"]["anchored"] or p["usage"]["level"] != "ok":
        problems.append(f"usage not anchored/ok: {p['usage']}")


def warm_turns() -> dict[str, Any]:
    d = SpawnedDaemon()
    problems: list[str] = []
    try:
        cwd = make_project(d.home)
        d.start(timeout=20)
        opened = {"cwd": str(cwd), "model": "bench-model", "window_tokens": 1_000_000,
                  "tools": TOOLS}
        turn_ms: list[float] = []
        ping_ms: list[float] = []
        hist_len: list[int] = []
        # this process imported far more than a client needs (spawn, compaction, …); without
        # freezing them a full collection of its own heap costs ~4 ms and lands in the turn
        # figure now and then. Freeze the harness so the client's GC is a thin client's.
        gc.collect()
        gc.freeze()
        gen2_before = gc.get_stats()[2]["collections"]
        with d.client() as c:
            # warm-up session (untimed): first imports, first system prompt
            sid = c.call("session.open", opened)["session_id"]
            build_history(c, sid)
            for n in range(TURNS_PER_ROUND):
                timed_turn(c, sid, n)
                timed_ping(c)
            c.call("session.close", {"session_id": sid})
            rebuilds0 = c.call("daemon.status")["counters"].get("instructions_rebuilds", 0)
            t_rounds = time.perf_counter()
            for _ in range(ROUNDS):
                sid = c.call("session.open", opened)["session_id"]
                p = build_history(c, sid)
                if len(p["messages"]) != 4 * HISTORY_CYCLES - 1:
                    problems.append(f"built {len(p['messages'])} messages")
                for n in range(TURNS_PER_ROUND):
                    ms, p = timed_turn(c, sid, n)
                    turn_ms.append(ms)
                    hist_len.append(len(p["messages"]))
                    ping_ms.append(timed_ping(c))
                check_prompt(p, problems)
                c.call("session.close", {"session_id": sid})
            rounds_s = time.perf_counter() - t_rounds
            system_chars = len(p["system"])
            # the payload: what the client has to decode per turn at ~200 messages
            body = msgspec.json.encode(p)
            decode_ms = []
            for _ in range(200):
                t0 = time.perf_counter()
                msgspec.json.decode(body)
                decode_ms.append(ms_since(t0))
            # growing history: one session, GROW_TURNS turns on top of the 200 messages
            sid = c.call("session.open", opened)["session_id"]
            build_history(c, sid)
            grow: list[tuple[int, float]] = []
            for n in range(GROW_TURNS):
                ms, p = timed_turn(c, sid, n)
                grow.append((len(p["messages"]), ms))
            check_prompt(p, problems)
            grow_body = len(msgspec.json.encode(p))
            c.call("session.close", {"session_id": sid})
            status = c.call("daemon.status")
            client_gen2 = gc.get_stats()[2]["collections"] - gen2_before
            rebuilds1 = status["counters"].get("instructions_rebuilds", 0)
        log_problems = [ln for ln in d.log_text().splitlines()
                        if any(f'"level":{sp}"{lv}"' in ln for sp in ("", " ")
                               for lv in ("warning", "error"))]
    finally:
        gc.unfreeze()
        d.cleanup()
    first = [ms for _, ms in grow[:GROW_BUCKET]]
    last = [ms for _, ms in grow[-GROW_BUCKET:]]
    xs = [float(n) for n, _ in grow]
    ys = [ms for _, ms in grow]
    slope = statistics.linear_regression(xs, ys).slope  # ms per message
    return {
        "turns": len(turn_ms), "rounds": ROUNDS, "turns_per_round": TURNS_PER_ROUND,
        "history_messages_min": min(hist_len), "history_messages_max": max(hist_len),
        "turn_p50_ms": statistics.median(turn_ms), "turn_p99_ms": percentile(turn_ms, 0.99),
        "turn_max_ms": max(turn_ms),
        "ping_p50_ms": statistics.median(ping_ms), "ping_p99_ms": percentile(ping_ms, 0.99),
        "response_bytes_200": len(body), "system_chars": system_chars,
        "client_decode_p50_ms": statistics.median(decode_ms),
        "rounds_wall_s": rounds_s,
        "grow_turns": GROW_TURNS, "grow_first_len": grow[0][0], "grow_last_len": grow[-1][0],
        "grow_first_p50_ms": statistics.median(first), "grow_last_p50_ms": statistics.median(last),
        "grow_last_p99_ms": percentile(last, 0.99),
        "grow_slope_us_per_100_msgs": slope * 1000 * 100,
        "grow_response_bytes_last": grow_body,
        "instructions_rebuilds_during_timing": rebuilds1 - rebuilds0,
        "rss_after_mb": status["rss_bytes"] / 1e6, "client_gen2_collections": client_gen2,
        "problems": problems[:10], "daemon_log_warnings": log_problems[:10],
    }


# -- 2. micro-compaction ----------------------------------------------------------------------
def data_url(kb: int, seed: int) -> str:
    raw = bytes((seed * 31 + i * 7) % 256 for i in range(kb * 768))
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def micro_history() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    tools = ["read_file", "run_shell_command", "grep_search", "read_file"]
    image = data_url(8, 1)
    shot = data_url(8, 2)
    for i in range(MICRO_MESSAGES // 4):
        text = f"Step {i}: look at module_{i}.py and tell me what breaks."
        if i % 25 == 0:
            msgs.append({"role": "user", "content": [{"type": "text", "text": text},
                                                      {"type": "image_url",
                                                       "image_url": {"url": image}}]})
        else:
            msgs.append({"role": "user", "content": text})
        name = "browser_screenshot" if i % 50 == 7 else tools[i % len(tools)]
        args = ({"file_path": f"/src/pkg/module_{i}.py"} if name == "read_file"
                else {"command": f"pytest -k case_{i}"} if name == "run_shell_command"
                else {"pattern": f"def f{i}"})
        call_id = f"call_{i}"
        msgs.append({"role": "assistant", "content": None,
                     "reasoning_content": f"I should inspect module {i} first. " * 8,
                     "tool_calls": [{"id": call_id, "type": "function", "function": {
                         "name": name, "arguments": json.dumps(args)}}]})
        if name == "browser_screenshot":
            content: Any = [{"type": "text", "text": "Screenshot of the page."},
                            {"type": "image_url", "image_url": {"url": shot}}]
        elif i % 40 == 3:
            content = "Error: command exited with status 2\n" + code_blob(300)
        else:
            content = code_blob(2048)
        msgs.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
        msgs.append({"role": "assistant", "content": f"Module {i} is fine except for case {i}.",
                     "reasoning_content": f"The output for step {i} shows one failure. " * 6})
    return msgs


def naive_clear(messages: list[dict[str, Any]], keep: int = 5) -> list[dict[str, Any]]:
    """The floor: clear all but the last ``keep`` tool results, copy-on-write, nothing else."""
    tool_idx = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    out = list(messages)
    for i in tool_idx[:-keep]:
        new = dict(messages[i])
        new["content"] = CLEARED_TOOL_RESULT
        out[i] = new
    return out


def time_runs(fn: Any, runs: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(ms_since(t0))
    return out


def micro() -> dict[str, Any]:
    hist = micro_history()
    fingerprint = msgspec.json.encode(hist)
    r = micro_compact(hist, keep=5, trigger="force")
    rs = micro_compact(hist, keep=5, trigger="force", strip_reasoning=True)
    plain = time_runs(lambda: micro_compact(hist, keep=5, trigger="force"), MICRO_RUNS)
    strip = time_runs(lambda: micro_compact(hist, keep=5, trigger="force", strip_reasoning=True),
                      MICRO_RUNS)
    loop = time_runs(lambda: naive_clear(hist), MICRO_RUNS)
    deep = time_runs(lambda: copy.deepcopy(hist), DEEPCOPY_RUNS)
    return {
        "messages": len(hist), "history_bytes": len(fingerprint),
        "input_unchanged": msgspec.json.encode(hist) == fingerprint,
        "cleared": r.cleared, "kept": r.kept, "tokens_saved": r.tokens_saved,
        "reasoning_stripped": rs.reasoning_stripped,
        "evicted_read_paths": len(r.evicted_read_paths),
        "micro_median_ms": statistics.median(plain), "micro_max_ms": max(plain),
        "micro_strip_median_ms": statistics.median(strip), "micro_strip_max_ms": max(strip),
        "naive_loop_median_ms": statistics.median(loop),
        "deepcopy_median_ms": statistics.median(deep), "runs": MICRO_RUNS,
    }


# -- 3. resume ---------------------------------------------------------------------------------
CHILD = r"""
import os, resource, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
mode, path = sys.argv[1], sys.argv[2]
if mode == "resume":
    from qwenctxd.sessions.records import resume
    before = rss()
    t0 = time.perf_counter()
    st = resume(path)
    wall = time.perf_counter() - t0
    n, records, torn, anchor = len(st.messages), st.records, len(st.torn), st.anchor_index
else:
    import json
    before = rss()
    t0 = time.perf_counter()
    messages = []
    records = 0
    with open(path, "rb", buffering=1024 * 1024) as f:
        for line in f:
            rec = json.loads(line)
            records += 1
            if rec.get("type") != "system" and rec.get("message") is not None:
                messages.append(rec["message"])
    wall = time.perf_counter() - t0
    n, torn, anchor = len(messages), 0, None
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(repr({"wall_s": wall, "peak_rss": peak, "rss_before": before, "messages": n,
            "records": records, "torn": torn, "anchor": anchor}))
"""


def write_jsonl(path: Path) -> float:
    enc = msgspec.json.Encoder()
    buf = bytearray()
    sid = str(uuid.uuid4())
    cwd = "/home/user/src/proj"
    parent: str | None = None
    t_base = 1_750_000_000.0
    tool_text = code_blob(1500)
    names: dict[str, str] = {}
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for n in range(RESUME_RECORDS):
            i, kind = divmod(n, 4)
            usage = None
            model = None
            if kind == 0:
                rtype = "user"
                msg: dict[str, Any] = {"role": "user", "content": f"Question {i}: "
                                       + "why does the parser reject this input? " * 7}
            elif kind == 1:
                rtype, model = "assistant", "qwen3-coder-plus"
                msg = {"role": "assistant", "content": None, "tool_calls": [{
                    "id": f"call_{i}", "type": "function", "function": {
                        "name": "read_file",
                        "arguments": json.dumps({"file_path": f"/src/pkg/module_{i}.py"})}}]}
                usage = {"prompt_tokens": 1000 + i * 10, "completion_tokens": 30}
            elif kind == 2:
                rtype = "tool_result"
                msg = {"role": "tool", "tool_call_id": f"call_{i}", "name": "read_file",
                       "content": tool_text}
            else:
                rtype, model = "assistant", "qwen3-coder-plus"
                msg = {"role": "assistant", "content": f"Module {i}: "
                       + "the guard on empty input is missing; add it and a test. " * 6}
                usage = {"prompt_tokens": 1500 + i * 10, "completion_tokens": 90}
            rid = str(uuid.uuid4())
            ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t_base + n))
            enc.encode_into(ChatRecord(uuid=rid, parentUuid=parent, sessionId=sid, timestamp=ts,
                                       type=rtype, cwd=cwd, version="0.1.0",
                                       message=gemini_format.to_content(msg, names),
                                       usageMetadata=gemini_format.to_usage_metadata(usage),
                                       model=model), buf, len(buf))
            buf.extend(b"\n")
            parent = rid
            if len(buf) > 1 << 20:
                f.write(buf)
                buf.clear()
        f.write(buf)
    return time.perf_counter() - t0


def run_child(mode: str, path: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], check=True,
                         capture_output=True, text=True)
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def resume_bench() -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="qcb-resume-", dir="/tmp"))
    path = tmp / f"{uuid.uuid4()}.jsonl"
    try:
        gen_s = write_jsonl(path)
        size = path.stat().st_size
        runs: dict[str, list[dict[str, Any]]] = {"resume": [], "json": []}
        for _ in range(RESUME_RUNS):
            for mode in ("resume", "json"):
                runs[mode].append(run_child(mode, path))
    finally:
        path.unlink(missing_ok=True)
        tmp.rmdir()
    out: dict[str, Any] = {"records": RESUME_RECORDS, "file_bytes": size,
                           "avg_record_bytes": size / RESUME_RECORDS, "generate_s": gen_s,
                           "file_deleted": not path.exists()}
    for mode, rs in runs.items():
        peak = statistics.median(r["peak_rss"] for r in rs)
        before = statistics.median(r["rss_before"] for r in rs)
        out[mode] = {
            "wall_s": [r["wall_s"] for r in rs],
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
            "peak_rss_mb": peak / 1e6, "rss_before_mb": before / 1e6,
            "peak_x_file": peak / size,
            "growth_x_file": statistics.median((r["peak_rss"] - r["rss_before"]) / size
                                               for r in rs),
            "messages": rs[0]["messages"], "records_read": rs[0]["records"],
            "torn": rs[0]["torn"], "anchor_index": rs[0]["anchor"],
        }
    return out


# -- report ------------------------------------------------------------------------------------
def main() -> dict[str, Any]:
    t_start = time.perf_counter()
    warm = warm_turns()
    mic = micro()
    res = resume_bench()
    summary: dict[str, Any] = {"warm_turn": warm, "micro": mic, "resume": res, "wall_s": 0.0}
    summary["wall_s"] = time.perf_counter() - t_start
    path = save("sessions", summary)

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    rv, jv = res["resume"], res["json"]
    print(f"warm session.turn: {warm['turns']} timed turns, fresh session per round "
          f"({ROUNDS} × {TURNS_PER_ROUND}), history {warm['history_messages_min']}–"
          f"{warm['history_messages_max']} messages; cached instructions (3 QWEN.md), "
          f"system {warm['system_chars']} chars, 2 tools, no model")
    print(f"{'figure':<50}{'value':>12}{'goal':>10}  verdict")
    rows: list[tuple[str, float, str, str]] = [
        ("turn p50 (ms)", warm["turn_p50_ms"], f"≤ {GOAL_TURN_P50_MS:g}",
         met(warm["turn_p50_ms"] <= GOAL_TURN_P50_MS)),
        ("turn p99 (ms)", warm["turn_p99_ms"], f"≤ {GOAL_TURN_P99_MS:g}",
         met(warm["turn_p99_ms"] <= GOAL_TURN_P99_MS)),
        ("turn max (ms)", warm["turn_max_ms"], "", ""),
        ("  baseline: daemon.ping p50, same conn (ms)", warm["ping_p50_ms"], "", ""),
        ("  baseline: daemon.ping p99 (ms)", warm["ping_p99_ms"], "", ""),
        ("  response at ~200 msgs (KB)", warm["response_bytes_200"] / 1024, "", ""),
        ("  client msgspec decode of that response p50 (ms)", warm["client_decode_p50_ms"],
         "", ""),
        (f"growing: p50 first {GROW_BUCKET} turns @{warm['grow_first_len']} msgs (ms)",
         warm["grow_first_p50_ms"], "", ""),
        (f"growing: p50 last {GROW_BUCKET} turns @{warm['grow_last_len']} msgs (ms)",
         warm["grow_last_p50_ms"], "", ""),
        ("growing: p99 last 100 turns (ms)", warm["grow_last_p99_ms"], "", ""),
        ("growing: slope (µs per +100 messages)", warm["grow_slope_us_per_100_msgs"], "", ""),
        (f"micro_compact force keep=5, {mic['messages']} msgs, median (ms)",
         mic["micro_median_ms"], f"≤ {GOAL_MICRO_MS:g}", met(mic["micro_median_ms"] <= GOAL_MICRO_MS)),
        ("micro_compact + strip_reasoning, median (ms)", mic["micro_strip_median_ms"],
         f"≤ {GOAL_MICRO_MS:g}", met(mic["micro_strip_median_ms"] <= GOAL_MICRO_MS)),
        ("  baseline: plain clear-all-but-5 loop, median (ms)", mic["naive_loop_median_ms"],
         "", ""),
        ("  context: copy.deepcopy of the history (ms)", mic["deepcopy_median_ms"], "", ""),
        (f"resume {RESUME_RECORDS} records, median of {RESUME_RUNS} (s)", rv["wall_s_median"],
         f"≤ {GOAL_RESUME_S:g}", met(rv["wall_s_median"] <= GOAL_RESUME_S)),
        ("resume peak RSS (MB)", rv["peak_rss_mb"], "", ""),
        ("resume peak RSS / file size (×)", rv["peak_x_file"], f"≤ {GOAL_RSS_X:g}",
         met(rv["peak_x_file"] <= GOAL_RSS_X)),
        ("  resume RSS growth over pre-call / file (×)", rv["growth_x_file"], "", ""),
        ("  baseline: json.loads per line, median (s)", jv["wall_s_median"], "", ""),
        ("  baseline: json peak RSS (MB)", jv["peak_rss_mb"], "", ""),
        ("  baseline: json peak RSS / file size (×)", jv["peak_x_file"], "", ""),
        ("  baseline: json RSS growth / file (×)", jv["growth_x_file"], "", ""),
    ]
    for name, value, goal, verdict in rows:
        print(f"{name:<50}{value:>12.3f}{goal:>10}  {verdict}")
    print("  turn time is the client-side round trip (encode, socket, daemon, NDJSON frame, "
          "client decode);\n  ping is timed right after each turn on the same "
          "connection: the socket + dispatch floor.")
    print(f"  growing series: one session, {GROW_TURNS} turns, {warm['grow_first_len']} → "
          f"{warm['grow_last_len']} messages, last response "
          f"{warm['grow_response_bytes_last'] / 1024:.0f} KB.")
    print(f"  instruction rebuilds during the timed turns: "
          f"{warm['instructions_rebuilds_during_timing']} (cached: expect 0); "
          f"problems: {warm['problems'] or 'none'}; daemon log warnings/errors: "
          f"{len(warm['daemon_log_warnings'])}; daemon RSS after: {warm['rss_after_mb']:.0f} MB;\n"
          f"  client full GCs during the turn loops (harness frozen): "
          f"{warm['client_gen2_collections']}")
    print(f"  micro: cleared {mic['cleared']}, kept {mic['kept']}, saved {mic['tokens_saved']} "
          f"tokens, {mic['reasoning_stripped']} reasoning stripped; history "
          f"{mic['history_bytes'] / 1e6:.1f} MB; input unchanged after runs: "
          f"{mic['input_unchanged']}")
    print(f"  resume file: {res['file_bytes'] / 1e6:.1f} MB, {res['avg_record_bytes']:.0f} B/record "
          f"(generated in {res['generate_s']:.1f} s, deleted: {res['file_deleted']}); "
          f"resume → {rv['messages']} messages, torn {rv['torn']}, anchor {rv['anchor_index']}; "
          f"json → {jv['messages']} messages")
    print(f"  resume wall per run (s): {', '.join(f'{x:.3f}' for x in rv['wall_s'])}; json: "
          f"{', '.join(f'{x:.3f}' for x in jv['wall_s'])}; RSS before call: resume "
          f"{rv['rss_before_mb']:.0f} MB, json {jv['rss_before_mb']:.0f} MB")
    print(f"wall time {summary['wall_s']:.1f} s")
    print(f"results: {path}")
    return summary


if __name__ == "__main__":
    main()
