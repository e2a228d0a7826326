"""daemon.ping through the full stack vs a bare asyncio NDJSON echo server (same run).

Goals (issue: daemon foundation): p50 ≤ 3× the echo server; ≥ 3 000 req/s with one client and
≥ 5 000 with 32; start-up ≤ 0.6 s and idle RSS ≤ 80 MB with openai not yet imported.
Servers are measured in alternating rounds so machine noise hits both alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import loadgen_binary, median_of, run_loadgen, save, short_tmp
from qwenctxd.client import Client
from qwenctxd.testing.spawn import SpawnedDaemon

PING = '{"jsonrpc":"2.0","method":"daemon.ping","id":1}'
ROUNDS = 3


def start_echo(sock: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "bench.echo_server", sock],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_pct(seconds: float = 5.0) -> float:
    """CPU used by an idle daemon (no clients) over ``seconds``, in % of one core."""
    d = SpawnedDaemon()
    try:
        d.start(timeout=20)
        time.sleep(1.0)
        before = cpu_seconds(d.proc.pid)
        time.sleep(seconds)
        return (cpu_seconds(d.proc.pid) - before) / seconds * 100
    finally:
        d.cleanup()


def startup_times(n: int = 5) -> tuple[list[float], list[int], bool]:
    times, rss, openai_loaded = [], [], False
    for _ in range(n):
        d = SpawnedDaemon()
        try:
            t0 = time.perf_counter()
            d.start(timeout=20)
            times.append(time.perf_counter() - t0)
            time.sleep(0.5)  # settle: idle RSS, not start-up transients
            st = d.call("daemon.status")
            rss.append(st["rss_bytes"])
            openai_loaded = openai_loaded or bool(st["model"].get("imported"))
        finally:
            d.cleanup()
    return times, rss, openai_loaded


def main() -> dict[str, Any]:
    binary = loadgen_binary()
    if binary is None:
        raise SystemExit("bench ping needs a C compiler (cc) for the load generator")
    tmp = short_tmp()
    echo_sock = str(tmp / "echo.sock")
    echo = start_echo(echo_sock)
    daemon = SpawnedDaemon().start()
    # the request log at info is part of the measured stack; ping logs at debug (liveness)
    try:
        with Client(daemon.socket) as c:
            assert c.call("daemon.ping") == "pong"
        cells: dict[str, list[dict[str, Any]]] = {}
        for _ in range(ROUNDS):
            for conns in (1, 32):
                for name, sock in (("echo", echo_sock), ("daemon", str(daemon.socket))):
                    r = run_loadgen(binary, sock, conns, PING)
                    cells.setdefault(f"{name}/{conns}", []).append(r)
        rss_after = daemon.call("daemon.status")["rss_bytes"]
    finally:
        daemon.cleanup()
        echo.terminate()
        echo.wait()
    summary: dict[str, Any] = {}
    for key, runs in cells.items():
        summary[key] = {
            "p50_us": median_of(runs, "p50_us"),
            "p99_us": median_of(runs, "p99_us"),
            "rps": median_of(runs, "rps"),
            "errors": sum(r["errors"] for r in runs),
        }
    times, rss, openai_loaded = startup_times()
    summary["startup_s_median"] = statistics.median(times)
    summary["idle_rss_mb_median"] = statistics.median(rss) / 1e6
    summary["openai_imported_at_idle"] = openai_loaded
    summary["rss_after_load_mb"] = rss_after / 1e6
    for conns in (1, 32):
        summary[f"ratio_p50/{conns}"] = (
            summary[f"daemon/{conns}"]["p50_us"] / summary[f"echo/{conns}"]["p50_us"]
        )
    summary["idle_cpu_pct"] = idle_cpu_pct()
    path = save("ping", summary)
    print(f"daemon.ping vs bare asyncio echo (median of {ROUNDS} alternating rounds)")
    print(f"{'server':<10}{'clients':>8}{'p50 µs':>10}{'p99 µs':>10}{'req/s':>10}{'errors':>8}")
    for conns in (1, 32):
        for name in ("echo", "daemon"):
            s = summary[f"{name}/{conns}"]
            print(f"{name:<10}{conns:>8}{s['p50_us']:>10.0f}{s['p99_us']:>10.0f}"
                  f"{s['rps']:>10.0f}{s['errors']:>8}")
        print(f"  p50 ratio daemon/echo with {conns} client(s): "
              f"{summary[f'ratio_p50/{conns}']:.2f}× (goal ≤ 3×)")
    print(f"start-up (spawn → first pong), median of {len(times)}: "
          f"{summary['startup_s_median']:.3f} s (goal ≤ 0.6 s)")
    print(f"idle RSS: {summary['idle_rss_mb_median']:.1f} MB (goal ≤ 80 MB); "
          f"openai imported at idle: {openai_loaded}")
    print(f"idle CPU over 5 s: {summary['idle_cpu_pct']:.2f} % of one core (goal ~0)")
    print(f"results: {path}")
    return summary


if __name__ == "__main__":
    main()
