"""A table's columns as series (pure): NaN-aware reductions, the sessions (a `fit` or `record`
appended to a file restarts `elapsed_s` or `(epoch, step)`), one time axis, epochs, steps."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from tfgpu._internal.helpers import stats
from tfgpu.report._read import Table


def finite_max(values) -> float:
    v = stats.finite(values)
    return max(v) if v else math.nan


_GPU_UTIL = re.compile(r"^gpu(\d+)_util_pct$")


def gpu_indices(table: Table) -> list[int]:
    return sorted(int(m.group(1)) for c in table.columns if (m := _GPU_UTIL.match(c)))


def epoch_starts(
    times: list[float], epochs: list[float], sessions: list[int]
) -> list[tuple[float, int]]:
    """(time, epoch) where each epoch begins; a new session starts its epochs afresh."""
    starts, last = [], None
    firsts = set(sessions)
    for k, (t, e) in enumerate(zip(times, epochs)):
        if k in firsts:
            last = None
        if math.isfinite(e) and e != last:
            starts.append((t, int(e)))
            last = e
    return starts


def timeline_sessions(table: Table) -> list[int]:
    """Row indices where a sampling session begins: 0, then wherever `elapsed_s` restarts."""
    starts, previous = [0] if table.rows else [], None
    for k, elapsed in enumerate(table.col("elapsed_s")):
        if not math.isfinite(elapsed):
            continue
        if previous is not None and elapsed < previous:
            starts.append(k)
        previous = elapsed
    return starts


def steps_sessions(table: Table) -> list[int]:
    """Row indices where a `fit` begins: 0, then wherever the (epoch, step) order restarts."""
    starts, previous = [0] if table.rows else [], None
    for k, r in enumerate(table.rows):
        e, step = r.get("epoch", math.nan), r.get("step", math.nan)
        if not (math.isfinite(e) and math.isfinite(step)):
            continue
        if previous is not None and (e, step) <= previous:
            starts.append(k)
        previous = (e, step)
    return starts


def steps_per_row(last_steps: list[float], starts: Sequence[int] = ()) -> list[int]:
    """Steps each `steps.csv` row covers, from the last step of each row within an epoch."""
    counts, previous = [], -1
    firsts = set(starts)
    for k, step in enumerate(last_steps):
        if k in firsts:
            previous = -1
        if not math.isfinite(step):
            counts.append(1)
            continue
        counts.append(int(step) - previous if step > previous else int(step) + 1)
        previous = int(step)
    return counts


def step_begins(
    ends: list[float], ms: list[float], counts: list[int], starts: Sequence[int] = ()
) -> list[float]:
    """When each `steps.csv` row's step(s) began: its end minus the time its steps took, but
    never before the previous row of its session ended (an overstated step count, a clock
    that jumped). A session's first row is left as computed (its caller bounds it)."""
    begins, previous_end = [], math.nan
    firsts = set(starts)
    for k, (end, t, n) in enumerate(zip(ends, ms, counts)):
        if k in firsts:
            previous_end = math.nan
        begin = end - t * n / 1e3 if math.isfinite(t) else end
        if begin < previous_end:  # False when either is NaN
            begin = previous_end
        begins.append(begin)
        if math.isfinite(end):
            previous_end = end
    return begins


def time_axis(table: Table, starts: list[int]) -> list[float]:
    """Seconds since the first sample from `time`, for every row; without a `time` column,
    the sessions' `elapsed_s` laid end to end."""
    times = table.col("time")
    finite = stats.finite(times)
    if finite:
        return [t - finite[0] for t in times]
    elapsed = table.col("elapsed_s")
    if not stats.finite(elapsed):
        return [float(k) for k in range(len(table.rows))]
    out, offset, last = [], 0.0, 0.0
    firsts = set(starts)
    for k, v in enumerate(elapsed):
        if k in firsts and k > 0:
            offset = last
        x = offset + v if math.isfinite(v) else math.nan
        out.append(x)
        if math.isfinite(x):
            last = x
    return out


def span(xs: list[float]) -> float:
    finite = stats.finite(xs)
    return finite[-1] - finite[0] if finite else math.nan


def broken(values: list[float], starts: list[int]) -> list[float]:
    """`values` with a NaN before each session after the first: plotted lines break there."""
    out, firsts = [], set(starts)
    for k, v in enumerate(values):
        if k in firsts and k > 0:
            out.append(math.nan)
        out.append(v)
    return out
