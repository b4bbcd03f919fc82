"""The pure decisions of the batch-size search: the next size to try, why the search ended and
the gradient-accumulation plan (no TensorFlow, tested without hardware)."""

from __future__ import annotations

import math


def next_candidate(
    trials: list[tuple[int, bool]], *, start: int, max_batch_size: int, multiple_of: int
) -> int | None:
    """The next per-replica batch size to try, or None when the search is over."""
    if not trials:
        return min(start, max_batch_size)
    fits = [b for b, ok in trials if ok]
    fails = [b for b, ok in trials if not ok]
    if not fits:  # even the first size failed: halve down, to 1
        return min(fails) // 2 or None
    lo = max(fits)
    if not fails:  # still growing by powers of two
        return None if lo >= max_batch_size else min(lo * 2, max_batch_size)
    hi = min(fails)
    mid = (lo + hi) // 2
    if multiple_of > 1 and mid >= multiple_of:
        mid = mid // multiple_of * multiple_of
    return None if mid <= lo or mid >= hi else mid


def stopped_by(trials: list[tuple[int, bool]], *, max_batch_size: int, ran_out: bool) -> str:
    """Why a search over `trials` ended (see `BatchSizeResult.stopped_by`); pure."""
    fits = [b for b, ok in trials if ok]
    if not fits and trials and min(b for b, _ in trials) == 1:
        return "nothing_fits"
    if ran_out:
        return "max_trials"
    if fits and max(fits) >= max_batch_size:
        return "max_batch_size"
    return "limit"


def accumulation_plan(target: int, max_per_replica: int, replicas: int) -> tuple[int, int]:
    """(steps, per-replica batch) reaching `target` global examples per optimizer update: an
    exact split where one exists, else the per-replica batch rounded up (at least `target`)."""
    per_step = max_per_replica * replicas
    steps = max(1, math.ceil(target / per_step))
    for s in range(steps, steps * 2 + 1):
        if target % (replicas * s) == 0 and target // (replicas * s) <= max_per_replica:
            return s, target // (replicas * s)
    return steps, math.ceil(target / (replicas * steps))
