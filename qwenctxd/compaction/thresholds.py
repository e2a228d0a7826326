"""The three compaction thresholds (SPEC §S3, seed §7.1) and the consecutive-failure breaker.

For a context window ``W`` and a fraction ``pct`` (default 0.7)::

    auto = max(pct·W, W − SUMMARY_RESERVE − AUTO_BUFFER)           # W − 20 000 − 13 000
    warn = max(0, max((pct − 0.1)·W, auto − WARN_BUFFER))          # auto − 20 000
    hard = min(W, max(W − SUMMARY_RESERVE − HARD_BUFFER, auto + HARD_BUFFER))

Each threshold takes the larger of a proportional and an absolute branch: on small windows the
absolute branch goes negative and the proportion rules; on large windows the fixed ~33 000-token
reserve rules instead of 30 % of the window. ``hard ≥ auto ≥ warn`` always holds.

This follows the SPEC, which differs from current upstream Qwen Code (default 0.85, ``auto`` is
the *smaller* branch, ``warn = auto − 20 000``).

``warn`` → usage level "warn" and a notification; ``auto`` → compress before returning the
prompt; ``hard`` → compress even when the :class:`Breaker` is open. Arithmetic is exact
(fractions of the decimal ``pct``), so 0.7 − 0.1 is 0.6 and not 0.59999…; results are floored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

__all__ = [
    "AUTO_BUFFER",
    "DEFAULT_PCT",
    "HARD_BUFFER",
    "MAX_CONSECUTIVE_FAILURES",
    "SUMMARY_RESERVE",
    "WARN_BUFFER",
    "Breaker",
    "Level",
    "Thresholds",
    "compute_thresholds",
    "context_left_pct",
    "level",
]

DEFAULT_PCT = 0.7
SUMMARY_RESERVE = 20_000
"""Output budget of the summary request, reserved out of the window."""
AUTO_BUFFER = 13_000
WARN_BUFFER = 20_000
HARD_BUFFER = 3_000
MIN_PCT = 0.01
MAX_CONSECUTIVE_FAILURES = 3

Level = Literal["ok", "warn", "auto", "hard"]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Token counts at which a prompt reaches each level (``warn ≤ auto ≤ hard``)."""

    warn: int
    auto: int
    hard: int


def _pct(pct: float) -> Fraction:
    if not isinstance(pct, int | float) or not math.isfinite(pct):
        pct = DEFAULT_PCT
    pct = min(1.0, max(MIN_PCT, float(pct)))
    # repr() is the shortest decimal that round-trips, so 0.7 becomes exactly 7/10.
    return Fraction(repr(pct))


def compute_thresholds(window: int, pct: float = DEFAULT_PCT) -> Thresholds:
    """The thresholds for a ``window``-token context at fraction ``pct``.

    ``pct`` is clamped to [0.01, 1] (a non-finite value means the default 0.7); a negative
    window counts as 0. Exactly the SPEC §S3 formula, floored to ints.
    """
    w = max(0, int(window))
    p = _pct(pct)
    auto = max(p * w, Fraction(w - SUMMARY_RESERVE - AUTO_BUFFER))
    warn = max(Fraction(0), (p - Fraction(1, 10)) * w, auto - WARN_BUFFER)
    hard = min(Fraction(w), max(Fraction(w - SUMMARY_RESERVE - HARD_BUFFER), auto + HARD_BUFFER))
    return Thresholds(warn=math.floor(warn), auto=math.floor(auto), hard=math.floor(hard))


def level(tokens: int, th: Thresholds) -> Level:
    """The highest threshold ``tokens`` has reached (each boundary is inclusive)."""
    if tokens >= th.hard:
        return "hard"
    if tokens >= th.auto:
        return "auto"
    if tokens >= th.warn:
        return "warn"
    return "ok"


def context_left_pct(tokens: int, window: int) -> float:
    """Percentage (0–100) of ``window`` not used by ``tokens``; 0.0 for a non-positive window."""
    if window <= 0:
        return 0.0
    return min(100.0, max(0.0, (window - tokens) * 100.0 / window))


class Breaker:
    """Consecutive-failure circuit breaker for full compression.

    After ``max_failures`` (3) failed compressions in a row the breaker is *open*: non-forced
    (threshold-triggered) compressions become no-ops so a session that cannot be compressed does
    not burn a side query on every turn. Forced ones (the hard threshold, ``session.compress``)
    still run, and a successful one closes the breaker. Call :meth:`record` only for attempts
    that actually ran, not for no-ops below the threshold.
    """

    __slots__ = ("failures", "max_failures")

    def __init__(self, max_failures: int = MAX_CONSECUTIVE_FAILURES) -> None:
        self.max_failures = max(1, max_failures)
        self.failures = 0

    @property
    def is_open(self) -> bool:
        """True once ``max_failures`` consecutive failures have been recorded."""
        return self.failures >= self.max_failures

    def allow(self, forced: bool) -> bool:
        """Whether a compression may run now: always when forced, otherwise only while closed."""
        return forced or not self.is_open

    def record(self, success: bool) -> None:
        """Record an attempt's outcome: success resets the count, failure increments it.

        A non-forced attempt can only have run while the breaker was closed, so a success while
        open is necessarily a forced one, which closes the breaker as the SPEC requires.
        """
        self.failures = 0 if success else self.failures + 1

    def __repr__(self) -> str:
        return f"Breaker(failures={self.failures}, open={self.is_open})"
