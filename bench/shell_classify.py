"""The background agents' shell gate: :func:`qwenctxd.agents.shell_readonly.classify`.

Every ``run_shell_command`` a background agent (extraction, dream) asks for is classified before
it runs, so its cost sits on the agent's tool path. Measured in one process over a fixed mix of
commands (read-only pipelines, refused writes, nested ``bash -c``, a 4 KB script): the first call
(tree-sitter parser warm-up), then p50/p99 over ``ROUNDS`` passes of the mix. The baseline in
the same run is ``shlex.split`` of the same commands, the least any shell-aware check must do
(tokenising only, no structure); the ratio shows what the AST walk costs on top of it.
"""

from __future__ import annotations

import shlex
import statistics
import time

from bench.common import percentile, save

ROUNDS = 400
COMMANDS = [
    "git log --oneline | head -5 && cat x > /dev/null",
    "ls -la src/",
    "grep -rn 'def main' --include='*.py' . | sort | uniq -c",
    "find . -name '*.md' -maxdepth 3 -type f",
    "git diff HEAD~3 -- README.md",
    "rm -rf build/",  # refused
    "sed -i 's/a/b/' notes.txt",  # refused
    "bash -c 'cat README.md | wc -l'",
    "echo \"$(git rev-parse HEAD)\" && wc -c < setup.py",
    "cat a.txt b.txt | tr a-z A-Z > out.txt",  # refused
    " && ".join(f"grep -c pattern{i} file{i}.txt" for i in range(120)),  # ~4 KB
]


def _time(fn, command: str) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn(command)
    return (time.perf_counter() - t0) * 1e6


def main() -> None:
    t0 = time.perf_counter()
    from qwenctxd.agents.shell_readonly import classify

    import_ms = (time.perf_counter() - t0) * 1000
    first_us = _time(classify, COMMANDS[0])
    verdicts = {c[:60]: classify(c).read_only for c in COMMANDS}
    ours: list[float] = []
    base: list[float] = []
    per_command: dict[str, list[float]] = {c: [] for c in COMMANDS}
    for _ in range(ROUNDS):
        for c in COMMANDS:
            us = _time(classify, c)
            ours.append(us)
            per_command[c].append(us)
            base.append(_time(shlex.split, c))
    p50, p99 = statistics.median(ours), percentile(ours, 0.99)
    b50 = statistics.median(base)
    result = {
        "import_ms": round(import_ms, 1),
        "first_call_us": round(first_us, 1),
        "classify_p50_us": round(p50, 1),
        "classify_p99_us": round(p99, 1),
        "shlex_p50_us": round(b50, 1),
        "ratio_p50": round(p50 / b50, 2),
        "per_command_p50_us": {c[:60]: round(statistics.median(v), 1)
                               for c, v in per_command.items()},
        "read_only": verdicts,
        "calls": len(ours),
    }
    path = save("shell_classify", result)
    print(f"import {import_ms:.1f} ms, first call {first_us:.0f} µs")
    print(f"classify p50 {p50:.0f} µs  p99 {p99:.0f} µs  (shlex.split p50 {b50:.0f} µs, "
          f"{p50 / b50:.1f}×) over {len(ours)} calls")
    for c, v in result["per_command_p50_us"].items():
        print(f"  {v:8.1f} µs  {'ro ' if verdicts[c] else 'no '} {c}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
