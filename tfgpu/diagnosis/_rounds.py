"""Pure statistics of the interleaved rounds: medians, their confidence intervals, the
input-wait verdict and a probe's gain (no TensorFlow)."""

from __future__ import annotations

import math
from typing import Any

from tfgpu import _stats
from tfgpu.diagnosis._facts import (
    _MIN_ROUNDS,
    CONFIDENCE,
    INPUT_BOUND_HIGH,
    INPUT_BOUND_MODERATE,
    INPUT_WAIT_MIN_S,
)


def _medians(rounds: list[tuple[float, float]]) -> tuple[float, float]:
    """(median of the first values, median of the second) of paired rounds. Pure.

    Example:

    >>> _medians([(1.0, 4.0), (3.0, 2.0), (2.0, 3.0)])
    (2.0, 3.0)
    """
    return _stats.median(a for a, _ in rounds), _stats.median(b for _, b in rounds)


def _median_interval(values: list[float]) -> tuple[float, float, float]:
    """(low, high, confidence) of a distribution-free confidence interval of the median. Pure.

    The interval is the k-th smallest to the k-th largest value, k the largest with binomial
    coverage `1 - 2 P(Bin(n, 1/2) < k)` >= `CONFIDENCE`; with fewer than 5 values no k
    reaches it and the interval is the full range (coverage 75% for 3 values, 87.5% for 4).

    Example:

    >>> _median_interval([3.0, 1.0, 2.0])
    (1.0, 3.0, 0.75)
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0.0

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= CONFIDENCE:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def _wait_and_share(compute_s: float, real_s: float) -> tuple[float, float]:
    wait = max(0.0, real_s - compute_s)
    return wait, (wait / real_s if real_s > 0 else 0.0)


def _share_verdict(rounds: list[tuple[float, float]]) -> dict[str, Any]:
    """The input-bound level the interleaved rounds support, with their noise. Pure.

    Each round (device-resident step, real step) gives a wait and its share of the step. The
    level is decided at both ends of the median's confidence interval (of the share and of
    the wait); when they differ, the rounds cannot tell the level: `"inconclusive"`. Fewer
    than `_MIN_ROUNDS` rounds (the budget ran out) cannot tell the noise: `"inconclusive"` too.

    Returns:
        dict with `level`, `share` (median), `wait_s` (median), `low`, `high` (the share's
        interval), `confidence`, `rounds`.
    """
    waits = [_wait_and_share(c, r)[0] for c, r in rounds]
    shares = [_wait_and_share(c, r)[1] for c, r in rounds]
    low, high, confidence = _median_interval(shares)
    wait_low, wait_high, _ = _median_interval(waits)
    at_low, at_high = _input_level(low, wait_low), _input_level(high, wait_high)
    return {
        "level": at_low if at_low == at_high and len(rounds) >= _MIN_ROUNDS else "inconclusive",
        "share": _stats.median(shares),
        "wait_s": _stats.median(waits),
        "wait_low_s": wait_low,
        "low": low,
        "high": high,
        "confidence": confidence,
        "rounds": len(rounds),
    }


def _probe_gain(
    rounds: list[tuple[float, float]], base_s: float | None, variant_s: float | None
) -> tuple[float | None, float, float]:
    """(gain, low, high) of a probe: baseline / variant time, with the interval of the
    per-round ratios (a point without rounds). Pure."""
    if rounds:
        ratios = [b / v for b, v in rounds if v > 0]
        if not ratios:
            return None, math.nan, math.nan
        base, variant = _medians(rounds)
        gain = base / variant
        low, high, _ = _median_interval(ratios)
        return gain, min(low, gain), max(high, gain)
    if base_s and variant_s and variant_s > 0:
        gain = base_s / variant_s
        return gain, gain, gain
    return None, math.nan, math.nan


def _probe_settled(rounds: list[tuple[float, float]], threshold: float) -> bool:
    """Whether a probe's ratio interval lies on one side of `threshold`. Pure."""
    _, low, high = _probe_gain(rounds, None, None)
    return low >= threshold or high < threshold


def _input_level(share: float, wait_s: float = math.inf) -> str:
    """`"high"`, `"moderate"` or `"no"` from the wait's share of the step and its length."""
    if wait_s < INPUT_WAIT_MIN_S:
        return "no"
    if share >= INPUT_BOUND_HIGH:
        return "high"
    if share >= INPUT_BOUND_MODERATE:
        return "moderate"
    return "no"
