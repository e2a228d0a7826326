"""Skills: full refresh of 300 skills across 4 levels, change-to-visible latency, idle cost.

Issue (skills): full refresh of 300 skills across 4 levels ≤ 100 ms; change-to-visible latency
≤ 400 ms with the 150 ms debounce; idle CPU of the watchers ~0.

Fixture (in a SpawnedDaemon's scratch HOME): ``~/repo`` (a ``.git`` directory makes it the
project root) with 75 skills in each of ``repo/.qwen/skills``, ``repo/.agents/skills``,
``~/.qwen/skills`` and ``~/.agents/skills`` — 300 distinct names, plus the bundled skills.
Every SKILL.md has frontmatter (name, a one-sentence description, ``when_to_use`` and
``allowed-tools`` on some, ``paths`` globs on every 5th — conditional — and
``disable-model-invocation`` on every 10th) and a ~500-character markdown body.

1. Full refresh, in-process: ``levels.aload_skills(levels.base_dirs(...))`` on the same tree,
   median of ``REFRESH_RUNS``. Cold: ``levels.clear_parse_cache()`` before each run (every
   file re-parsed: what the daemon pays on first load); warm: the content-keyed parse cache is
   hot (what a watch-triggered refresh pays when one file changed: it re-reads all, re-parses
   one). Baseline, same run, same base dirs: a naive sequential loader — ``os.walk`` each base,
   read each SKILL.md, split the frontmatter, pure-Python ``yaml.safe_load`` per file, first
   name wins.
2. Change-to-visible, through the socket: after a warm ``skills.list``, rewrite one SKILL.md's
   description (a different skill and level each time) and poll ``skills.list`` every 5 ms
   until the new description is listed; then, separately, create new skill directories
   (``mkdir`` + write SKILL.md) and poll until the name is listed. ``EDITS`` + ``CREATES``
   changes spaced ``SPACING_S`` apart. The ``skills_refreshes`` counter delta from
   ``daemon.status`` should equal the number of changes (one debounced refresh each).
3. Idle CPU: the daemon's utime+stime from ``/proc/<pid>/stat`` (and, finer, the sum of its
   threads' ``schedstat`` run time) over ``IDLE_S`` seconds of idle with the tree watched, in %
   of one core; plus the inotify watch count from ``daemon.status``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import yaml

from bench.common import save
from qwenctxd.client import Client
from qwenctxd.config.schema import Settings
from qwenctxd.skills import levels
from qwenctxd.skills.service import DEBOUNCE_S
from qwenctxd.testing.spawn import SpawnedDaemon

PER_BASE = 75
REFRESH_RUNS = 10
EDITS = 10
CREATES = 6
SPACING_S = 0.45
POLL_S = 0.005
VISIBLE_TIMEOUT_S = 5.0
SETTLE_S = 1.5
IDLE_S = 5.0
GOAL_REFRESH_MS = 100.0
GOAL_VISIBLE_MS = 400.0
GOAL_IDLE_CPU_PCT = 0.5  # "~0": under half a percent of one core

TOPICS = ["review", "release", "migrate", "triage", "profile", "document", "refactor", "deploy",
          "audit", "bisect", "benchmark", "localize", "onboard", "rollback", "scaffold"]
AREAS = ["api", "db", "ui", "cli", "infra", "auth", "cache", "queue", "search", "billing"]
TOOLS = ["Read, Grep, Glob", "Read Bash(git diff:*) Bash(git log:*)", "Read, Edit, Write"]
GLOBS = [["src/**/*.py"], ["web/**/*.ts", "web/**/*.tsx"], ["migrations/*.sql"],
         ["docs/**/*.md"], ["infra/**/*.tf", "infra/**/*.hcl"]]


def base_paths(home: Path, repo: Path) -> list[tuple[str, Path]]:
    return [("project", repo / ".qwen" / "skills"), ("project", repo / ".agents" / "skills"),
            ("user", home / ".qwen" / "skills"), ("user", home / ".agents" / "skills")]


def skill_text(name: str, n: int, description: str | None = None) -> str:
    topic, area = TOPICS[n % len(TOPICS)], AREAS[n // len(TOPICS) % len(AREAS)]
    desc = description or (f"How to {topic} changes in the {area} layer - the checks to run, "
                           f"the files to read first and what a good result looks like.")
    fm = [f"name: {name}", f"description: {desc}"]
    if n % 3 == 0:
        fm.append(f"when_to_use: when the user asks to {topic} something in {area}")
    if n % 4 == 1:
        fm.append(f'allowed-tools: "{TOOLS[n % len(TOOLS)]}"')
    if n % 5 == 2:
        fm.append("paths:\n" + "".join(f'  - "{g}"\n' for g in GLOBS[n % len(GLOBS)]).rstrip())
    if n % 10 == 7:
        fm.append("disable-model-invocation: true")
    body = (f"# {topic.title()} ({area})\n\n"
            f"Use this procedure when you {topic} code that touches the {area} layer.\n\n"
            "## Steps\n\n"
            f"1. Read `{area}/README.md` and the module docstrings of what you change.\n"
            "2. Run the focused tests first, then the full suite: `make test`.\n"
            f"3. Check the {area} invariants listed in `docs/{area}.md` still hold.\n"
            "4. Summarise what changed, what you verified and what is left to check.\n\n"
            "## Pitfalls\n\n"
            "- Do not widen a public interface to make a test pass.\n"
            "- Keep unrelated formatting changes out of the diff.\n")
    return "---\n" + "\n".join(fm) + "\n---\n" + body


def build_tree(home: Path) -> tuple[Path, list[Path]]:
    """The 4 × 75 skill tree; returns the repo and every SKILL.md written."""
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    written = []
    n = 0
    for b, (_level, base) in enumerate(base_paths(home, repo)):
        for i in range(PER_BASE):
            name = f"{TOPICS[n % len(TOPICS)]}-{AREAS[n // len(TOPICS) % len(AREAS)]}-b{b}s{i:02d}"
            path = base / name / "SKILL.md"
            path.parent.mkdir(parents=True)
            path.write_text(skill_text(name, n))
            written.append(path)
            n += 1
    return repo, written


# -- 1. full refresh, in-process --------------------------------------------------------------
def naive_load(bases: list[levels.BaseDir]) -> dict[str, tuple[str, dict[str, Any], str]]:
    """The baseline: os.walk each base, read each SKILL.md, pure-Python yaml.safe_load."""
    out: dict[str, tuple[str, dict[str, Any], str]] = {}
    for base in bases:
        for dirpath, dirnames, filenames in os.walk(base.path):
            dirnames.sort()
            if "SKILL.md" not in filenames:
                continue
            with open(os.path.join(dirpath, "SKILL.md"), encoding="utf-8") as fh:
                text = fh.read()
            if not text.startswith("---"):
                continue
            _, fm, body = text.split("---\n", 2)
            try:
                data = yaml.safe_load(fm)
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                out.setdefault(data["name"], (base.level, data, body))
    return out


def refresh_runs(bases: list[levels.BaseDir]) -> dict[str, Any]:
    settings = Settings().skills

    async def run() -> dict[str, Any]:
        ss = await levels.aload_skills(bases, settings=settings)  # warm-up: thread pool etc.
        cold, warm = [], []
        for _ in range(REFRESH_RUNS):
            levels.clear_parse_cache()
            t0 = time.perf_counter()
            ss = await levels.aload_skills(bases, settings=settings)
            cold.append((time.perf_counter() - t0) * 1000)
        for _ in range(REFRESH_RUNS):
            t0 = time.perf_counter()
            ss = await levels.aload_skills(bases, settings=settings)
            warm.append((time.perf_counter() - t0) * 1000)
        return {"cold": cold, "warm": warm, "skills": len(ss.skills), "errors": len(ss.errors),
                "conditional": sum(1 for k in ss.skills.values() if k.conditional),
                "names": set(ss.skills)}

    res = anyio.run(run)
    assert res["errors"] == 0, "the fixture should load without errors"
    naive_load(bases)  # warm-up (page cache, imports)
    naive = []
    for _ in range(REFRESH_RUNS):
        t0 = time.perf_counter()
        got = naive_load(bases)
        naive.append((time.perf_counter() - t0) * 1000)
    res["naive"] = naive
    res["naive_same_names"] = set(got) == res.pop("names")
    return res


# -- 2. change-to-visible, through the socket -------------------------------------------------
def refreshes(c: Client) -> int:
    return int(c.call("daemon.status")["counters"].get("skills_refreshes", 0))


def poll_until(c: Client, params: dict[str, Any], pred: Any) -> tuple[float, int]:
    """ms until ``pred(listing)`` holds, polling every POLL_S; and the number of polls."""
    t0 = time.perf_counter()
    polls = 0
    while True:
        polls += 1
        if pred(c.call("skills.list", params)):
            return (time.perf_counter() - t0) * 1000, polls
        if time.perf_counter() - t0 > VISIBLE_TIMEOUT_S:
            raise RuntimeError(f"change not visible after {VISIBLE_TIMEOUT_S} s")
        time.sleep(POLL_S)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def cpu_ns(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def main() -> dict[str, Any]:
    t_start = time.perf_counter()
    d = SpawnedDaemon()
    try:
        repo, written = build_tree(d.home)
        bases = levels.base_dirs(repo, home=d.home, settings=Settings().skills, cwd=repo,
                                 qwen_dir=d.home / ".qwen")
        tree_bytes = sum(p.stat().st_size for p in written)
        ref = refresh_runs(bases)

        d.start(timeout=20)
        assert d.proc is not None
        pid = d.proc.pid
        params = {"cwd": str(repo)}
        with d.client() as c:
            t0 = time.perf_counter()
            first = c.call("skills.list", params)
            list_cold_ms = (time.perf_counter() - t0) * 1000
            assert len(first["skills"]) == ref["skills"], (len(first["skills"]), ref["skills"])
            warm_list = []
            for _ in range(50):
                t0 = time.perf_counter()
                c.call("skills.list", params)
                warm_list.append((time.perf_counter() - t0) * 1000)
            time.sleep(SETTLE_S)  # the post-load verify pass and the watcher (re)start
            r0 = refreshes(c)
            # -- edits: a different skill (and level) each time ------------------------------
            edit_ms: list[float] = []
            edit_polls: list[int] = []
            vanished = 0
            for i in range(EDITS):
                time.sleep(SPACING_S)
                path = written[(i * 31 + 7) % len(written)]
                name = path.parent.name
                desc = f"Edited description number {i} of {name}."
                path.write_text(skill_text(name, i, description=desc))
                seen_missing = False

                def edited(listing: dict[str, Any], name: str = name, desc: str = desc) -> bool:
                    nonlocal seen_missing
                    hit = next((s for s in listing["skills"] if s["name"] == name), None)
                    seen_missing |= hit is None
                    return hit is not None and hit["description"] == desc

                ms, polls = poll_until(c, params, edited)
                edit_ms.append(ms)
                edit_polls.append(polls)
                vanished += seen_missing
            time.sleep(SPACING_S)
            r_edits = refreshes(c)
            # -- creates: a new skill directory in each base in turn -------------------------
            create_ms: list[float] = []
            for j in range(CREATES):
                time.sleep(SPACING_S)
                _level, base = base_paths(d.home, repo)[j % 4]
                name = f"fresh-skill-{j}"
                (base / name).mkdir()
                (base / name / "SKILL.md").write_text(skill_text(name, 100 + j))
                ms, _ = poll_until(c, params, lambda listing, name=name: any(
                    s["name"] == name for s in listing["skills"]))
                create_ms.append(ms)
            time.sleep(SPACING_S)
            r_creates = refreshes(c)
            final = c.call("skills.list", params)
            # -- idle ------------------------------------------------------------------------
            time.sleep(SETTLE_S)
            st0 = c.call("daemon.status")
            ticks0, ns0, w0 = cpu_ticks(pid), cpu_ns(pid), time.perf_counter()
            time.sleep(IDLE_S)
            ticks1, ns1, w1 = cpu_ticks(pid), cpu_ns(pid), time.perf_counter()
            st1 = c.call("daemon.status")
        log_problems = [ln for ln in d.log_text().splitlines()
                        if '"level": "warning"' in ln or '"level": "error"' in ln
                        or '"level":"warning"' in ln or '"level":"error"' in ln]
    finally:
        d.cleanup()

    clk = os.sysconf("SC_CLK_TCK")
    idle_wall = w1 - w0
    idle_pct = (ticks1 - ticks0) / clk / idle_wall * 100
    idle_pct_ns = (ns1 - ns0) / 1e9 / idle_wall * 100
    idle_refreshes = st1["counters"].get("skills_refreshes", 0) - \
        st0["counters"].get("skills_refreshes", 0)
    cold_med, warm_med = statistics.median(ref["cold"]), statistics.median(ref["warm"])
    naive_med = statistics.median(ref["naive"])
    edit_med, edit_max = statistics.median(edit_ms), max(edit_ms)
    create_med, create_max = statistics.median(create_ms), max(create_ms)
    all_max = max(edit_max, create_max)
    summary: dict[str, Any] = {
        "fixture": {"per_base": PER_BASE, "bases": 4, "skills_written": len(written),
                    "skills_listed": ref["skills"], "conditional": ref["conditional"],
                    "bytes": tree_bytes, "load_errors": ref["errors"]},
        "refresh_cold_ms": ref["cold"], "refresh_cold_ms_median": cold_med,
        "refresh_warm_ms": ref["warm"], "refresh_warm_ms_median": warm_med,
        "naive_ms": ref["naive"], "naive_ms_median": naive_med,
        "naive_same_names": ref["naive_same_names"],
        "ratio_naive_over_cold": naive_med / cold_med,
        "ratio_naive_over_warm": naive_med / warm_med,
        "list_cold_ms_socket": list_cold_ms,
        "list_warm_ms_median_socket": statistics.median(warm_list),
        "edit_visible_ms": edit_ms, "edit_visible_ms_median": edit_med,
        "edit_visible_ms_max": edit_max, "edit_polls": edit_polls,
        "edit_skill_vanished_while_polling": vanished,
        "create_visible_ms": create_ms, "create_visible_ms_median": create_med,
        "create_visible_ms_max": create_max,
        "refreshes_before": r0, "refreshes_after_edits": r_edits,
        "refreshes_after_creates": r_creates,
        "skills_listed_after_creates": len(final["skills"]),
        "idle_s": idle_wall, "idle_cpu_pct_ticks": idle_pct, "idle_cpu_pct_schedstat": idle_pct_ns,
        "idle_refreshes": idle_refreshes,
        "inotify_watches": st1["inotify_watches"],
        "daemon_log_warnings": log_problems[:20],
        "wall_s": 0.0,
    }
    summary["wall_s"] = time.perf_counter() - t_start
    path = save("skills", summary)

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    fx = summary["fixture"]
    print(f"skills: {len(written)} SKILL.md in 4 bases × {PER_BASE} (project .qwen/.agents, "
          f"user .qwen/.agents), {tree_bytes // 1024} KiB; {ref['skills']} listed incl. bundled, "
          f"{fx['conditional']} conditional, {ref['errors']} load errors")
    print(f"{'figure':<50}{'value':>10}{'goal':>10}  verdict")
    rows = [
        (f"full refresh, cold parse, median of {REFRESH_RUNS} (ms)", cold_med,
         f"≤ {GOAL_REFRESH_MS:g}", met(cold_med <= GOAL_REFRESH_MS)),
        ("full refresh, warm parse cache, median (ms)", warm_med, f"≤ {GOAL_REFRESH_MS:g}",
         met(warm_med <= GOAL_REFRESH_MS)),
        ("  baseline: naive walk + pure-Python YAML (ms)", naive_med, "", ""),
        ("  speed-up naive / cold (×)", summary["ratio_naive_over_cold"], "", ""),
        ("  speed-up naive / warm (×)", summary["ratio_naive_over_warm"], "", ""),
        ("skills.list via socket: first call, cold (ms)", list_cold_ms, "", ""),
        ("skills.list via socket: warm median (ms)", summary["list_warm_ms_median_socket"],
         "", ""),
        (f"edit → visible, median of {EDITS} (ms)", edit_med, f"≤ {GOAL_VISIBLE_MS:g}",
         met(edit_med <= GOAL_VISIBLE_MS)),
        (f"edit → visible, max of {EDITS} (ms)", edit_max, f"≤ {GOAL_VISIBLE_MS:g}",
         met(edit_max <= GOAL_VISIBLE_MS)),
        (f"new skill dir → visible, median of {CREATES} (ms)", create_med,
         f"≤ {GOAL_VISIBLE_MS:g}", met(create_med <= GOAL_VISIBLE_MS)),
        (f"new skill dir → visible, max of {CREATES} (ms)", create_max, f"≤ {GOAL_VISIBLE_MS:g}",
         met(create_max <= GOAL_VISIBLE_MS)),
        (f"idle CPU over {idle_wall:.1f} s, utime+stime (% core)", idle_pct,
         f"≤ {GOAL_IDLE_CPU_PCT:g}", met(idle_pct <= GOAL_IDLE_CPU_PCT)),
        ("idle CPU, threads' schedstat (% core)", idle_pct_ns, f"≤ {GOAL_IDLE_CPU_PCT:g}",
         met(idle_pct_ns <= GOAL_IDLE_CPU_PCT)),
    ]
    for name, value, goal, verdict in rows:
        print(f"{name:<50}{value:>10.3f}{goal:>10}  {verdict}")
    print(f"  edits: {', '.join(f'{x:.0f}' for x in edit_ms)} ms; "
          f"creates: {', '.join(f'{x:.0f}' for x in create_ms)} ms "
          f"(debounce {DEBOUNCE_S * 1000:g} ms, poll every {POLL_S * 1000:g} ms; all ≤ {GOAL_VISIBLE_MS:g}: "
          f"{met(all_max <= GOAL_VISIBLE_MS)})")
    print(f"  edited skill missing from a listing while polling: {vanished} of {EDITS}; "
          f"naive loader found the same names: {ref['naive_same_names']}")
    d_edits, d_creates = r_edits - r0, r_creates - r_edits
    print(f"skills_refreshes: +{d_edits} for {EDITS} edits, +{d_creates} for {CREATES} new "
          f"dirs, +{idle_refreshes} while idle — "
          f"{met(d_edits == EDITS and d_creates == CREATES and idle_refreshes == 0)}")
    print(f"inotify watches held by the daemon: {summary['inotify_watches']} "
          f"({len(written) + CREATES} skill dirs + 4 bases + "
          "config/instruction dirs)")
    print(f"daemon log warnings/errors: {len(log_problems)}")
    for ln in log_problems[:5]:
        print(f"  {ln[:200]}")
    print(f"wall time {summary['wall_s']:.1f} s; results: {path}")
    return summary


if __name__ == "__main__":
    main()
