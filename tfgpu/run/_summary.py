"""The lines `tfgpu run` ends with: how the script ended, each fit's throughput and
utilization, the bottleneck and the change to make, with where (pure, from the records)."""

from __future__ import annotations

import dataclasses
import math
import shlex
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.progress import format_seconds
from tfgpu.run._watch import FitRecord

# Where each diagnosis finding's change goes in the script (by `Finding.kind`).
FINDING_PLACE = {
    "host_overhead": "compile",
    "xla": "compile",
    "input_bound": "data",
    "host_device_traffic": "data",
    "input_wait_unexplained": "data",
    "memory_headroom": "fit",
}


@dataclasses.dataclass
class Outcome:
    """How the run ended: the script, its exit status and how it ended in words, the time, the
    run directory, the script's arguments, the diagnosis (None: none), each fit's report, and
    notes."""

    script: Path
    status: int
    seconds: float
    log_dir: Path
    ended: str = "ended"
    args: list[str] = dataclasses.field(default_factory=list)  # the script's own
    diagnosis: Any = None
    reports: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def ending(error: BaseException | None, status: int) -> str:
    """How the script ended, in words (its exit status follows): "ended", "exited" (`sys.exit`
    or SIGTERM), "was interrupted by Ctrl-C", "raised ValueError". Pure."""
    if error is None or (isinstance(error, SystemExit) and status == 0):
        return "ended"
    if isinstance(error, SystemExit):
        return "exited"
    if isinstance(error, KeyboardInterrupt):
        return "was interrupted by Ctrl-C"
    return f"raised {type(error).__name__}"


def _fit_line(record: FitRecord) -> str:
    where = f" ({record.place})" if record.place is not None else ""
    epochs = record.epochs()
    parts = [f"{len(epochs)} epoch(s) in {format_seconds(record.seconds)}"]
    rate = record.figure("examples_per_s")
    if math.isfinite(rate):
        parts.append(f"{rate:,.0f} examples/s")
    gpu, cpu = record.figure("gpu_util_pct_mean"), record.figure("host_cpu_pct_mean")
    if math.isfinite(gpu):
        parts.append(f"GPU {gpu:.0f}% busy")
    elif math.isfinite(cpu):
        parts.append(f"no GPU, host CPU {cpu:.0f}%")
    if not epochs:
        parts.append("no epoch ended (the report has its steps)")
    if record.ended:
        parts.append(f"stopped by {record.ended}")
    return f"  fit {record.index}{where}: " + " · ".join(parts)


def _diagnosis_lines(diagnosis: Any, record: FitRecord) -> list[str]:
    rate = diagnosis.examples_per_s
    measured = f" · {rate:,.0f} examples/s measured" if math.isfinite(rate) else ""
    lines = [
        f"  diagnosis of fit {record.index} ({format_seconds(diagnosis.time_s)}): "
        f"bottleneck {diagnosis.bottleneck}{measured}"
    ]
    if not diagnosis.findings:
        return [*lines, "    nothing to change: the device is the limit"]
    top = diagnosis.findings[0]
    lines += [f"    {top.title}", f"    change: {top.recommendation}"]
    kind = FINDING_PLACE.get(top.kind)
    if kind is not None and record.call is not None:
        lines.append(f"    where: {record.call.where(kind)}")
    return lines


def _tune_line(outcome: Outcome) -> str:
    """The command that tries the changes on the same script, unchanged."""
    args = " ".join(shlex.quote(a) for a in (str(outcome.script), *outcome.args))
    return f"  to try every setting on it, measured: tfgpu tune {args}"


def summary_lines(
    outcome: Outcome, records: list[FitRecord], diagnosed: FitRecord | None
) -> list[str]:
    """The summary, one line each (the first says how the script ended). Pure."""
    fits = f"{len(records)} fit(s)" if records else "no fit"
    lines = [
        f"tfgpu run: {outcome.script.name} {outcome.ended} (exit status {outcome.status}) "
        f"after {fits} in {format_seconds(outcome.seconds)}; records in {outcome.log_dir}"
    ]
    lines += [_fit_line(r) for r in records]
    for record in records:
        lines += [f"    note: {n}" for n in record.notes]
        lines += [f"    {own}: not added again" for own in record.own]
    if outcome.diagnosis is not None and diagnosed is not None:
        lines += _diagnosis_lines(outcome.diagnosis, diagnosed)
        if outcome.diagnosis.findings:
            lines.append(_tune_line(outcome))
    elif not records:
        lines.append("  nothing to diagnose: the script called no fit")
    lines += [f"  report: {report}" for report in outcome.reports]
    lines += [f"  note: {n}" for n in outcome.notes]
    return lines
