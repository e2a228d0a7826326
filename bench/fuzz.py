"""A long fuzz run (SPEC §S9: ≥ 10 000 cases each) of the parsers that face untrusted input:
the JSON-RPC frame dispatcher, YAML frontmatter, @import processing, the MEMORY.md index
sanitiser and link encoding, the secret scanner, and every served method through a spawned
daemon's socket (params generated from its ``rpc.discover`` schema; a scripted model answers
its side queries and agents at random). Each case must not raise; timings are
printed so a regression to super-linear behaviour shows. Deterministic (seeded)."""

from __future__ import annotations

import asyncio
import random
import string
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench.common import save

CASES = 10_000
ALPHABET = string.printable + "@`[]()#:-{}\u200b\u202e\u4e2d\u6587\U0001f600\x00\x7f"


def rand_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(n)))


def fuzz_dispatch(rng: random.Random) -> int:
    from qwenctxd.protocol import methods
    from qwenctxd.server.dispatch import Dispatcher, bind

    d = Dispatcher()

    async def ping(ctx: Any, p: Any) -> str:
        return "pong"

    d.register(bind(methods.DAEMON_PING, ping))
    pieces = [b'{"jsonrpc":"2.0"', b',"method":"daemon.ping"', b',"id":1', b',"params":{}', b"}",
              b"[", b"]", b",", b'"', b"\\u0000", b"null", b"1e999", b"{", b"\xff"]

    async def run() -> int:
        for _ in range(CASES):
            frame = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
            if rng.random() < 0.3:
                frame = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            await d.dispatch(frame, None)
        return CASES

    return asyncio.run(run())


def fuzz_frontmatter(rng: random.Random) -> int:
    from qwenctxd import frontmatter

    for _ in range(CASES):
        head = rng.choice(["---\n", "---\r\n", "", "\ufeff---\n"])
        body = rand_text(rng, 80).replace("\x00", "")
        frontmatter.parse(head + body + rng.choice(["\n---\n", "", "\n...\n"]) + body)
    return CASES


def fuzz_imports(rng: random.Random) -> int:
    from qwenctxd.instructions.imports import process_imports

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / ".git").mkdir()
        (root / "a.md").write_text("A @./b.md\n")
        (root / "b.md").write_text("B @./a.md `@./a.md`\n")
        tokens = ["@./a.md", "@./b.md", "@../../etc/passwd", "@http://x", "`", "```\n", "a@b.c",
                  "@./missing.md", "\n", " ", "    ", "@/etc/hostname"]
        for _ in range(CASES):
            text = "".join(rng.choice(tokens) for _ in range(rng.randrange(12)))
            res = process_imports(text, root, project_root=root, fmt=rng.choice(["tree", "flat"]))
            assert all(str(p).startswith(str(root)) for p in res.imports)
    return CASES


def fuzz_index(rng: random.Random) -> int:
    from qwenctxd.memory.index import encode_index_target, sanitize_index_field

    for _ in range(CASES):
        field = sanitize_index_field(rand_text(rng, 300))
        assert "\n" not in field and "](" not in field and "`" not in field
        rel = rand_text(rng, 60).replace("\x00", "") or "x.md"
        enc = encode_index_target(rel)
        assert urllib.parse.unquote(enc) == rel  # the link always leads back to the file
        assert " " not in enc and "(" not in enc and ")" not in enc
    return CASES


def fuzz_secrets(rng: random.Random) -> int:
    from qwenctxd.memory.secrets import RULES, scan

    ids = {r.id for r in RULES}
    frags = ["sk-", "ghp_", "AKIA", "-----BEGIN PRIVATE KEY-----", "xoxb-", "hf_", "T3BlbkFJ",
             "a" * 40, "0123456789", "-", "_", " "]
    for _ in range(CASES):
        text = "".join(rng.choice(frags) for _ in range(rng.randrange(20))) + rand_text(rng, 40)
        assert {h.rule_id for h in scan(text)} <= ids
    return CASES


def _fuzz_methods(rng: random.Random, clients: int) -> int:
    """Every served method through a spawned daemon's socket, from its rpc.discover schema,
    ``CASES`` calls split over ``clients`` concurrent connections sharing the sessions: no
    -32603, only documented codes, background work drained, the daemon alive after."""
    import threading

    from qwenctxd.testing.openai_stub import ScriptedOpenAI
    from qwenctxd.testing.rpc_fuzz import chaotic_model, fuzz_daemon, make_fuzz_project
    from qwenctxd.testing.spawn import SpawnedDaemon

    stub = ScriptedOpenAI(handler=chaotic_model(rng.randrange(2**32))).__enter__()
    d = SpawnedDaemon(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_MODEL": "fuzz-model",
                           "OPENAI_API_KEY": "fuzz"}).start()
    try:
        repo = make_fuzz_project(d.home)
        sessions = [d.call("session.open", {"cwd": str(repo), "model": "m"})["session_id"]
                    for _ in range(clients)]
        seeds = [rng.randrange(2**32) for _ in range(clients)]
        reports: list[Any] = []

        def run(seed: int) -> None:
            with d.client(timeout=120) as c:
                reports.append(fuzz_daemon(c, calls=CASES // clients, seed=seed, project=repo,
                                           sessions=sessions))

        threads = [threading.Thread(target=run, args=(s,)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(reports) == clients
        for report in reports:
            assert report.internal == [], report.internal[:5]
            assert report.undocumented == [], report.undocumented[:5]
        assert d.call("daemon.drain", {"timeout_s": 60})["drained"]
        assert d.call("daemon.ping") == "pong"
        assert "method failed" not in d.log_text()
        outcomes: dict[str, int] = {}
        for report in reports:
            for k, v in report.outcomes.items():
                outcomes[k] = outcomes.get(k, 0) + v
        print(f"  outcomes over {clients} client(s): {outcomes}")
        return sum(r.calls for r in reports)
    finally:
        d.stop()
        d.cleanup()
        stub.__exit__(None, None, None)


def fuzz_methods(rng: random.Random) -> int:
    return _fuzz_methods(rng, 1)


def fuzz_methods_concurrent(rng: random.Random) -> int:
    return _fuzz_methods(rng, 4)


def main() -> dict[str, Any]:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    rng = random.Random(20261130)
    results: dict[str, Any] = {}
    print(f"fuzz: {CASES} cases per target, seed 20261130")
    for name, fn in [("dispatch", fuzz_dispatch), ("frontmatter", fuzz_frontmatter),
                     ("imports", fuzz_imports), ("index", fuzz_index), ("secrets", fuzz_secrets),
                     ("methods", fuzz_methods), ("methods×4", fuzz_methods_concurrent)]:
        t0 = time.perf_counter()
        n = fn(rng)
        dt = time.perf_counter() - t0
        results[name] = {"cases": n, "seconds": round(dt, 3)}
        print(f"  {name:<12} {n:>6} cases  {dt:6.2f} s  ({dt / n * 1e6:7.1f} µs/case)  ok")
    save("fuzz", results)
    return results


if __name__ == "__main__":
    main()
