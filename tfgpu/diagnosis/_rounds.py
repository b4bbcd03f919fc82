"""The input-wait verdict of the interleaved rounds (pure; statistics from `timing`)."""

from __future__ import annotations

import math
from typing import Any

from tfgpu._internal.helpers import stats
from tfgpu._internal.measure.rules import MIN_ROUNDS, median_interval
from tfgpu.diagnosis._facts import INPUT_BOUND_HIGH, INPUT_BOUND_MODERATE, INPUT_WAIT_MIN_S


def wait_and_share(compute_s: float, real_s: float) -> tuple[float, float]:
    wait = max(0.0, real_s - compute_s)
    return wait, (wait / real_s if real_s > 0 else 0.0)


def share_verdict(rounds: list[tuple[float, float]]) -> dict[str, Any]:
    """The input-bound level the rounds (device-resident, real) support, with their noise. Pure.

    The level is decided at both ends of the median's confidence interval (of the share and
    of the wait): `"inconclusive"` when they differ, or with fewer than `MIN_ROUNDS` rounds.

    Returns:
        dict with `level`, `share` (median), `wait_s` (median), `low`, `high` (the share's
        interval), `confidence`, `rounds`.
    """
    waits = [wait_and_share(c, r)[0] for c, r in rounds]
    shares = [wait_and_share(c, r)[1] for c, r in rounds]
    low, high, confidence = median_interval(shares)
    wait_low, wait_high, _ = median_interval(waits)
    at_low, at_high = input_level(low, wait_low), input_level(high, wait_high)
    return {
        "level": at_low if at_low == at_high and len(rounds) >= MIN_ROUNDS else "inconclusive",
        "share": stats.median(shares),
        "wait_s": stats.median(waits),
        "wait_low_s": wait_low,
        "low": low,
        "high": high,
        "confidence": confidence,
        "rounds": len(rounds),
    }


def input_level(share: float, wait_s: float = math.inf) -> str:
    """`"high"`, `"moderate"` or `"no"` from the wait's share of the step and its length."""
    if wait_s < INPUT_WAIT_MIN_S:
        return "no"
    if share >= INPUT_BOUND_HIGH:
        return "high"
    if share >= INPUT_BOUND_MODERATE:
        return "moderate"
    return "no"
