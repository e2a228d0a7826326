"""Lexical recall: quality on bench/recall_set and speed over 10 000 memories, vs the seed scoring.

SPEC §S8: lexical recall over 10 000 memories p50 ≤ 5 ms and ≥ 10× faster than the seed's
linear token scoring, with better quality on bench/recall_set.

Quality — ``bench/recall_set/``: 162 hand-written memories (project and user scope, the four
types, 43 in Chinese) parsed by the daemon's own ``store.scan``, and 68 hand-written queries
(24 Chinese) with their relevant memories. Metrics per query, averaged: hit@5 (a relevant memory
in the top 5), MRR@10 (1 / rank of the first relevant memory in the top 10), precision@5 and
recall@5. "Paraphrased" queries share no token with the title of any of their relevant memories.

Speed — 10 000 synthetic memories built from the recall set's own vocabulary (English words with
a Zipf-like frequency, 20 % Chinese documents built from Chinese clauses, 10 % mixed), synced into
a fresh LexicalIndex (file-backed, WAL). 240 queries: the 68 recall-set queries plus 172 generated
ones (3–9 words, common words and stop words included, a third of them Chinese). The index
answers through aiosqlite (its thread hop included); the baseline is
:func:`~qwenctxd.memory.lexical.seed_score_search` over the same 10 000 documents in memory —
it normalises every document on every query, as the seed does, and pays no I/O.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import percentile, save
from qwenctxd.memory import store
from qwenctxd.memory.lexical import Hit, LexicalIndex, seed_score_search
from qwenctxd.memory.tokenize import tokens

SET_DIR = Path(__file__).resolve().parent / "recall_set"
N_SYNTH = 10_000
N_GEN_QUERIES = 172
SEED = 20240917
GOAL_P50_MS = 5.0
GOAL_RATIO = 10.0
TYPES = ("user", "feedback", "project", "reference")


@dataclass(frozen=True)
class Doc:
    path: str
    scope: str
    type: str
    name: str
    description: str
    body: str
    mtime: float
    size: int
    keywords: tuple[str, ...] = ()


# -- the recall set ----------------------------------------------------------------------------------


def load_set() -> tuple[list[store.MemoryDoc], list[dict[str, Any]], Path]:
    mem = SET_DIR / "memories"
    docs: list[store.MemoryDoc] = []
    for scope in ("project", "user"):
        res = store.scan(mem / scope, scope, uncapped=True)  # type: ignore[arg-type]
        assert not res.problems, res.problems
        docs.extend(res.docs)
    queries = json.loads((SET_DIR / "queries.json").read_text(encoding="utf-8"))
    return docs, queries, mem


def metrics(ranked: list[str], relevant: set[str]) -> dict[str, float]:
    top5 = ranked[:5]
    rr = next((1.0 / (i + 1) for i, p in enumerate(ranked[:10]) if p in relevant), 0.0)
    found = sum(1 for p in top5 if p in relevant)
    return {"hit5": float(found > 0), "mrr10": rr, "p5": found / 5, "r5": found / len(relevant)}


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    if not rows:
        return {k: 0.0 for k in ("hit5", "mrr10", "p5", "r5")}
    return {k: statistics.fmean(r[k] for r in rows) for k in ("hit5", "mrr10", "p5", "r5")}


async def quality(tmp: Path) -> dict[str, Any]:
    docs, queries, mem = load_set()

    def rel(path: str) -> str:
        return Path(path).relative_to(mem).as_posix()

    titles = {rel(str(d.path)): set(tokens(d.name)) for d in docs}
    per: dict[str, list[dict[str, Any]]] = {"lexical": [], "seed": []}
    async with LexicalIndex(tmp / "set.sqlite") as ix:
        await ix.sync(docs)
        for q in queries:
            relevant = set(q["relevant"])
            qt = set(tokens(q["query"]))
            para = not any(qt & titles[r] for r in relevant)
            ranked = {
                "lexical": [rel(h.path) for h in await ix.search(q["query"], limit=10)],
                "seed": [rel(h.path) for h in seed_score_search(docs, q["query"], limit=10)],
            }
            for name, r in ranked.items():
                m = metrics(r, relevant)
                per[name].append({"id": q["id"], "lang": q["lang"], "paraphrased": para,
                                  "top5": r[:5], **m})
    out: dict[str, Any] = {"docs": len(docs), "queries": len(queries),
                           "chinese_docs": sum(1 for d in docs if re.search("[\u4e00-\u9fff]",
                                                                           d.name)),
                           "chinese_queries": sum(1 for q in queries if q["lang"] == "zh"),
                           "paraphrased_queries": sum(1 for r in per["lexical"]
                                                      if r["paraphrased"])}
    for name, rows in per.items():
        out[name] = {
            "all": mean_metrics(rows),
            "en": mean_metrics([r for r in rows if r["lang"] == "en"]),
            "zh": mean_metrics([r for r in rows if r["lang"] == "zh"]),
            "paraphrased": mean_metrics([r for r in rows if r["paraphrased"]]),
            "misses": [r["id"] for r in rows if not r["hit5"]],
            "per_query": rows,
        }
    return out


# -- synthetic corpus --------------------------------------------------------------------------------


def vocabulary(docs: list[store.MemoryDoc]) -> tuple[list[str], list[str]]:
    """English words (≥ 3 letters, repeats kept so frequencies follow the set) and Chinese
    clauses (split at punctuation) harvested from the recall set."""
    words: list[str] = []
    clauses: list[str] = []
    for d in docs:
        text = "\n".join((d.name, d.description, d.body))
        words += [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z0-9]{2,}", text)]
        clauses += [c for c in re.findall("[\u4e00-\u9fff]{2,}", text)]
    return words, clauses


def synth_docs(words: list[str], clauses: list[str], rng: random.Random) -> list[Doc]:
    # Zipf-like: rank the distinct words by frequency in the set, then sample by 1/rank^0.9.
    freq: dict[str, int] = {}
    for w in words:
        freq[w] = freq.get(w, 0) + 1
    ranked = sorted(freq, key=lambda w: -freq[w])
    # widen the vocabulary with suffixed variants so 10 000 documents do not all look alike
    extra = [f"{w}{s}" for w in ranked[:600] for s in ("ing", "er", "s", "ed", "x2")]
    vocab = ranked + extra
    weights = [1.0 / (i + 1) ** 0.9 for i in range(len(vocab))]

    def en(n: int) -> str:
        return " ".join(rng.choices(vocab, weights, k=n))

    def zh(n: int) -> str:
        return "，".join(rng.choices(clauses, k=n)) + "。"

    out = []
    now = time.time()
    for i in range(N_SYNTH):
        kind = rng.random()
        typ = rng.choice(TYPES)
        scope = "project" if rng.random() < 0.6 else "user"
        if kind < 0.2:  # Chinese
            name, desc, body = zh(1), zh(2), zh(rng.randint(6, 14))
        elif kind < 0.3:  # mixed
            name, desc = en(rng.randint(3, 6)), zh(2)
            body = en(rng.randint(30, 60)) + "\n" + zh(rng.randint(3, 8))
        else:
            name, desc = en(rng.randint(3, 6)), en(rng.randint(8, 16))
            body = en(rng.randint(50, 120))
            if typ == "feedback":
                body += f"\n\n**Why:** {en(12)}\n**How to apply:** {en(12)}"
        out.append(Doc(path=f"/synthetic/{scope}/{typ}/m{i:05d}.md", scope=scope, type=typ,
                       name=name, description=desc, body=body,
                       mtime=now - rng.random() * 86400 * 365,
                       size=len(body.encode()) + 80))
    return out


def synth_queries(set_queries: list[dict[str, Any]], words: list[str], clauses: list[str],
                  rng: random.Random) -> list[str]:
    stop = ["how", "do", "I", "the", "what", "is", "for", "in", "should", "we", "where", "can",
            "why", "does", "this", "with", "to"]
    distinct = sorted(set(words))
    qs = [q["query"] for q in set_queries]
    for i in range(N_GEN_QUERIES):
        if i % 3 == 2:  # Chinese: a clause or two, maybe with an English term
            q = "".join(rng.choices(clauses, k=rng.randint(1, 2)))
            if rng.random() < 0.3:
                q += " " + rng.choice(words)
        else:  # English: realistic words (frequency-weighted) mixed with function words
            n = rng.randint(3, 9)
            parts = [rng.choice(words) if rng.random() < 0.7 else rng.choice(distinct)
                     for _ in range(n)]
            for _ in range(rng.randint(1, 3)):
                parts.insert(rng.randint(0, len(parts)), rng.choice(stop))
            q = " ".join(parts)
        qs.append(q)
    return qs


async def speed(tmp: Path) -> dict[str, Any]:
    rng = random.Random(SEED)
    set_docs, set_queries, _ = load_set()
    words, clauses = vocabulary(set_docs)
    t0 = time.perf_counter()
    docs = synth_docs(words, clauses, rng)
    gen_s = time.perf_counter() - t0
    queries = synth_queries(set_queries, words, clauses, rng)
    db = tmp / "synth.sqlite"
    async with LexicalIndex(db) as ix:
        t0 = time.perf_counter()
        stats = await ix.sync(docs)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = await ix.sync(docs)
        resync_ms = (time.perf_counter() - t0) * 1000
        changed = [Doc(**{**d.__dict__, "mtime": d.mtime + 1, "body": d.body + " edited"})
                   for d in docs[:10]]
        t0 = time.perf_counter()
        upd = await ix.sync(changed + docs[10:])
        update_ms = (time.perf_counter() - t0) * 1000
        docs = changed + docs[10:]
        first_t0 = time.perf_counter()
        await ix.search(queries[0])
        first_ms = (time.perf_counter() - first_t0) * 1000
        for q in queries[:20]:  # warm the page cache
            await ix.search(q)
        lex: list[float] = []
        lex180: list[float] = []
        matched: list[int] = []
        for q in queries:
            t0 = time.perf_counter()
            hits = await ix.search(q, limit=5)
            lex.append((time.perf_counter() - t0) * 1000)
            matched.append(len(hits))
        for q in queries:
            t0 = time.perf_counter()
            await ix.search(q, limit=180)
            lex180.append((time.perf_counter() - t0) * 1000)
        scoped: list[float] = []
        for q in queries[:100]:
            t0 = time.perf_counter()
            await ix.search(q, limit=5, scopes=["user"], exclude=[docs[0].path, docs[1].path])
            scoped.append((time.perf_counter() - t0) * 1000)
    seed: list[float] = []
    seed_hits = 0
    for q in queries:
        t0 = time.perf_counter()
        s_hits: list[Hit] = seed_score_search(docs, q, limit=5)
        seed.append((time.perf_counter() - t0) * 1000)
        seed_hits += bool(s_hits)
    return {
        "docs": len(docs), "queries": len(queries), "generate_s": gen_s,
        "build_s": build_s, "build_stats": stats._asdict(), "resync_unchanged_ms": resync_ms,
        "resync_unchanged_stats": again._asdict(), "update_10_ms": update_ms,
        "update_stats": upd._asdict(), "first_query_ms": first_ms,
        "lexical_p50_ms": statistics.median(lex), "lexical_p99_ms": percentile(lex, 0.99),
        "lexical_mean_ms": statistics.fmean(lex),
        "lexical_limit180_p50_ms": statistics.median(lex180),
        "lexical_limit180_p99_ms": percentile(lex180, 0.99),
        "lexical_scoped_p50_ms": statistics.median(scoped),
        "queries_with_hits": sum(1 for m in matched if m), "seed_queries_with_hits": seed_hits,
        "seed_p50_ms": statistics.median(seed), "seed_p99_ms": percentile(seed, 0.99),
    }


def main() -> dict[str, Any]:
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qcb-recall-") as d:
        q = asyncio.run(quality(Path(d)))
        s = asyncio.run(speed(Path(d)))
        s["db_bytes"] = sum(p.stat().st_size for p in Path(d).glob("synth.sqlite*"))
    ratio = s["seed_p50_ms"] / s["lexical_p50_ms"]
    summary: dict[str, Any] = {"quality": q, "speed": s, "ratio_seed_over_lexical_p50": ratio,
                               "wall_s": 0.0}
    summary["wall_s"] = time.perf_counter() - t_start
    path = save("recall", summary)

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print(f"recall set: {q['docs']} memories ({q['chinese_docs']} Chinese), {q['queries']} "
          f"queries ({q['chinese_queries']} Chinese, {q['paraphrased_queries']} paraphrased)")
    print(f"{'quality':<30}{'lexical':>10}{'seed':>10}  {'goal':<14}verdict")
    for key, label in (("hit5", "hit@5"), ("mrr10", "MRR@10"), ("p5", "precision@5"),
                       ("r5", "recall@5")):
        for group in ("all", "en", "zh", "paraphrased"):
            a, b = q["lexical"][group][key], q["seed"][group][key]
            goal = "> seed" if group == "all" else ""
            verdict = met(a > b) if group == "all" else ""
            print(f"{label + ' (' + group + ')':<30}{a:>10.3f}{b:>10.3f}  {goal:<14}{verdict}")
    print(f"  misses@5 lexical: {' '.join(q['lexical']['misses']) or '-'}")
    print(f"  misses@5 seed:    {' '.join(q['seed']['misses']) or '-'}")
    print(f"speed: {s['docs']} synthetic memories, {s['queries']} queries; index build "
          f"{s['build_s']:.2f} s, DB {s['db_bytes'] / 1e6:.1f} MB")
    rows = [
        ("lexical search p50, limit 5 (ms)", s["lexical_p50_ms"], f"≤ {GOAL_P50_MS:g}",
         met(s["lexical_p50_ms"] <= GOAL_P50_MS)),
        ("lexical search p99, limit 5 (ms)", s["lexical_p99_ms"], "", ""),
        ("lexical p50, limit 180 (ms)", s["lexical_limit180_p50_ms"], "", ""),
        ("lexical p99, limit 180 (ms)", s["lexical_limit180_p99_ms"], "", ""),
        ("lexical p50, scope + exclude (ms)", s["lexical_scoped_p50_ms"], "", ""),
        ("first query, fresh connection (ms)", s["first_query_ms"], "", ""),
        ("seed linear scan p50 (ms)", s["seed_p50_ms"], "", ""),
        ("seed linear scan p99 (ms)", s["seed_p99_ms"], "", ""),
        ("speed-up seed p50 / lexical p50 (×)", ratio, f"≥ {GOAL_RATIO:g}",
         met(ratio >= GOAL_RATIO)),
        ("re-sync, nothing changed (ms)", s["resync_unchanged_ms"], "", ""),
        ("re-sync, 10 changed (ms)", s["update_10_ms"], "", ""),
    ]
    print(f"{'figure':<40}{'value':>10}{'goal':>8}  verdict")
    for name, value, goal, verdict in rows:
        print(f"{name:<40}{value:>10.3f}{goal:>8}  {verdict}")
    print(f"queries with ≥1 hit: lexical {s['queries_with_hits']}, seed "
          f"{s['seed_queries_with_hits']} of {s['queries']}; wall time {summary['wall_s']:.1f} s")
    print(f"results: {path}")
    return summary


if __name__ == "__main__":
    main()
