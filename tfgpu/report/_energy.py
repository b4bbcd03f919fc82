"""The "Energy" section: energy used per GPU and per example, from `gpu{i}_energy_j` (cumulative
since the driver loaded: only differences within a session count; docs/diagnosis.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tfgpu._internal.helpers import stats
from tfgpu.report._read import Artifact, Table
from tfgpu.report._sections import fmt
from tfgpu.report._series import gpu_indices, steps_per_row, steps_sessions, timeline_sessions


@dataclass
class _Energy:
    """Energy of one GPU over a timeline's sessions (`gpu{i}_energy_j`, cumulative J)."""

    gpu: int
    joules: float = 0.0
    seconds: float = 0.0
    spans: list[tuple[float, float]] = field(default_factory=list)  # unix times
    resets: int = 0  # sessions whose counter went backwards (driver reloaded): skipped


def _energy(table: Table) -> list[_Energy]:
    """Energy used per GPU: per session, last minus first finite `energy_j`, summed."""
    starts = timeline_sessions(table)
    ends = [*starts[1:], len(table.rows)]
    times = table.col("time")
    out = []
    for i in gpu_indices(table):
        values = table.col(f"gpu{i}_energy_j")
        if not stats.finite(values):
            continue
        e = _Energy(i)
        for a, b in zip(starts, ends):
            pairs = [(t, v) for t, v in zip(times[a:b], values[a:b]) if math.isfinite(v)]
            if len(pairs) < 2:
                continue
            (t_first, first), (t_last, last) = pairs[0], pairs[-1]
            if last < first:
                e.resets += 1
                continue
            e.joules += last - first
            if math.isfinite(t_first) and math.isfinite(t_last):
                e.seconds += t_last - t_first
                e.spans.append((t_first, t_last))
        if e.spans or e.joules or e.resets:
            out.append(e)
    return out


def _examples_in(steps: list[Table], spans: list[tuple[float, float]]) -> float:
    """Examples (examples/s x step time x steps) of the steps rows ending within `spans`, or NaN."""
    total, known = 0.0, False
    for table in steps:
        counts = steps_per_row(table.col("step"), steps_sessions(table))
        for r, n in zip(table.rows, counts):
            t = r.get("time", math.nan)
            if not any(a <= t <= b for a, b in spans):
                continue
            examples = r.get("examples_per_s", math.nan) * r.get("step_time_s", math.nan) * n
            if math.isfinite(examples):
                total += examples
                known = True
    return total if known else math.nan


def energy_section(
    timelines: list[tuple[Artifact, Table]], steps: dict[str, list[Table]]
) -> list[str]:
    """Energy used per GPU and per example, for timelines with `gpu{i}_energy_j` values."""
    rows: list[str] = []
    resets = 0
    for artifact, table in timelines:
        energies = _energy(table)
        if not energies:
            continue
        spans = sorted({s for e in energies for s in e.spans})
        examples = _examples_in(steps.get(artifact.worker, []), spans)
        each = [(str(e.gpu), e.joules, e.seconds) for e in energies]
        if len(energies) > 1:
            each.append(("all", math.fsum(e.joules for e in energies), math.nan))
        for gpu, joules, seconds in each:
            power = joules / seconds if seconds > 0 else math.nan
            per_example = joules / examples if examples > 0 else math.nan
            rows.append(
                f"| `{artifact.path.name}` | {gpu} | {fmt(joules / 1e3, '.3f')} | "
                f"{fmt(seconds, '.1f')} | {fmt(power)} | {fmt(examples, ',.0f')} | "
                f"{fmt(per_example, '.4g')} |"
            )
        resets += sum(e.resets for e in energies)
    if not rows:
        return []  # no energy counter recorded (an older timeline, an old driver)
    lines = [
        "## Energy",
        "",
        "| timeline | GPU | energy used kJ | over s | mean power W | examples | J per example |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Energy used: the GPU's energy counter (NVML, cumulative) at the last sample minus the "
        "first, per session. Examples: the rows of `steps.csv` (StepTimer) that ended in the "
        "same span (examples/s x step time x steps). n/a examples: no `steps.csv` over that "
        "span, or a batch size StepTimer could not tell (`StepTimer(batch_size=...)`).",
        "",
    ]
    if resets:
        lines += [
            f"{resets} session(s) skipped where the energy counter went backwards (the driver "
            "was reloaded).",
            "",
        ]
    return lines
