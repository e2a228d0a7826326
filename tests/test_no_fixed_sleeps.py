"""Tests synchronise on conditions, never on fixed sleeps.

Every ``sleep(`` call (and Neovim's ``vim.wait(ms)`` without a condition) written in tests/ (Python, or Lua and ``python -c`` code inside strings)
must say why it is not a synchronisation with a ``sleep-ok: <reason>`` comment on the same
line: a delay that opens the window under test, a gap between two requests that is itself
the input, a target process that must stay alive. Waiting for something to happen goes through
:mod:`qwenctxd.testing.wait` (``until`` / ``until_async``), which polls a condition.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# a sleep call, or Neovim's vim.wait(ms) without a condition (a fixed wait by another name)
SLEEP_CALL = re.compile(r"\bsleep\s*\(|\bvim\.wait\(\s*[\w.]+\s*\)")
ALLOWED = re.compile(r"sleep-ok:\s*\S")


def fixed_sleeps(text: str) -> list[tuple[int, str]]:
    """``(line number, stripped line)`` of every ``sleep(`` call without a ``sleep-ok:``."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if SLEEP_CALL.search(line) and not ALLOWED.search(line)]


def test_the_scanner_flags_unmarked_sleeps_only() -> None:
    sample = "\n".join([
        "time.sleep(0.5)",
        "await anyio.sleep (1)",
        "vim.loop.sleep(20)",
        "time.sleep(gap_s)  # sleep-ok: the gap under test",
        "vim.loop.sleep(20)  -- sleep-ok: blocks the event loop on purpose",
        "time.sleep(1)  # sleep-ok:",  # a marker without a reason does not count
        "await anyio.sleep_forever()",
        "d.call('debug.sleep_task', {'seconds': 1})",
        "cmd = 'sleep 30; echo too-late'",
        "vim.wait(200)",
        "vim.wait(3000, function() return done end, 10)",
    ])
    assert fixed_sleeps(sample) == [(1, "time.sleep(0.5)"), (2, "await anyio.sleep (1)"),
                                    (3, "vim.loop.sleep(20)"), (6, "time.sleep(1)  # sleep-ok:"),
                                    (10, "vim.wait(200)")]


def test_no_fixed_sleeps_in_the_tests() -> None:
    found: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path.resolve() == Path(__file__).resolve():
            continue
        rel = path.relative_to(TESTS).as_posix()
        hits = fixed_sleeps(path.read_text(encoding="utf-8"))
        if hits:
            found[rel] = hits
    report = "\n".join(f"tests/{rel}:{n}: {line}" for rel, hits in found.items()
                       for n, line in hits)
    assert not found, (
        "fixed sleeps in tests: wait for a condition with qwenctxd.testing.wait.until / "
        "until_async, or mark a sleep that is the thing under test with "
        "'# sleep-ok: <reason>'\n" + report)
