"""kill -9 under load loses nothing acknowledged: a tiny version of ``python -m bench reliability``.

Four clients drive user turns and model replies against a spawned daemon that is SIGKILLed and
restarted twice mid-run; the clients reconnect, resume their sessions and carry on. Every call
the daemon acknowledged must be in the session's JSONL (read with the daemon's own reader) and in
the history a resume rebuilds.
"""

from __future__ import annotations

from bench.reliability import kill_run


def test_kill9_mid_run_loses_no_acknowledged_record() -> None:
    r = kill_run(clients=4, turns=10, kills=2, seed=7)

    # the killer's own failure (a restart that did not come up) before anything that follows it
    assert r["killer_errors"] == [], r["killer_errors"]
    # the whole result when the second kill never came (the clients stopped short of it)
    assert r["kills"] == 2, {k: v for k, v in r.items() if k != "torn_lines"}
    assert r["client_errors"] == []
    assert r["hung_clients"] == 0
    # the clients got through the run: at least the rounds after the last kill were acknowledged
    assert r["acknowledged"] >= 4 * 10
    assert r["missing_in_jsonl"] == [] and r["lost"] == 0
    assert r["found_in_jsonl"] == r["acknowledged"]
    assert r["missing_in_resumed_history"] == [] and r["lost_in_resume"] == 0
    # a SIGKILL can cut at most the line being written: one per session per kill
    assert len(r["torn_lines"]) <= 4 * 2, r["torn_lines"]
    # every kill interrupted at least one client (they were all connected and busy)
    assert r["reconnects"] >= 2
