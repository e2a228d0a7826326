"""Compaction thresholds (SPEC §S3 formula), levels, context-left and the failure breaker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwenctxd.compaction.thresholds import (
    Breaker,
    Thresholds,
    compute_thresholds,
    context_left_pct,
    level,
)

# Worked by hand from the SPEC formula:
#   auto = max(pct·W, W − 33 000)
#   warn = max(0, max((pct − 0.1)·W, auto − 20 000))
#   hard = min(W, max(W − 23 000, auto + 3 000))
TABLE = [
    # 32 000 @0.7: auto = max(22 400, −1 000) = 22 400; warn = max(19 200, 2 400) = 19 200;
    #              hard = min(32 000, max(9 000, 25 400)) = 25 400
    (32_000, 0.7, 19_200, 22_400, 25_400),
    # 128 000 @0.7: auto = max(89 600, 95 000) = 95 000; warn = max(76 800, 75 000) = 76 800;
    #               hard = min(128 000, max(105 000, 98 000)) = 105 000
    (128_000, 0.7, 76_800, 95_000, 105_000),
    # 1 000 000 @0.7: auto = max(700 000, 967 000) = 967 000; warn = max(600 000, 947 000) = 947 000;
    #                 hard = min(1 000 000, max(977 000, 970 000)) = 977 000
    (1_000_000, 0.7, 947_000, 967_000, 977_000),
    # 128 000 @0.5: auto = max(64 000, 95 000) = 95 000; warn = max(51 200, 75 000) = 75 000;
    #               hard = max(105 000, 98 000) = 105 000
    (128_000, 0.5, 75_000, 95_000, 105_000),
    # 32 000 @0.5: auto = max(16 000, −1 000) = 16 000; warn = max(12 800, −4 000) = 12 800;
    #              hard = min(32 000, max(9 000, 19 000)) = 19 000
    (32_000, 0.5, 12_800, 16_000, 19_000),
    # 200 000 @0.7: auto = max(140 000, 167 000) = 167 000; warn = max(120 000, 147 000) = 147 000;
    #               hard = max(177 000, 170 000) = 177 000
    (200_000, 0.7, 147_000, 167_000, 177_000),
    # 64 000 @0.9: auto = max(57 600, 31 000) = 57 600; warn = max(51 200, 37 600) = 51 200;
    #              hard = min(64 000, max(41 000, 60 600)) = 60 600
    (64_000, 0.9, 51_200, 57_600, 60_600),
    # 10 000 @1.0: auto = 10 000; warn = max(9 000, −10 000) = 9 000; hard = min(10 000, 13 000)
    (10_000, 1.0, 9_000, 10_000, 10_000),
]


@pytest.mark.parametrize(("window", "pct", "warn", "auto", "hard"), TABLE)
def test_table(window: int, pct: float, warn: int, auto: int, hard: int) -> None:
    assert compute_thresholds(window, pct) == Thresholds(warn=warn, auto=auto, hard=hard)


def test_default_pct_is_0_7() -> None:
    assert compute_thresholds(128_000) == compute_thresholds(128_000, 0.7)


def test_pct_clamped_and_non_finite() -> None:
    assert compute_thresholds(128_000, 5.0) == compute_thresholds(128_000, 1.0)
    assert compute_thresholds(32_000, 0.0) == compute_thresholds(32_000, 0.01)
    assert compute_thresholds(32_000, -3) == compute_thresholds(32_000, 0.01)
    assert compute_thresholds(32_000, float("nan")) == compute_thresholds(32_000, 0.7)
    # 32 000 @0.01: auto = max(320, −1 000) = 320; warn = max(0, max(−2 880, −19 680)) = 0;
    #               hard = min(32 000, max(9 000, 3 320)) = 9 000
    assert compute_thresholds(32_000, 0.01) == Thresholds(warn=0, auto=320, hard=9_000)


def test_results_are_ints_and_exact() -> None:
    th = compute_thresholds(128_000, 0.7)
    assert all(type(v) is int for v in (th.warn, th.auto, th.hard))
    # (0.7 − 0.1)·128 000 is 76 800 exactly, not 76 799 from float rounding
    assert th.warn == 76_800


def test_zero_and_negative_window() -> None:
    assert compute_thresholds(0) == Thresholds(0, 0, 0)
    assert compute_thresholds(-5) == Thresholds(0, 0, 0)


@given(st.integers(0, 10_000_000), st.floats(0.01, 1.0))
def test_ordering(window: int, pct: float) -> None:
    th = compute_thresholds(window, pct)
    assert 0 <= th.warn <= th.auto <= th.hard <= window


def test_level_boundaries() -> None:
    th = compute_thresholds(128_000, 0.7)  # warn 76 800, auto 95 000, hard 105 000
    assert level(0, th) == "ok"
    assert level(76_799, th) == "ok"
    assert level(76_800, th) == "warn"
    assert level(94_999, th) == "warn"
    assert level(95_000, th) == "auto"
    assert level(104_999, th) == "auto"
    assert level(105_000, th) == "hard"
    assert level(500_000, th) == "hard"


def test_context_left_pct() -> None:
    assert context_left_pct(0, 128_000) == 100.0
    assert context_left_pct(32_000, 128_000) == 75.0
    assert context_left_pct(128_000, 128_000) == 0.0
    assert context_left_pct(200_000, 128_000) == 0.0
    assert context_left_pct(-5, 100) == 100.0
    assert context_left_pct(10, 0) == 0.0


def test_breaker_opens_after_three_failures() -> None:
    b = Breaker()
    assert b.allow(forced=False) and not b.is_open
    b.record(False)
    b.record(False)
    assert b.allow(forced=False)
    b.record(False)
    assert b.is_open
    assert not b.allow(forced=False)
    assert b.allow(forced=True)


def test_breaker_success_resets_the_consecutive_count() -> None:
    b = Breaker()
    b.record(False)
    b.record(False)
    b.record(True)
    b.record(False)
    b.record(False)
    assert b.allow(forced=False)


def test_breaker_forced_failure_keeps_it_open_and_success_closes() -> None:
    b = Breaker()
    for _ in range(3):
        b.record(False)
    assert b.allow(forced=True)
    b.record(False)  # the forced attempt failed too
    assert not b.allow(forced=False)
    assert b.allow(forced=True)
    b.record(True)  # a forced attempt succeeded
    assert not b.is_open
    assert b.allow(forced=False)
    assert b.failures == 0


def test_breaker_custom_limit() -> None:
    b = Breaker(max_failures=1)
    b.record(False)
    assert not b.allow(forced=False)
