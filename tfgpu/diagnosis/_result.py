"""What `tfgpu.diagnose()` returns: `Diagnosis` (its fields, its printed report) and `Finding`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tfgpu._internal.helpers.checks import is_finite_number
from tfgpu._internal.measure.result import Result


@dataclass(frozen=True)
class Finding:
    """One finding of a diagnosis (every kind, its rule and its fix: docs/diagnosis.md).

    Args:
        kind: str, a stable key, e.g. `"input_bound"`, `"host_overhead"`, `"xla"`.
        severity: str, `"high"`, `"moderate"` or `"info"`.
        title: str, one line.
        detail: str, what was measured or seen.
        recommendation: str, the exact argument to change.
        expected_gain: float or None, the speed-up factor (measured or expected).
        gain_measured: bool, whether `expected_gain` was measured here (else expected).
    """

    kind: str
    severity: str
    title: str
    detail: str
    recommendation: str
    expected_gain: float | None = None
    gain_measured: bool = False


@dataclass
class Diagnosis(Result):
    """The result of `tfgpu.diagnose()`: measurements, a bottleneck, and findings.

    `print(diagnosis)` gives a short report; `to_dict()` is JSON-ready. The guide (each field
    and how it is decided): docs/diagnosis.md, section `tfgpu.diagnose`.

    Args:
        bottleneck: str, `"input"`, `"host_overhead"`, `"scaling"` (the gradients'
            all-reduce), `"compute"` (the device is the limit) or `"inconclusive"`.
        input_bound: str, `"high"` (>= 20% of the step waits), `"moderate"` (>= 5%), `"no"`
            or `"inconclusive"`.
        input_wait_share: float, share of the step spent waiting for input (median of rounds).
        step_time_s: float, seconds per step with the real input, as `fit` runs it.
        compute_step_time_s: float, seconds per step on a device-resident batch.
        input_batch_time_s: float, seconds per batch of the input pipeline alone.
        batch_size: int or None, examples per step.
        examples_per_s: float, training throughput with the real input.
        findings: list of `Finding`, most important first.
        device: str, e.g. `"GPU:0 (NVIDIA A100-SXM4-40GB)"` or `"CPU"`.
        flops_per_step: float or None, see `tfgpu.flops.train_step_flops`.
        achieved_flops_per_s: float or None.
        mfu: float or None, model FLOPs utilization (needs a GPU in the peak table).
        monitor: dict, GPU/host aggregates sampled during step 3 (empty without a GPU).
        measurements: dict, the raw results: `"rounds"`, the probes, `"pipeline"`, ...
        notes: list of str, what was skipped and why (one line each).
        profile_dir: str or None, where a profiler trace was written.
        noise: float or None, the width of `input_wait_share`'s confidence interval.
        time_s: float, seconds the call took.
    """

    bottleneck: str
    input_bound: str
    input_wait_share: float
    step_time_s: float
    compute_step_time_s: float
    input_batch_time_s: float
    batch_size: int | None
    examples_per_s: float
    findings: list[Finding]
    device: str = "CPU"
    flops_per_step: float | None = None
    achieved_flops_per_s: float | None = None
    mfu: float | None = None
    monitor: dict[str, float] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    profile_dir: str | None = None
    noise: float | None = None
    time_s: float = math.nan

    json_name = "diagnosis.json"

    def finding(self, kind: str) -> Finding | None:
        """Returns the first finding of `kind`, or None."""
        return next((f for f in self.findings if f.kind == kind), None)

    def __str__(self) -> str:
        level = self.input_bound
        interval = self.measurements.get("noise") if isinstance(self.measurements, dict) else None
        if level == "inconclusive" and self.noise is not None and isinstance(interval, dict):
            low, high = interval.get("low"), interval.get("high")
            level = f"inconclusive (noise {self.noise:.0%}: {low:.0%} to {high:.0%})"
        elif level == "inconclusive" and self.noise is not None:
            level = f"inconclusive (noise {self.noise:.0%})"
        batch = f" (batch {self.batch_size})" if self.batch_size else ""
        lines = [
            f"tfgpu diagnosis on {self.device}: bottleneck = {self.bottleneck}",
            f"  training: {self.examples_per_s:,.0f} examples/s{batch}; step time "
            f"{self.step_time_s * 1e3:.2f} ms with the input pipeline, "
            f"{self.compute_step_time_s * 1e3:.2f} ms on a device-resident batch",
            f"  input wait {self.input_wait_share:.0%} of the step (input-bound: {level})",
            f"  input pipeline alone: {self.input_batch_time_s * 1e3:.2f} ms per batch"
            + (
                f" ({self.batch_size / self.input_batch_time_s:,.0f} examples/s)"
                if self.batch_size and self.input_batch_time_s > 0
                else ""
            ),
        ]
        if self.mfu is not None and self.achieved_flops_per_s is not None:
            lines.append(f"  MFU {self.mfu:.1%} ({self.achieved_flops_per_s / 1e12:.2f} TFLOP/s)")
        elif self.achieved_flops_per_s:
            lines.append(
                f"  {_flop_rate(self.achieved_flops_per_s)} achieved (MFU needs a GPU "
                "from the peak table)"
            )
        for key in ("gpu0_util_pct_mean", "gpu0_sm_active_pct_mean", "gpu0_tensor_active_pct_mean",
                    "gpu0_mem_used_mib_max"):  # fmt: skip
            if is_finite_number(self.monitor.get(key)):
                lines.append(f"  {key}: {self.monitor[key]:.1f}")
        if not self.findings and self.bottleneck == "inconclusive":
            lines.append("No clear finding: the measurements were too noisy (see the notes).")
        elif not self.findings:
            lines.append("No findings: the device is the limit. Nothing to change.")
        for i, f in enumerate(self.findings, 1):
            gain = ""
            if f.expected_gain is not None:
                gain = f" [{'measured' if f.gain_measured else 'expected'} {f.expected_gain:.2f}x]"
            lines.append(f"{i}. ({f.severity}) {f.title}{gain}")
            lines.append(f"   {f.detail}")
            lines.append(f"   -> {f.recommendation}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _flop_rate(flops_per_second: float) -> str:
    """A FLOP rate in the unit that shows it: "1.23 TFLOP/s", "45.6 GFLOP/s", "7.89 MFLOP/s"."""
    for unit, size in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_second >= size:
            return f"{flops_per_second / size:.2f} {unit}"
    return f"{flops_per_second:.0f} FLOP/s"
