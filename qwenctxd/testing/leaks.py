"""What a test run left outside its tmp dirs: snapshots of a few directories before and after.

tests/conftest.py takes a :func:`snapshot` when the session starts and fails the run when
:func:`leaks` finds something new at the end. Other processes share the machine (three more
engineers' suites, pip, editors), so each watched directory says which new names count:

* ``/`` — every new entry (nothing on a working machine creates entries in ``/``; the method
  fuzzer once left ``/QWEN.md`` there).
* the real ``$HOME`` (the one the suite started with, before any test set a scratch HOME) —
  every new top-level entry except shell and tool dotfiles other programs write
  (:data:`HOME_IGNORED`), and every new entry in the daemon's own places below it
  (``~/.qwen``, ``~/.config/qwenctxd``, ``~/.local/state/qwenctxd``).
* the top of ``/tmp`` — new entries that only this code writes (:data:`OUR_NAMES`: instruction
  and memory files, ``.qwen``) and the scratch trees :class:`~qwenctxd.testing.spawn.SpawnedDaemon`
  made in this process and did not remove. Random names (``tmpXXXX``, another suite's
  ``qcd-*``) cannot be told apart from other processes' and are not checked.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: File names qwenctxd writes (instructions, memory, its config dir): new ones in /tmp are ours.
OUR_NAMES = frozenset({"QWEN.md", "AGENTS.md", "GEMINI.md", "QWEN.local.md", "MEMORY.md",
                       ".qwen", "qwenctxd.log", "qwenctxd.sock", "qwenctxd.pid"})
#: Top-level names in a home directory that shells and tools create on their own.
HOME_IGNORED = (".*history", ".*_history", ".*hsts", ".lesshst", ".viminfo", ".cache", ".npm",
                ".local", ".config", ".python_history", ".wget-hsts", ".sudo_as_admin*",
                ".pki", ".dbus", ".ipython", ".jupyter", ".node_repl_history", ".claude*")


@dataclass(frozen=True)
class Watch:
    """One directory and the rule for which of its new entries count as left behind."""

    root: Path
    counts: Callable[[str], bool]


def _listing(root: Path) -> set[str]:
    try:
        return set(os.listdir(root))
    except OSError:
        return set()


def snapshot(watches: Iterable[Watch]) -> dict[Path, set[str]]:
    """The names in each watched directory now."""
    return {w.root: _listing(w.root) for w in watches}


def leaks(before: dict[Path, set[str]], watches: Iterable[Watch]) -> list[str]:
    """Paths new since ``before`` that their watch counts as left behind, sorted."""
    found = []
    for w in watches:
        for name in _listing(w.root) - before.get(w.root, set()):
            if w.counts(name):
                found.append(str(w.root / name))
    return sorted(found)


def default_watches(real_home: Path, spawned_roots: Callable[[], set[Path]]) -> list[Watch]:
    """The checks of the test suite (see the module docstring)."""
    def home_counts(name: str) -> bool:
        return not any(fnmatch.fnmatch(name, pat) for pat in HOME_IGNORED)

    tmp = Path("/tmp")
    watches = [
        Watch(Path("/"), lambda name: True),
        Watch(tmp, lambda name: name in OUR_NAMES or tmp / name in spawned_roots()),
    ]
    if real_home.is_dir() and real_home != Path("/") and real_home != tmp:
        watches.append(Watch(real_home, home_counts))
        for below in (".qwen", ".config/qwenctxd", ".local/state/qwenctxd", ".config",
                      ".local/state"):
            watches.append(Watch(real_home / below,
                                 (lambda name: name in ("qwenctxd",)) if below in (
                                     ".config", ".local/state") else (lambda name: True)))
    return watches
