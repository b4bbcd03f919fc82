"""The "Findings from the GPU counters" section: each timeline session's per-GPU counters, as
the sampler aggregates them, through `diagnose`'s rules (`_internal.adapters.gpu_counters`)."""

from __future__ import annotations

import functools
import math
import operator

from tfgpu._internal.adapters import gpu_counters as counters
from tfgpu._internal.helpers import stats
from tfgpu.report._read import Artifact, Table
from tfgpu.report._series import finite_max, gpu_indices, timeline_sessions

# Per-GPU columns only a monitor that reads the GPU counters writes: a timeline without any
# of them is from an older tfgpu, and what it lacks is not "unseen".
_COUNTER_COLUMNS = ("sm_active_pct", "tensor_active_pct", "pcie_tx_mib_s", "pcie_rx_mib_s")
# Which columns each of `counters.unseen`'s notes is about.
_UNSEEN_COLUMNS = {
    counters.GPM_UNSEEN: ("sm_active_pct", "tensor_active_pct"),
    counters.PCIE_UNSEEN: ("pcie_tx_mib_s", "pcie_rx_mib_s"),
    counters.POWER_UNSEEN: ("power_limit_w", "throttle_reasons"),
}
_NO_BITMASK = 2.0**64  # NVML's throttle reasons are an unsigned 64-bit mask
_RULES = (counters.tensor_cores_idle, counters.small_kernels, counters.clocks_throttled)


def _bits_or(values: list[float]) -> float:
    """The bitwise OR of the bitmasks among `values` (as a float), NaN when there is none."""
    masks = [int(v) for v in stats.finite(values) if 0 <= v < _NO_BITMASK]
    return float(functools.reduce(operator.or_, masks)) if masks else math.nan


def _window_counters(table: Table, gpu: int, a: int, b: int) -> counters.Counters:
    """GPU `gpu`'s counters over rows `a:b` of a timeline, aggregated as for `diagnose`."""

    def col(name: str) -> list[float]:
        return table.col(f"gpu{gpu}_{name}")[a:b]

    pcie = [
        m for m in (stats.mean(col("pcie_tx_mib_s")), stats.mean(col("pcie_rx_mib_s"))) if m == m
    ]
    return counters.Counters(
        util_pct_mean=stats.mean(col("util_pct")),
        sm_active_pct_mean=stats.mean(col("sm_active_pct")),
        tensor_active_pct_mean=stats.mean(col("tensor_active_pct")),
        pcie_mib_s_mean=sum(pcie) if pcie else math.nan,  # inf past the float maximum
        power_w_mean=stats.mean(col("power_w")),
        power_limit_w_max=finite_max(col("power_limit_w")),
        throttle_reasons_any=_bits_or(col("throttle_reasons")),
        sm_clock_mhz_mean=stats.mean(col("sm_clock_mhz")),
    )


def _step_time_in(steps: list[Table], first: float, last: float) -> float:
    """Median seconds per step of the steps rows that ended within [first, last] (NaN)."""
    times = [
        r.get("step_time_s", math.nan)
        for table in steps
        for r in table.rows
        if first <= r.get("time", math.nan) <= last
    ]
    return stats.median([t for t in stats.finite(times) if t > 0])


def _gpu_list(gpus: list[int]) -> str:
    names = [str(i) for i in gpus]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _counter_lines(table: Table, name: str, steps: list[Table]) -> list[str]:
    """One timeline's findings from its GPU counters, per session and GPU ([] if none)."""
    gpus = gpu_indices(table)
    if not (gpus and table.rows):
        return []
    recorded = any(f"gpu{i}_{c}" in table.columns for i in gpus for c in _COUNTER_COLUMNS)
    starts = timeline_sessions(table)
    ends = [*starts[1:], len(table.rows)]
    times = table.col("time")
    items: list[str] = []
    unseen: dict[str, dict[int, None]] = {}  # note -> the GPUs it is about, in order
    fixes: set[str] = set()  # each fix written out once per file
    for number, (a, b) in enumerate(zip(starts, ends), 1):
        span = stats.finite(times[a:b])
        step_time = _step_time_in(steps, span[0], span[-1]) if span else math.nan
        where = f" (session {number})" if len(starts) > 1 else ""
        for i in gpus:
            c = _window_counters(table, i, a, b)
            found = [rule(c) for rule in _RULES] + [counters.pcie_unjudged(c, step_time)]
            for f in filter(None, found):
                fix = "the same as above" if f.recommendation in fixes else f.recommendation
                fixes.add(f.recommendation)
                items += [
                    f"- **GPU {i}**{where}, {f.severity}: **{f.title}**. {f.detail()}",
                    f"  Fix: {fix}",
                ]
            for note in counters.unseen(c, with_util=False) if recorded else []:
                if any(f"gpu{i}_{col}" in table.columns for col in _UNSEEN_COLUMNS.get(note, ())):
                    unseen.setdefault(note, {})[i] = None
    if not (items or recorded):
        return []  # an older timeline with nothing to say: as before
    lines = [f"### `{name}`", ""]
    if not any(line.startswith("- **GPU") and ", info:" not in line for line in items):
        lines += [f"No finding on GPU {_gpu_list(gpus)}.", ""]
    lines += items
    lines += [f"- Not seen on GPU {_gpu_list(list(g))}: {note}." for note, g in unseen.items()]
    return [*lines, ""]


def counter_section(
    timelines: list[tuple[Artifact, Table]], steps: dict[str, list[Table]]
) -> list[str]:
    """The section "Findings from the GPU counters", each timeline's after the other."""
    body: list[str] = []
    for artifact, table in timelines:
        body += _counter_lines(table, artifact.path.name, steps.get(artifact.worker, []))
    if not body:
        return []  # older timelines, host-only runs
    return [
        "## Findings from the GPU counters",
        "",
        "What utilization hides, from each timeline's per-GPU means (per session where a "
        "file holds several), with the thresholds `tfgpu.diagnose` uses (docs/diagnosis.md). "
        "A timeline knows nothing of the model: `tfgpu.diagnose(model, data)` names the "
        "layers, the precision policy and the batch's bytes behind a finding.",
        "",
        *body,
    ]
