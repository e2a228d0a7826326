"""``python -m bench [NAME ...]``: run the named benchmarks (default: all)."""

from __future__ import annotations

import importlib
import sys

ALL = ["ping", "request_path", "instructions", "sessions", "skills", "recall", "recall_quality", "recall_cost", "qwenctl_startup", "extraction",
       "shell_classify", "fuzz", "mcp", "proxy", "connection", "deadlines", "incremental", "reliability",
       "vs_qwen", "secrets", "session_search"]


def main(argv: list[str]) -> int:
    names = argv or ALL
    for name in names:
        if name not in ALL:
            sys.stderr.write(f"unknown benchmark {name!r}; known: {', '.join(ALL)}\n")
            return 2
    for name in names:
        print(f"== {name}")
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
