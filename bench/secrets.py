"""The secret guard's cost: the scanner per KiB (linear?), and what it adds to a warm turn.

1. Scanner, in-process: :func:`qwenctxd.secrets.redact` over memory-like text (markdown prose,
   code, commit SHAs, sha256 digests, UUIDs, lockfile integrity hashes, URLs, a base64 blob and
   one fake key per KiB, a zero-width character and a fullwidth run now and then) of 1, 16 and
   256 KiB, best of ``SCAN_RUNS``. Baseline, same run and same text: one bounded regex pass
   (``[A-Za-z0-9_]{20,512}+`` counted with ``finditer``) — the floor of any scan. Reported: µs
   per KiB at each size, the 256-vs-1 KiB per-KiB ratio (linear: ≈ 1 or below) and the ratio
   to the baseline.
2. Warm ``session.turn`` with recall, through the socket: two daemons spawned side by side with
   the same 60 hand-written memories (10 holding a fake key), no model (lexical recall),
   ``prefetchGraceMs`` 5 000 so the recall reminder rides on the user turn. One daemon runs
   with the guard, the other with ``QWENCTXD_BENCH_NO_SECRET_GUARD=1`` (outbound redaction
   off; the baseline). Each measurement opens a fresh session (not timed; surfaced memories
   are per session) and times one user turn whose reminder carries recalled memories;
   the two daemons alternate, ``TURN_ROUNDS`` rounds after ``WARM`` warm-up rounds. Goal:
   p50 with the guard ≤ 1.05 × the baseline's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import percentile, save
from qwenctxd.secrets import redact
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

SIZES_KIB = (1, 16, 256)
SCAN_RUNS = 5
TURN_ROUNDS = 60
WARM = 5
N_DOCS = 60
GOAL_TURN_RATIO = 1.05
_FLOOR = re.compile(r"[A-Za-z0-9_]{20,512}+")


def memory_text(kib: int) -> str:
    parts: list[str] = []
    i = 0
    while sum(map(len, parts)) < kib * 1024:
        parts.append(
            f"## Note {i}\nThe release freeze starts Thursday; see commit "
            f"{hashlib.sha1(str(i).encode()).hexdigest()} and digest sha256:"
            f"{hashlib.sha256(str(i).encode()).hexdigest()}.\nRequest {uuid.UUID(int=i * 7919)} "
            "failed with `password: required`; reset your password in settings.\n"
            f'"integrity": "sha512-{base64.b64encode(hashlib.sha512(str(i).encode()).digest()).decode()}"\n'
            "```python\ndef deploy(env: str) -> None:\n    run(['make', 'ship', env])\n```\n"
            f"Token for the build: {'gh' + 'p_' + hashlib.md5(str(i).encode()).hexdigest()[:36].ljust(36, 'Z')}\n"
            f"Docs: https://example.com/docs/{i}?page=2 — ｆｕｌｌ\u200bwidth note.\n")
        i += 1
    return "".join(parts)[: kib * 1024]


def best(fn: Any, runs: int) -> float:
    out = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def scanner() -> dict[str, Any]:
    rows = {}
    for kib in SIZES_KIB:
        text = memory_text(kib)
        found = len(redact(text).findings)
        guard = best(lambda text=text: redact(text), SCAN_RUNS)
        floor = best(lambda text=text: sum(1 for _ in _FLOOR.finditer(text)), SCAN_RUNS)
        rows[f"{kib}KiB"] = {"us_per_kib": guard / kib * 1e6, "floor_us_per_kib": floor / kib * 1e6,
                             "vs_floor": guard / floor, "findings": found}
    rows["per_kib_256_vs_1"] = rows["256KiB"]["us_per_kib"] / rows["1KiB"]["us_per_kib"]
    rows["per_kib_256_vs_16"] = rows["256KiB"]["us_per_kib"] / rows["16KiB"]["us_per_kib"]
    return rows


def seed(d: SpawnedDaemon, repo: Path) -> None:
    st = d.call("memory.status", {"cwd": str(repo)})
    root = Path(st["roots"]["project"])
    for i in range(N_DOCS):
        key = f" The deploy token is {'gh' + 'p_' + hashlib.md5(str(i).encode()).hexdigest()[:36].ljust(36, 'Q')}." \
            if i % 6 == 0 else ""
        (root / "project" / f"note-{i}.md").write_text(
            f"---\nname: Release note {i}\ndescription: release freeze and deploy steps {i}\n"
            f"type: project\n---\nThe release freeze starts Thursday at noon ({i}). Deploy with "
            f"`make ship` from main only; staging first.{key}\n" + "Detail line. " * 40 + "\n")
    index = "\n".join(f"- [Release note {i}](project/note-{i}.md) — release freeze {i}"
                      for i in range(N_DOCS))
    (root / "MEMORY.md").write_text(index + "\n")
    (repo / ".qwen").mkdir(exist_ok=True)
    (repo / ".qwen" / "settings.json").write_text(
        json.dumps({"memory": {"prefetchGraceMs": 5000}}))
    until(lambda: len(d.call("memory.list", {"cwd": str(repo)})["docs"]) >= N_DOCS,
          timeout=30, what="the memories to be indexed")


def one_turn(c: Any, repo: Path) -> float:
    sid = c.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
    t = time.perf_counter()
    p = c.call("session.turn", {"session_id": sid, "kind": "user",
                                "text": "when does the release freeze start and how do we deploy?"})
    elapsed = time.perf_counter() - t
    if not [r for r in p["reminders"] if r["kind"] == "memory"]:
        raise RuntimeError("the turn carried no recall reminder")
    c.call("session.close", {"session_id": sid})
    return elapsed


def warm_turn() -> dict[str, Any]:
    guarded = SpawnedDaemon().start()
    bypass = SpawnedDaemon(env={"QWENCTXD_BENCH_NO_SECRET_GUARD": "1"}).start()
    try:
        repos = {}
        for name, d in (("guard", guarded), ("bypass", bypass)):
            repo = d.home / "repo"
            (repo / ".git").mkdir(parents=True)
            seed(d, repo)
            repos[name] = (d, repo)
        samples: dict[str, list[float]] = {"guard": [], "bypass": []}
        with guarded.client(timeout=60) as cg, bypass.client(timeout=60) as cb:
            clients = {"guard": cg, "bypass": cb}
            for r in range(WARM + TURN_ROUNDS):
                order = ("guard", "bypass") if r % 2 == 0 else ("bypass", "guard")
                for name in order:
                    elapsed = one_turn(clients[name], repos[name][1])
                    if r >= WARM:
                        samples[name].append(elapsed)
            secrets = cg.call("daemon.status")["secrets"]
            leaked = "gh" + "p_" in json.dumps(cg.call("memory.recall", {
                "cwd": str(repos["guard"][1]), "query": "deploy token"}))
    finally:
        guarded.cleanup()
        bypass.cleanup()
    g, b = statistics.median(samples["guard"]), statistics.median(samples["bypass"])
    return {"guard_p50_ms": g * 1e3, "bypass_p50_ms": b * 1e3, "ratio_p50": g / b,
            "guard_p90_ms": percentile(samples["guard"], 0.9) * 1e3,
            "bypass_p90_ms": percentile(samples["bypass"], 0.9) * 1e3,
            "rounds": TURN_ROUNDS, "secrets_status": secrets, "key_in_guarded_recall": leaked,
            "goal_ratio": GOAL_TURN_RATIO, "ok": g / b <= GOAL_TURN_RATIO and not leaked}


def main() -> None:
    out = {"scanner": scanner(), "warm_turn": warm_turn()}
    path = save("secrets", out)
    sc, wt = out["scanner"], out["warm_turn"]
    for kib in SIZES_KIB:
        row = sc[f"{kib}KiB"]
        print(f"scan {kib:>3} KiB: {row['us_per_kib']:8.1f} µs/KiB  (floor "
              f"{row['floor_us_per_kib']:.1f} µs/KiB, ×{row['vs_floor']:.0f}; "
              f"{row['findings']} findings)")
    print(f"per-KiB cost 256 vs 1 KiB: ×{sc['per_kib_256_vs_1']:.2f}, 256 vs 16: "
          f"×{sc['per_kib_256_vs_16']:.2f}")
    print(f"warm session.turn with recall p50: guard {wt['guard_p50_ms']:.2f} ms, bypass "
          f"{wt['bypass_p50_ms']:.2f} ms → ×{wt['ratio_p50']:.3f} (goal ≤ ×{GOAL_TURN_RATIO}); "
          f"p90 {wt['guard_p90_ms']:.2f} / {wt['bypass_p90_ms']:.2f} ms; ok={wt['ok']}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
