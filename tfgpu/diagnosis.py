"""`tfgpu.diagnose()`: what holds the GPU back, and which knob to turn.

A short, bounded, measured run separates the costs of a training step:

1. the input pipeline alone (`tfgpu.data.benchmark`);
2. the model's train step on one batch already on the device (no input cost), run by
   `Model.fit` exactly as in training (same `steps_per_execution`, same `jit_compile`);
3. the two together, as `fit` runs them, with the GPU monitor sampling where a GPU exists.

The share of step time spent waiting for input is `(t3 - t2) / t3`. The classification uses
the TensorFlow Profiler's input-pipeline analyzer thresholds: at least 20% is highly
input-bound, at least 5% moderately, provided the wait is at least 1 ms per step (less is
tf.data's per-batch hand-over, not the pipeline's work: `INPUT_WAIT_MIN_S`). Further probes are measured both ways rather than
assumed: `steps_per_execution=16` (host overhead: dispatching tiny steps one by one) and
`jit_compile` (XLA). Facts about the dataset, read from its graph (NumPy input,
`py_function`/generators, sequential or parallel maps, cache, a final `prefetch`), the
train-step ops that run on the CPU of a GPU host (read from the traced step), memory headroom, the precision policy against the GPU's tensor cores, and a
lint of the model under mixed precision complete the picture. Where the GPU monitor ran,
its counters show what utilization hides: tensor cores idle, SMs idle under a busy GPU
(small kernels), PCIe traffic far above the batch's size, clocks throttled (the reason
named); on a GPU without GPM a note says what could not be seen. The decision is a pure
function of the measurements (`_classify`), tested without hardware.

The model's weights, optimizer state, metrics, `steps_per_execution`, `jit_compile` and
`history` are put back afterwards. The model and its optimizer are built before the snapshot,
so the state the probe steps would otherwise create unrecorded (the optimizer's slots and
step count on a freshly compiled model) is put back too: training afterwards starts exactly
where it would have without the diagnosis.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu import _gpu_counters as counters
from tfgpu._checks import (
    check_bool,
    check_dir,
    check_int,
    check_number,
    invalid_type,
    is_finite_number,
)
from tfgpu._datasets import cardinality, chain_state, made_by_pipeline, source_batches
from tfgpu._files import rotate, write_text_atomic
from tfgpu._json import json_safe
from tfgpu._warnings import one_line
from tfgpu.batch_size import _prepare_model, _restore_state, _snapshot_state

__all__ = ["Diagnosis", "Finding", "diagnose"]

# The TensorFlow Profiler's input-pipeline analyzer: share of step time waiting for input
# (tensorflow/profiler: input_pipeline_analysis, kHighlyInputBoundThresholdInPercent = 20,
# kModeratelyInputBoundThresholdInPercent = 5).
INPUT_BOUND_HIGH = 0.20
INPUT_BOUND_MODERATE = 0.05
# ...and only when the wait is at least this long per step. Below it the wait is tf.data's
# fixed per-batch hand-over (the iterator's GetNext, the copy into the step), ~0.1-0.5 ms on
# in-memory data however light the pipeline is: not the pipeline's work, so no pipeline knob
# removes it (`steps_per_execution` amortizes it; see the host-overhead probe).
INPUT_WAIT_MIN_S = 1e-3
# A faster variant counts only when it wins by at least this factor (noise margin).
HOST_OVERHEAD_MIN_GAIN = 1.3
XLA_MIN_GAIN = 1.1
# Probe steps_per_execution only for steps shorter than this (dispatch is ~0.1-1 ms/step).
HOST_OVERHEAD_PROBE_BELOW_S = 0.05
PROBE_STEPS_PER_EXECUTION = 16
# Peak device memory below this share of capacity leaves room for a larger batch.
MEMORY_HEADROOM_BELOW = 0.5
# A dynamic loss scale that halves this many times in a short run is collapsing.
LOSS_SCALE_MAX_HALVINGS = 4
# Each comparison alternates its two variants in rounds: at least `_MIN_ROUNDS`, then more
# (up to `_MAX_ROUNDS`, `_PROBE_MAX_ROUNDS` for a probe) until a distribution-free confidence
# interval of the median (order statistics, binomial coverage >= `CONFIDENCE`) lies on one side
# of every threshold, or the time budget is spent.
_MIN_ROUNDS = 3
_MAX_ROUNDS = 12
_PROBE_MAX_ROUNDS = 7
CONFIDENCE = 0.90
# A probe stops after its first round when the variant is this much slower than the baseline.
PROBE_CLEARLY_SLOWER = 1.5
# An input wait longer than this many times the pipeline's own time per batch (plus
# `INPUT_WAIT_MIN_S`) is not the pipeline's doing: not called input-bound.
WAIT_UNEXPLAINED_FACTOR = 2.0
# The default time budget of a diagnosis, in seconds.
DEFAULT_TIME_BUDGET_S = 60.0
# Rounds beyond `_MIN_ROUNDS` stop once this share of the budget is spent (the probes need
# the rest).
_ROUNDS_BUDGET_SHARE = 0.6
# Measuring stops at this share of the budget; the rest is for counting FLOPs (a traced
# gradient) and putting the model back, so the whole call ends within its budget.
_MEASURE_SHARE = 0.85
# Each timed fit of a probe's variant runs at most this many times as long as the baseline's
# timed steps took (its warm-up, tracing and compiling, is bounded by the budget only).
_PROBE_FIT_LIMIT_FACTOR = 3.0
# What GPU utilization hides (tensor cores idle, small kernels, PCIe per step, throttled
# clocks): thresholds, throttle reasons and rules in `tfgpu/_gpu_counters.py`, shared with
# `tfgpu report`; this module adds what the model tells (layers, policy, TF32, batch bytes).


@dataclass(frozen=True)
class Finding:
    """One finding of a diagnosis.

    Args:
        kind: str, a stable key: `"input_bound"`, `"host_overhead"`, `"host_device_traffic"`,
            `"memory_headroom"`, `"precision"`, `"xla"`, `"mixed_precision_output"`,
            `"mixed_precision_dims"`, `"loss_scale"`, and from the GPU counters of the
            monitored run: `"tensor_cores_idle"`, `"small_kernels"`, `"pcie_traffic"`,
            `"clocks_throttled"`.
        severity: str, `"high"`, `"moderate"` or `"info"`.
        title: str, one line.
        detail: str, what was measured or seen.
        recommendation: str, the exact argument to change.
        expected_gain: float or None, the speed-up factor (measured or expected).
        gain_measured: bool, whether `expected_gain` was measured here (else it is expected
            from datasheets or rules of thumb).
    """

    kind: str
    severity: str
    title: str
    detail: str
    recommendation: str
    expected_gain: float | None = None
    gain_measured: bool = False


@dataclass
class _Facts:
    """Everything `_classify` decides from (filled by measurement or by tests)."""

    step_time_s: float  # fit with the real input pipeline
    compute_step_time_s: float  # fit with one device-resident batch
    input_batch_time_s: float  # the pipeline alone, seconds per batch
    batch_size: int | None = None
    steps_per_execution: int = 1
    spe_probe_step_time_s: float | None = None  # with PROBE_STEPS_PER_EXECUTION
    spe_baseline_step_time_s: float | None = None  # its interleaved baseline
    jit_compile: bool = False
    xla_other_step_time_s: float | None = None  # compute step with jit_compile flipped
    xla_baseline_step_time_s: float | None = None  # its interleaved baseline
    on_gpu: bool = False
    gpu_name: str | None = None
    compute_capabilities: list[tuple[int, int]] = field(default_factory=list)
    policy: str = "float32"
    peak_memory_bytes: int | None = None
    memory_capacity_bytes: int | None = None
    numpy_input: bool = False
    python_input: bool = False  # py_function / generator in the pipeline
    prefetch: bool = True
    parallel_map: bool = False  # the pipeline maps with num_parallel_calls
    sequential_map: bool = False  # some map runs one element at a time
    cache: str | None = None  # "memory", "file" or None
    map_after_cache: bool = False  # per-example work (augmentation) after the cache
    private_threadpool_size: int | None = None
    loss_scale_before: float | None = None
    loss_scale_after: float | None = None
    train_step_ops: list[_OpFact] = field(default_factory=list)  # None read: empty
    # GPU counters from the monitored real run, gpu0 = TensorFlow's /GPU:0 (see
    # `_monitor_facts`); NaN when not measured (no monitor, no GPM, no NVML counter).
    util_pct_mean: float = math.nan
    sm_active_pct_mean: float = math.nan
    tensor_active_pct_mean: float = math.nan
    pcie_mib_s_mean: float = math.nan  # transmitted + received
    power_w_mean: float = math.nan
    power_limit_w_max: float = math.nan
    throttle_reasons_any: float = math.nan  # bitwise OR of the window's NVML bitmasks
    sm_clock_mhz_mean: float = math.nan
    energy_j: float = math.nan
    batch_bytes: int | None = None  # one batch's tensors, in bytes
    tf32_enabled: bool | None = None  # tf.config.experimental.tensor_float_32_execution_enabled()
    float32_layers: list[str] = field(default_factory=list)  # float32 math under a 16-bit policy
    odd_dim_layers: list[str] = field(default_factory=list)  # kernels with dims % 8 != 0
    # Interleaved rounds, when measured: (device-resident, real) step times per round, and
    # (baseline, variant) per round of each probe. Empty: the scalar fields above decide.
    rounds: list[tuple[float, float]] = field(default_factory=list)
    spe_rounds: list[tuple[float, float]] = field(default_factory=list)
    xla_rounds: list[tuple[float, float]] = field(default_factory=list)
    made_by_pipeline: bool = False  # the input is a `tfgpu.data.pipeline` dataset
    dynamic_shape: str | None = None  # a batch component's shape with None dims, e.g. "(None, 32)"
    partial_batches: bool = False  # batches of different sizes (no drop_remainder)
    replicas: int = 1  # the strategy's replicas (> 1: a distributed iterator)
    host_load: float | None = None  # 1-minute load average per core


@dataclass
class Diagnosis:
    """The result of `tfgpu.diagnose()`: measurements, a bottleneck, and findings.

    `print(diagnosis)` gives a short report; the fields are data; `to_dict()` is JSON-ready.

    Args:
        bottleneck: str, `"input"`, `"host_overhead"`, `"compute"` (the device itself is
            the limit: the good case) or `"inconclusive"` (the input wait could not be told
            from noise within the time budget, or the pipeline alone is far faster than the
            wait, so something else holds the steps back: see the findings).
        input_bound: str, `"high"` (>= 20% of step time waits for input), `"moderate"`
            (>= 5%), `"no"` or `"inconclusive"` (the confidence interval of the wait's share
            straddles a threshold, or the wait is not explained by the pipeline).
        input_wait_share: float, share of the step spent waiting for input (the median over
            the interleaved rounds).
        step_time_s: float, seconds per step with the real input, as `fit` runs it.
        compute_step_time_s: float, seconds per step on a device-resident batch.
        input_batch_time_s: float, seconds per batch of the input pipeline alone.
        batch_size: int or None, examples per step.
        examples_per_second: float, training throughput with the real input.
        findings: list of `Finding`, most important first.
        device: str, e.g. `"GPU:0 (NVIDIA A100-SXM4-40GB)"` or `"CPU"`.
        flops_per_step: float or None, see `tfgpu.flops.train_step_flops`.
        achieved_flops_per_second: float or None.
        mfu: float or None, model FLOPs utilization (needs a GPU in the peak table).
        monitor: dict, GPU/host aggregates sampled during step 3 (empty without a GPU).
        measurements: dict, the raw results: per-round step times (`"rounds"`), the probes
            (`"steps_per_execution_probe"`, `"xla"`, each with its rounds and gain interval),
            memory, `"noise"` (the input-wait share's confidence interval), `"wall_s"` and
            `"time_budget_s"`.
        notes: list of str, what was skipped and why (one line each).
        profile_dir: str or None, where a profiler trace was written.
        noise: float or None, the width of the confidence interval of `input_wait_share`
            (0.12: 12 percentage points between its low and high ends).
    """

    bottleneck: str
    input_bound: str
    input_wait_share: float
    step_time_s: float
    compute_step_time_s: float
    input_batch_time_s: float
    batch_size: int | None
    examples_per_second: float
    findings: list[Finding]
    device: str = "CPU"
    flops_per_step: float | None = None
    achieved_flops_per_second: float | None = None
    mfu: float | None = None
    monitor: dict[str, float] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    profile_dir: str | None = None
    noise: float | None = None

    def finding(self, kind: str) -> Finding | None:
        """Returns the first finding of `kind`, or None."""
        return next((f for f in self.findings if f.kind == kind), None)

    def to_dict(self) -> dict[str, Any]:
        """Returns the diagnosis as JSON-ready data (with the printed report as `"text"`)."""
        d = asdict(self)
        d["text"] = str(self)
        return json_safe(d)

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
            f"  training: {self.examples_per_second:,.0f} examples/s{batch}; step time "
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
        if self.mfu is not None and self.achieved_flops_per_second is not None:
            lines.append(
                f"  MFU {self.mfu:.1%} ({self.achieved_flops_per_second / 1e12:.2f} TFLOP/s)"
            )
        elif self.achieved_flops_per_second:
            lines.append(
                f"  {self.achieved_flops_per_second / 1e9:.2f} GFLOP/s achieved (MFU needs a GPU "
                "from the peak table)"
            )
        for key in (
            "gpu0_util_pct_mean",
            "gpu0_sm_active_pct_mean",
            "gpu0_tensor_active_pct_mean",
            "gpu0_mem_used_mib_max",
        ):
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


# ----------------------------------------------------------------------------------------
# Pure decisions


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
        "share": statistics.median(shares),
        "wait_s": statistics.median(waits),
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
        gain = statistics.median(b for b, _ in rounds) / statistics.median(v for _, v in rounds)
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


def _precision_peak_key(policy: str, ccs: list[tuple[int, int]]) -> str:
    if policy == "mixed_bfloat16":
        return "bfloat16"
    if policy == "mixed_float16":
        return "float16"
    tf32 = bool(ccs) and all(cc >= (8, 0) for cc in ccs)
    return "tf32" if tf32 else "float32"


def _classify(f: _Facts) -> tuple[str, str, float, list[Finding]]:
    """Returns (bottleneck, input level, input wait share, findings) from the facts."""
    from tfgpu.flops import peak_flops
    from tfgpu.precision import choose_policy

    findings: list[Finding] = []
    if f.rounds:
        verdict = _share_verdict(f.rounds)
        level, share, wait = verdict["level"], verdict["share"], verdict["wait_s"]
        wait_low = verdict["wait_low_s"]
    else:
        wait, share = _wait_and_share(f.compute_step_time_s, f.step_time_s)
        wait_low = wait
        level = _input_level(share, wait)
    spe_gain, spe_low, _ = _probe_gain(
        f.spe_rounds, f.spe_baseline_step_time_s or f.compute_step_time_s, f.spe_probe_step_time_s
    )
    spe_no_gain = spe_gain is not None and not spe_low >= HOST_OVERHEAD_MIN_GAIN
    xla_gain, xla_low, _ = _probe_gain(
        f.xla_rounds, f.xla_baseline_step_time_s or f.compute_step_time_s, f.xla_other_step_time_s
    )
    xla_no_gain = xla_gain is not None and not xla_low >= XLA_MIN_GAIN

    # A finding must agree with the figures it prints. The most the pipeline can add to a
    # step is about its own time per batch (measured far more steadily than a difference of
    # two step times): a wait above that in every round is not the pipeline's doing...
    most_input_can_cost = WAIT_UNEXPLAINED_FACTOR * f.input_batch_time_s + INPUT_WAIT_MIN_S
    unexplained = level != "no" and wait_low > most_input_can_cost
    # ...and a wait within it is the input's only if that most is itself a moderate share.
    if (
        level != "no"
        and not unexplained
        and f.step_time_s > 0
        and _input_level(most_input_can_cost / f.step_time_s) == "no"
    ):
        level = "no"
    if unexplained:
        level = "inconclusive"
        findings.append(_unexplained_wait_finding(f, wait))
    elif level in ("high", "moderate"):
        gain = f.step_time_s / f.compute_step_time_s if f.compute_step_time_s > 0 else None
        findings.append(
            Finding(
                "input_bound",
                "high" if level == "high" else "moderate",
                f"Input-bound ({level}): {share:.0%} of each step waits for input",
                f"{f.step_time_s * 1e3:.2f} ms per step with the pipeline vs "
                f"{f.compute_step_time_s * 1e3:.2f} ms on a device-resident batch; the "
                f"pipeline alone takes {f.input_batch_time_s * 1e3:.2f} ms per batch.",
                _input_advice(f, spe_no_gain),
                gain,
                True,
            )
        )

    spe_base = (
        statistics.median(b for b, _ in f.spe_rounds)
        if f.spe_rounds
        else f.spe_baseline_step_time_s or f.compute_step_time_s
    )
    spe_probe = (
        statistics.median(v for _, v in f.spe_rounds)
        if f.spe_rounds
        else f.spe_probe_step_time_s or 0.0
    )
    host_bound = spe_gain is not None and spe_low >= HOST_OVERHEAD_MIN_GAIN
    if host_bound:
        rec = (
            f"`model.compile(..., steps_per_execution={PROBE_STEPS_PER_EXECUTION})` (or more) "
            "runs that many steps per call, so Python and dispatch cost is paid once."
        )
        if f.on_gpu:
            rec += (
                " On GPUs also set the environment variable `TF_GPU_THREAD_MODE=gpu_private` "
                "before TensorFlow starts (dedicated threads launch the kernels)."
            )
        findings.append(
            Finding(
                "host_overhead",
                "high",
                "Host-overhead-bound: steps are so short that dispatching them dominates",
                f"{spe_base * 1e3:.2f} ms per step with steps_per_execution="
                f"{f.steps_per_execution}, {spe_probe * 1e3:.2f} ms with "
                f"steps_per_execution={PROBE_STEPS_PER_EXECUTION}.",
                rec,
                spe_gain,
                True,
            )
        )

    traffic: list[tuple[str, str]] = []  # (what was seen, the fix)
    if f.numpy_input:
        traffic.append(
            (
                "the data is fed as NumPy arrays, copied from host memory batch by batch",
                "`tfgpu.data.pipeline((x, y), batch_size=...)` (cached, prefetched tf.data)",
            )
        )
    if f.python_input:
        traffic.append(
            (
                "the pipeline runs Python every step (`tf.py_function` / a generator), which "
                "holds the GIL and cannot run in parallel",
                "rewrite that step with TF ops, or `cache()` after it",
            )
        )
    if not f.prefetch:
        device_hint = " or `tf.data.experimental.prefetch_to_device('/gpu:0')`" if f.on_gpu else ""
        traffic.append(
            (
                "batches are not prefetched",
                f"end the pipeline with `.prefetch(tf.data.AUTOTUNE)`{device_hint}",
            )
        )
    cpu_ops = _cpu_placed_ops(f.train_step_ops) if f.on_gpu and not f.jit_compile else []
    if cpu_ops:
        traffic.append(_cpu_ops_traffic(cpu_ops))
    if traffic:
        findings.append(
            Finding(
                "host_device_traffic",
                "moderate" if level != "no" or cpu_ops else "info",
                "Train-step ops placed on the CPU"
                + (" and host-side input work" if len(traffic) > 1 else "")
                if cpu_ops
                else "Host-side input work every step",
                "; ".join(seen for seen, _ in traffic) + ".",
                "; ".join(fix for _, fix in traffic) + ".",
            )
        )

    if f.on_gpu and f.peak_memory_bytes and f.memory_capacity_bytes:
        used = f.peak_memory_bytes / f.memory_capacity_bytes
        if used < MEMORY_HEADROOM_BELOW:
            room = 0.9 * f.memory_capacity_bytes / f.peak_memory_bytes
            findings.append(
                Finding(
                    "memory_headroom",
                    "info",
                    f"Memory headroom: the step peaks at {used:.0%} of device memory",
                    f"Peak {f.peak_memory_bytes / 2**30:.2f} GiB of "
                    f"{f.memory_capacity_bytes / 2**30:.1f} GiB: the batch could grow about "
                    f"{room:.1f}x.",
                    f"A larger `batch_size` (now {f.batch_size}); `tfgpu.find_batch_size(model, "
                    "data)` finds the largest and the fastest. Scale the learning rate with "
                    "`tfgpu.scale_learning_rate`.",
                )
            )

    if f.on_gpu and f.compute_capabilities and f.policy == "float32":
        choice = choose_policy(f.compute_capabilities)
        if choice.policy != "float32":
            gain = None
            if f.gpu_name:
                now = peak_flops(f.gpu_name, _precision_peak_key("float32", f.compute_capabilities))
                mixed = peak_flops(f.gpu_name, choice.policy)
                gain = mixed / now if now and mixed else None
            findings.append(
                Finding(
                    "precision",
                    "moderate",
                    "float32 on a tensor-core GPU",
                    f"The policy is float32; {choice.reason}.",
                    f'`tfgpu.configure(precision="{choice.policy}")` before building the model '
                    f'(or `keras.mixed_precision.set_global_policy("{choice.policy}")`).',
                    gain,
                    False,
                )
            )

    if xla_gain is not None and not xla_no_gain:
        xla_base = (
            statistics.median(b for b, _ in f.xla_rounds)
            if f.xla_rounds
            else f.xla_baseline_step_time_s or f.compute_step_time_s
        )
        xla_variant = (
            statistics.median(v for _, v in f.xla_rounds)
            if f.xla_rounds
            else f.xla_other_step_time_s or 0.0
        )
        if xla_variant > 0:
            other = not f.jit_compile
            findings.append(
                Finding(
                    "xla",
                    "moderate",
                    f"XLA {'on' if other else 'off'} is faster for this model",
                    f"{xla_base * 1e3:.2f} ms per step with jit_compile="
                    f"{f.jit_compile}, {xla_variant * 1e3:.2f} ms with "
                    f"jit_compile={other}.",
                    f"`model.compile(..., jit_compile={other})`.",
                    xla_gain,
                    True,
                )
            )

    if f.loss_scale_before and f.loss_scale_after is not None:
        halvings = math.log2(f.loss_scale_before / max(f.loss_scale_after, 1e-30))
        if halvings >= LOSS_SCALE_MAX_HALVINGS or f.loss_scale_after < 1:
            findings.append(_loss_scale_finding(f.loss_scale_before, f.loss_scale_after))

    findings += _counter_findings(f, cpu_ops, spe_no_gain, xla_no_gain)

    # Tiny steps also wait on the per-step hand-over of each batch; when the pipeline alone
    # outpaces the step, that wait is dispatch cost too, and steps_per_execution removes it.
    pipeline_keeps_up = f.input_batch_time_s < f.compute_step_time_s
    if host_bound and (level != "high" or pipeline_keeps_up):
        bottleneck = "host_overhead"
    elif level in ("high", "moderate"):
        bottleneck = "input"
    elif level == "inconclusive":
        bottleneck = "inconclusive"
    else:
        bottleneck = "compute"
    order = {"high": 0, "moderate": 1, "info": 2}
    lead = {
        "input": "input_bound",
        "host_overhead": "host_overhead",
        "inconclusive": "input_wait_unexplained",
    }.get(bottleneck)
    findings.sort(key=lambda x: (x.kind != lead, order[x.severity]))
    return bottleneck, level, share, findings


def _counters(f: _Facts) -> counters.Counters:
    return counters.Counters(
        util_pct_mean=f.util_pct_mean,
        sm_active_pct_mean=f.sm_active_pct_mean,
        tensor_active_pct_mean=f.tensor_active_pct_mean,
        pcie_mib_s_mean=f.pcie_mib_s_mean,
        power_w_mean=f.power_w_mean,
        power_limit_w_max=f.power_limit_w_max,
        throttle_reasons_any=f.throttle_reasons_any,
        sm_clock_mhz_mean=f.sm_clock_mhz_mean,
    )


def _counter_findings(
    f: _Facts,
    cpu_ops: list[tuple[_OpFact, str]],
    spe_no_gain: bool = False,
    xla_no_gain: bool = False,
) -> list[Finding]:
    """What GPU utilization hides, from the GPU counters of the monitored run. Pure.

    The rules (thresholds, decisions, throttle reasons) are `tfgpu._gpu_counters`'s, shared
    with `tfgpu report`; this adds what only a diagnosis knows: the model's layers, the
    policy, TF32, the train step's CPU ops, the batch's bytes. A counter that is NaN (no
    GPM, no NVML support, no monitor) decides nothing: `_unseen` says what could not be seen.
    """
    if not f.on_gpu:
        return []
    c = _counters(f)
    findings = []
    tensor_gpu = bool(f.compute_capabilities) and all(
        tuple(cc) >= (7, 0) for cc in f.compute_capabilities
    )
    idle = counters.tensor_cores_idle(c) if tensor_gpu else None
    if idle is not None:
        findings.append(_tensor_idle_finding(f, idle, xla_no_gain))
    fix = counters.small_kernels_fix(
        f.batch_size,
        f.steps_per_execution,
        max(PROBE_STEPS_PER_EXECUTION, 4 * f.steps_per_execution),
        f.jit_compile,
        measured_no_gain=frozenset(
            (["steps_per_execution"] if spe_no_gain else [])
            + (["jit_compile"] if xla_no_gain else [])
        ),
    )
    small = counters.small_kernels(c, fix)
    if small is not None:
        findings.append(_finding(small))
    pcie = counters.pcie_traffic(c, f.step_time_s, f.batch_bytes)
    if pcie is not None:
        findings.append(_pcie_finding(f, pcie, cpu_ops))
    throttled = counters.clocks_throttled(c)
    if throttled is not None:
        findings.append(_finding(throttled))
    return findings


def _finding(found: counters.CounterFinding, detail: str | None = None, fix: str | None = None):
    """A `Finding` from a shared rule's text pieces (`detail`, `fix`: what the model adds)."""
    return Finding(
        found.kind,
        found.severity,
        found.title,
        found.detail() if detail is None else detail,
        found.fix if fix is None else fix,
    )


def _tensor_idle_finding(
    f: _Facts, found: counters.CounterFinding, xla_no_gain: bool = False
) -> Finding:
    mixed = f.policy in ("mixed_float16", "mixed_bfloat16")
    tf32_capable = all(tuple(cc) >= (8, 0) for cc in f.compute_capabilities)
    fixes = []
    if mixed and f.float32_layers:
        fixes.append(
            "these layers keep float32 math under the mixed policy, so their matmuls skip the "
            "tensor cores: " + ", ".join(f.float32_layers[:8]) + " (drop their "
            '`dtype="float32"` unless they must stay float32, like a final softmax)'
        )
    if f.odd_dim_layers:
        fixes.append(counters.MULTIPLES_OF_8 + ": " + ", ".join(f.odd_dim_layers[:8]))
    if f.tf32_enabled is False and tf32_capable:
        fixes.append(
            "TF32 is off, so float32 matmuls run on the CUDA cores: remove "
            "`tf.config.experimental.enable_tensor_float_32_execution(False)` (or call it "
            "with `True`)"
        )
    if not mixed:
        choice = "mixed_bfloat16" if tf32_capable else "mixed_float16"
        fixes.append(
            f'mixed precision: `tfgpu.configure(precision="{choice}")` before building the '
            "model" + ("" if tf32_capable else " (float32 never uses tensor cores before Ampere)")
        )
    if not xla_no_gain:  # never advise what its own probe measured as no gain
        fixes.append(counters.ELEMENTWISE_FIX)
    return _finding(
        found,
        f"{found.measured} under the {f.policy} policy: {found.meaning}."
        + (" TF32 is off." if f.tf32_enabled is False and tf32_capable else ""),
        _sentence("; ".join(fixes)),
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _pcie_finding(
    f: _Facts, found: counters.CounterFinding, cpu_ops: list[tuple[_OpFact, str]]
) -> Finding:
    seen = []
    if cpu_ops:
        seen.append(_cpu_ops_traffic(cpu_ops)[0])
    if f.numpy_input:
        seen.append("the data is fed as NumPy arrays")
    if f.python_input:
        seen.append("the pipeline runs `tf.py_function` / a generator")
    return _finding(found, found.measured + (f"; seen: {'; '.join(seen)}" if seen else "") + ".")


def _unseen(f: _Facts) -> list[str]:
    """Notes on what the GPU counters could not show (NaN where the monitor ran). Pure."""
    if not f.on_gpu:
        return []  # no GPU: its own note says so
    c = _counters(f)
    notes = counters.unseen(c)
    measured = is_finite_number(f.util_pct_mean) and is_finite_number(f.pcie_mib_s_mean)
    if measured and not f.batch_bytes:
        notes.insert(
            len(notes) - (counters.POWER_UNSEEN in notes),
            "PCIe traffic per step not compared: the batch's size in bytes is unknown",
        )
    return notes


def _monitor_facts(aggregate: dict[str, Any], gpu: int = 0) -> dict[str, float]:
    """The `_Facts` GPU counters from `Sampler.aggregate()` keys `gpu{gpu}_*`. Pure.

    A key that is absent (an older monitor) or not a finite number reads as NaN. PCIe is
    transmitted + received (what was measured, when only one direction was).
    """

    def get(key: str) -> float:
        value = aggregate.get(f"gpu{gpu}_{key}") if isinstance(aggregate, dict) else None
        return float(value) if value is not None and is_finite_number(value) else math.nan

    tx, rx = get("pcie_tx_mib_s_mean"), get("pcie_rx_mib_s_mean")
    pcie = [v for v in (tx, rx) if math.isfinite(v)]
    return {
        "util_pct_mean": get("util_pct_mean"),
        "sm_active_pct_mean": get("sm_active_pct_mean"),
        "tensor_active_pct_mean": get("tensor_active_pct_mean"),
        "pcie_mib_s_mean": sum(pcie) if pcie else math.nan,
        "power_w_mean": get("power_w_mean"),
        "power_limit_w_max": get("power_limit_w_max"),
        "throttle_reasons_any": get("throttle_reasons_any"),
        "sm_clock_mhz_mean": get("sm_clock_mhz_mean"),
        "energy_j": get("energy_j"),
    }


def _batch_bytes(batch) -> int | None:
    """Bytes of one batch's tensors (inputs, labels, weights), or None if unknown."""
    total = 0
    try:
        for t in tf.nest.flatten(batch, expand_composites=True):
            n = t.shape.num_elements()
            if n is None:
                return None
            total += int(n) * int(t.dtype.size)
    except Exception:  # an odd element (a string tensor has no fixed size): unknown
        return None
    return total or None


def _unexplained_wait_finding(f: _Facts, wait: float) -> Finding:
    """The input wait is far longer than the pipeline's own time per batch: what to check. Pure."""
    causes = []
    if f.dynamic_shape:
        causes.append(
            f"the batches' shape {f.dynamic_shape} has `None` dims"
            + (" and the last batch is partial" if f.partial_batches else "")
            + ": each new shape retraces the train step"
            + (" and recompiles it under `jit_compile`" if f.jit_compile else "")
            + "; batch with `drop_remainder=True` (`.batch(..., drop_remainder=True)`, "
            "`tfgpu.data.pipeline(..., drop_remainder=True)`) or pad to fixed shapes"
        )
    if f.replicas > 1:
        causes.append(
            f"the batches are split across {f.replicas} replicas every step (the distributed "
            "iterator's overhead): time a single-device run to compare"
        )
    if f.host_load is not None and f.host_load >= 1.0:
        causes.append(
            f"the host is loaded (load average {f.host_load:.1f} per core): other processes "
            "compete for the cores tf.data and the step use; diagnose on a quieter machine"
        )
    if not causes:
        causes.append(
            "none of the usual causes was seen (fixed batch shapes, one replica, host not "
            "loaded): rerun `diagnose` with a larger `time_budget_s`, or capture a trace "
            "with `profile=True` and a `run_dir`"
        )
    return Finding(
        "input_wait_unexplained",
        "moderate",
        "Steps wait far longer than the pipeline takes: the input pipeline is not the cause",
        f"{wait * 1e3:.2f} ms of each {f.step_time_s * 1e3:.2f} ms step waits beside a "
        f"{f.compute_step_time_s * 1e3:.2f} ms device-resident step, but the pipeline alone "
        f"makes a batch in {f.input_batch_time_s * 1e3:.2f} ms: not called input-bound.",
        _sentence("check: " + "; ".join(causes)),
    )


def _input_advice(f: _Facts, spe_no_gain: bool = False) -> str:
    """What to change in an input-bound pipeline, given what it already does and who built
    it (a `tfgpu.data.pipeline`, a Keras loader or hand-made chain, a generator). Pure."""
    if not (f.parallel_map or f.sequential_map or f.python_input):
        return _in_memory_advice(f, spe_no_gain)
    if f.python_input:
        where = (
            "in `map_fn`, then let `cache=` keep its output"
            if f.made_by_pipeline
            else "before a `cache()`"
        )
        return (
            "The pipeline runs Python for every element (`tf.py_function` / a generator), "
            "which holds the GIL and cannot run in parallel: rewrite that step with TF ops "
            f"(`tf.io`, `tf.image`, `tf.strings`), or run it once {where}."
        )
    tuned = f.prefetch and not f.sequential_map
    if not tuned and not f.made_by_pipeline:
        missing = []
        if f.sequential_map:
            missing.append("a map runs one element at a time")
        if f.cache is None:
            missing.append("nothing is cached")
        if not f.prefetch:
            missing.append("batches are not prefetched")
        return (
            "Build the input with `tfgpu.data.pipeline(ds, batch_size=...)` (it takes a Keras "
            "loader's dataset too: parallel `map(num_parallel_calls=tf.data.AUTOTUNE)`, "
            "`cache()`, `prefetch(tf.data.AUTOTUNE)`), or give your own `ds.map(...)` "
            "`num_parallel_calls=tf.data.AUTOTUNE` and end with `.prefetch(tf.data.AUTOTUNE)`"
            + (f": now {', '.join(missing)}" if missing else "")
            + "; move per-example Python work into TF ops or before `cache()`."
        )
    caches = {"memory": "caches in memory", "file": "caches to a file"}
    cached = "" if f.cache is None else caches.get(f.cache, "")
    parallel = "maps in parallel" if f.parallel_map else ""
    prefetches = "prefetches" if f.prefetch else ""
    done = ", ".join(x for x in (parallel, cached, prefetches) if x) or "is a tfgpu pipeline"
    left = [
        "make the per-example work cheaper (fewer ops in `map_fn`/`augment_fn`; decode "
        "smaller, e.g. `tf.io.decode_jpeg(..., ratio=2)` or `decode_and_crop_jpeg`)"
    ]
    if f.sequential_map:
        left.insert(
            0,
            "a map in the dataset passed in runs one element at a time: move that work into "
            "`map_fn=` (run in parallel) or, vectorized, `batch_map_fn=`",
        )
    if f.map_after_cache:
        left.append(
            "move the augmentation after the cache into `batch_augment_fn=` (vectorized: one "
            "op per batch instead of one per example)"
        )
    if f.cache is None:
        left.append(
            'cache the decoded examples: `cache=True` (memory) or `cache="/path/prefix"` (a '
            "file), with the deterministic work in `map_fn` before it"
        )
    pool = f.private_threadpool_size
    left.append(
        "give tf.data more CPU cores (a host with more cores per GPU; "
        f"`private_threadpool_size=` sized to them, now {pool or 'the shared pool'})"
    )
    left.append(
        "preprocess offline: write the decoded, resized examples to TFRecord files once and "
        'read them with `tfgpu.data.pipeline("data-*.tfrecord", map_fn=parse, ...)`'
    )
    return f"The pipeline already {done}: what is left is to " + "; ".join(left) + "."


def _in_memory_advice(f: _Facts, spe_no_gain: bool = False) -> str:
    """What helps a pipeline without a map (in-memory arrays): fewer, larger hand-overs. Pure.

    Nothing is decoded or transformed, so cheaper maps, caches and TFRecords cannot help: the
    cost is per batch (slicing, the iterator, the copy into the step) and per host round trip.
    """
    left = []
    if not f.prefetch:
        left.append("end the pipeline with `.prefetch(tf.data.AUTOTUNE)`")
    batch = f"now {f.batch_size}" if f.batch_size else "per replica"
    left.append(
        f"a larger batch (`batch_size=`, {batch}): the per-batch cost is paid for more "
        "examples; scale the learning rate with `tfgpu.scale_learning_rate`"
    )
    if not spe_no_gain:  # never advise what its own probe measured as no gain
        left.append(
            f"`model.compile(..., steps_per_execution=)` (now {f.steps_per_execution}; "
            f"e.g. {max(PROBE_STEPS_PER_EXECUTION, 4 * f.steps_per_execution)}): fewer host "
            "round trips, several batches fetched per call"
        )
    left.append(
        "`tfgpu.data.pipeline(..., repeat=True)` with `model.fit(..., steps_per_epoch=...)`: "
        "one iterator for the whole run instead of a new one every epoch"
    )
    return (
        "The pipeline has no map (in-memory data): the wait is per-batch hand-over, so "
        + "; ".join(left)
        + "."
    )


@dataclass(frozen=True)
class _OpFact:
    """One op of the traced train step, as the graph has it (see `_train_step_ops`)."""

    name: str  # e.g. "sequential/my_layer/EagerPyFunc"
    op: str  # the op type, e.g. "EagerPyFunc"
    device: str = ""  # the requested device ("" when the placer chooses)
    gpu_kernel: bool = True  # a GPU (or device-agnostic) kernel exists for its dtypes


_PY_FUNC_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})
# Graph plumbing: never a cost (constants, arguments, control).
_PLUMBING_OPS = frozenset({"Const", "Placeholder", "_Arg", "_Retval", "NoOp", "HostConst"})


def _cpu_placed_ops(ops: list[_OpFact]) -> list[tuple[_OpFact, str]]:
    """The train-step ops that run on the CPU of a GPU host, each with why. Pure.

    An op runs on the CPU when the model pins it there (`with tf.device("/cpu:0")`), when
    it is a `tf.py_function` (Python runs on the host, its tensors are copied over), or when
    no GPU kernel exists for it (string ops, some integer ops): soft placement then moves it
    to the CPU, and its inputs and outputs cross PCIe every step.
    """
    placed = []
    for op in ops:
        if op.op in _PLUMBING_OPS:
            continue
        if "CPU" in op.device.upper():
            placed.append((op, "pinned"))
        elif op.op in _PY_FUNC_OPS:
            placed.append((op, "python"))
        elif not op.gpu_kernel:
            placed.append((op, "no_kernel"))
    return placed


_CPU_OP_FIXES = {
    "pinned": 'remove the `with tf.device("/cpu:0")` around it in the model; a preprocessing '
    "layer that pins itself there (`TextVectorization`, `StringLookup`, `Hashing`) belongs in "
    "the input pipeline instead (`map_fn=layer`)",
    "python": "rewrite the `tf.py_function` with TF ops, or move it into the input pipeline",
    "no_kernel": "no GPU kernel for it (a string op, an op without a GPU kernel for its "
    "dtype): move it into the input pipeline (`map_fn`) or replace it with an op that has one",
}


def _cpu_ops_traffic(cpu_ops: list[tuple[_OpFact, str]]) -> tuple[str, str]:
    """(what was seen, the fix) for train-step ops on the CPU. Pure."""
    shown = [f"`{op.name}` ({op.op}{', ' + op.device if why == 'pinned' else ''})"
             for op, why in cpu_ops[:6]]  # fmt: skip
    more = f" and {len(cpu_ops) - 6} more" if len(cpu_ops) > 6 else ""
    seen = (
        f"{len(cpu_ops)} train-step op(s) run on the CPU, so tensors cross between host and "
        f"GPU every step: {', '.join(shown)}{more}"
    )
    reasons = []
    for _, why in cpu_ops:
        if why not in reasons:
            reasons.append(why)
    return seen, "; ".join(_CPU_OP_FIXES[why] for why in reasons)


def _loss_scale_finding(before: float, after: float) -> Finding:
    return Finding(
        "loss_scale",
        "high",
        "The dynamic loss scale keeps collapsing",
        f"The scale fell from {before:g} to {after:g} during the run: each halving is a step "
        "whose gradients overflowed float16 and whose update was skipped silently.",
        'Use `"mixed_bfloat16"` on GPUs with compute capability >= 8.0 (no loss scale '
        "needed); otherwise find the overflow (unnormalized inputs, large logits, a layer "
        'that must run in float32: `dtype="float32"`).',
    )


def _lint_mixed_precision(model, compute_capabilities) -> list[Finding]:
    """Checks a model for mixed-precision pitfalls (pure: reads the model, changes nothing)."""
    from tfgpu.precision import has_tensor_cores

    layers = [la for la in model._flatten_layers(include_self=False) if not la._layers]
    half = ("float16", "bfloat16")
    mixed = [la for la in layers if getattr(la, "compute_dtype", None) in half]
    if not mixed:
        return []
    findings = []
    last = model.layers[-1] if model.layers else None
    while last is not None and getattr(last, "layers", None):
        last = last.layers[-1]
    if last is not None and getattr(last, "compute_dtype", None) in half:
        findings.append(
            Finding(
                "mixed_precision_output",
                "high",
                f"The output layer `{last.name}` computes in {last.compute_dtype}",
                "Softmax and losses lose precision and overflow in 16 bits.",
                f'Give the last layer `dtype="float32"`, e.g. `keras.layers.Activation('
                f'"softmax", dtype="float32")` after a linear `{last.name}`.',
            )
        )
    tensor_cores = bool(compute_capabilities) and all(
        has_tensor_cores(tuple(cc)) for cc in compute_capabilities
    )
    if tensor_cores:
        odd = _odd_dims(mixed)
        if odd:
            findings.append(
                Finding(
                    "mixed_precision_dims",
                    "moderate",
                    "Matrix dimensions not multiples of 8",
                    "Tensor cores need input/output sizes that are multiples of 8 in float16/"
                    "bfloat16; these kernels are not: " + ", ".join(odd[:8]) + ".",
                    "Round `units` / `filters` / `output_dim` (and input features, e.g. by "
                    "padding the vocabulary or channels) up to a multiple of 8.",
                )
            )
    return findings


def _leaf_layers(model) -> list[Any]:
    return [la for la in model._flatten_layers(include_self=False) if not la._layers]


def _odd_dims(layers) -> list[str]:
    """Each layer whose kernel has a dimension (of its last two) not a multiple of 8, as
    "`name` (shape)"."""
    odd = []
    for la in layers:
        kernel = getattr(la, "kernel", None)
        shape = tuple(int(d) for d in kernel.shape) if kernel is not None else ()
        dims = shape[-2:] if len(shape) >= 2 else ()
        if any(d % 8 for d in dims):
            odd.append(f"`{la.name}` {shape}")
    return odd


def _precision_layers(model) -> tuple[list[str], list[str]]:
    """(layers keeping float32 math under a 16-bit policy, kernels with dims not multiples
    of 8) for the tensor-core advice. Reads the model, changes nothing.

    The first list is empty unless some layer computes in float16/bfloat16; the last layer
    is left out of it (a float32 output is what the mixed-precision guide asks for).
    """
    layers = _leaf_layers(model)
    half = ("float16", "bfloat16")
    mixed = [la for la in layers if getattr(la, "compute_dtype", None) in half]
    with_kernel = [la for la in layers if getattr(la, "kernel", None) is not None]
    float32 = []
    if mixed:
        last = with_kernel[-1] if with_kernel else None
        float32 = [
            f"`{la.name}`"
            for la in with_kernel
            if la is not last and getattr(la, "compute_dtype", None) == "float32"
        ]
    return float32, _odd_dims(mixed or with_kernel)


# ----------------------------------------------------------------------------------------
# Effects: measurements


# The clock of the time budget (tests replace it with a scripted one).
_now = time.perf_counter


class _Timer(keras.callbacks.Callback):
    """Times each call of the train function; stops `fit` at a deadline.

    `deadline` (on `_now`'s clock) bounds the whole fit; `timed_limit_s` bounds the timed
    part, counted from the end of the warm-up calls (so tracing and compiling are bounded by
    the deadline only). The median then uses the steps that ran.
    """

    def __init__(self, calls_warm: int = 0, deadline=None, timed_limit_s=None):
        super().__init__()
        self.times: list[float] = []
        self.calls_warm = calls_warm
        self.deadline = deadline
        self.timed_limit_s = timed_limit_s
        self.warm_at: float | None = None

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())
        if self.deadline is None and self.timed_limit_s is None:
            return
        now = _now()
        if len(self.times) == self.calls_warm:
            self.warm_at = now
        late = self.deadline is not None and now >= self.deadline
        if self.timed_limit_s is not None and self.warm_at is not None:
            late = late or now - self.warm_at >= self.timed_limit_s
        if late:
            self.model.stop_training = True


def _fit_step_time(
    model, dataset, steps: int, warmup: int, deadline=None, timed_limit_s=None
) -> float | None:
    """Seconds per training step from `fit`, the median over calls after warm-up.

    Stopped at `deadline` (or `timed_limit_s` after the warm-up): the median uses the timed
    calls that ran. None when the deadline came before one timed call: a time from warm-up
    calls (tracing, compiling) is not a step time.
    """
    spe = max(1, int(model.steps_per_execution))
    calls_warm = max(2, math.ceil(warmup / spe))
    calls_timed = max(6, math.ceil(steps / spe))
    timer = _Timer(calls_warm, deadline, timed_limit_s)
    model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=(calls_warm + calls_timed) * spe,
        verbose=0,
        shuffle=False,
        callbacks=[timer],
    )
    model.stop_training = False
    gaps = [b - a for a, b in itertools.pairwise(timer.times[calls_warm - 1 :])]
    return statistics.median(gaps) / spe if gaps else None


@dataclass
class _Budget:
    """The time budget of one diagnosis, on `_now`'s clock (None: no limit)."""

    seconds: float | None
    start: float = field(default_factory=lambda: _now())

    @property
    def deadline(self) -> float | None:
        """When measuring stops: the rest of the budget counts FLOPs and restores the model."""
        return None if self.seconds is None else self.start + _MEASURE_SHARE * self.seconds

    def left(self) -> float:
        deadline = self.deadline
        return math.inf if deadline is None else deadline - _now()


def _compare(
    model,
    dataset,
    steps,
    warmup,
    attrs: dict[str, Any],
    *,
    threshold: float = 1.0,
    budget: _Budget | None = None,
    max_rounds: int = _PROBE_MAX_ROUNDS,
) -> tuple[list[tuple[float, float]], str | None]:
    """Per-round step times (baseline, variant) with `attrs` set on the model, interleaved.

    Alternates the two (variant first) for at least `_MIN_ROUNDS` rounds, more (up to
    `max_rounds`) while the interval of the per-round ratios straddles `threshold`. Stops
    early, saying why: after the first round when the variant is `PROBE_CLEARLY_SLOWER`
    than the baseline, or when the budget is spent. Each variant fit's timed part is limited
    to `_PROBE_FIT_LIMIT_FACTOR` times the baseline's. Each variant's compiled train function
    is kept and swapped in, so nothing is traced twice.

    Returns:
        (rounds, why it stopped early or None).
    """
    budget = budget or _Budget(None)
    saved = {k: getattr(model, k) for k in attrs}
    functions: dict[str, Any] = {"base": model.train_function, "variant": None}
    rounds: list[tuple[float, float]] = []
    stopped = None
    base_timed_s: float | None = None
    try:
        for i in range(max_rounds):
            if i >= _MIN_ROUNDS and _probe_settled(rounds, threshold):
                break
            if i > 0 and budget.left() <= 0:
                stopped = "budget"
                break
            times = {}
            for name, values in (("variant", attrs), ("base", saved)):
                for k, v in values.items():
                    setattr(model, k, v)
                model.train_function = functions[name]
                limit = None
                if name == "variant" and base_timed_s is not None:
                    limit = _PROBE_FIT_LIMIT_FACTOR * base_timed_s
                times[name] = _fit_step_time(
                    model, dataset, steps, warmup, deadline=budget.deadline, timed_limit_s=limit
                )
                functions[name] = model.train_function
            if times["base"] is None or times["variant"] is None:  # cut before a timed step
                stopped = "budget"
                break
            rounds.append((times["base"], times["variant"]))
            if base_timed_s is None:
                base_timed_s = times["base"] * max(6, steps) + 1.0
            if i == 0 and times["variant"] > PROBE_CLEARLY_SLOWER * times["base"]:
                stopped = "slower"
                break
    finally:
        for k, v in saved.items():
            setattr(model, k, v)
        model.train_function = functions["base"]
    return rounds, stopped


def _has_gpu_kernel(node, registry: dict[str, list | None]) -> bool:
    """Whether a GPU (or device-agnostic) kernel is registered for `node`'s op and dtypes."""
    from tensorflow.python.framework import kernels

    if node.op not in registry:
        try:
            found = kernels.get_registered_kernels_for_op(node.op).kernel
        except Exception:  # a function call op, or an op this build does not know
            found = None
        registry[node.op] = (
            None if found is None else [k for k in found if k.device_type in ("GPU", "DEFAULT")]
        )
    candidates = registry[node.op]
    if candidates is None:
        return True  # unknown here: do not accuse it
    for kernel in candidates:
        if all(_fits(node.attr.get(c.name), c.allowed_values.list.type) for c in kernel.constraint):
            return True
    return False


def _fits(attr, allowed) -> bool:
    """Whether a node's type attribute is one a kernel constraint allows."""
    if attr is None or not allowed:
        return True
    which = attr.WhichOneof("value")
    if which == "type":
        return attr.type in allowed
    if which == "list":
        return all(t in allowed for t in attr.list.type)
    return True


def _train_step_ops(model, batch) -> list[_OpFact]:
    """Traces the model's train step on `batch` and lists its ops (no step runs).

    Reads every node of the traced graph and of the functions it calls (layers, control
    flow): its type, the device it asks for, and whether TensorFlow has a GPU kernel for it
    (from the kernel registry; soft placement puts an op without one on the CPU). Under a
    strategy with several replicas the strategy places ops itself (reductions, copies), so
    the devices asked for are not kept there: only Python ops and ops without a GPU kernel
    count.
    """
    strategy = model.distribute_strategy
    keep_devices = int(strategy.num_replicas_in_sync) == 1

    def step(data):
        return strategy.run(model.train_step, args=(data,))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Gradients do not exist": not ours to say
        graph = tf.function(step).get_concrete_function(batch).graph.as_graph_def()
    registry: dict[str, list | None] = {}
    nodes = list(graph.node)
    for fn in graph.library.function:
        nodes += list(fn.node_def)
    return [
        _OpFact(
            node.name, node.op, node.device if keep_devices else "", _has_gpu_kernel(node, registry)
        )
        for node in nodes
    ]


# Dataset ops that pass their input's elements on as they come (no per-element work, no
# buffer): a prefetch below one of them still hands batches over from its buffer.
_PASS_THROUGH_OPS = frozenset(
    {
        "OptionsDataset",
        "ModelDataset",
        "OptimizeDataset",
        "OptimizeDatasetV2",
        "MaxIntraOpParallelismDataset",
        "ExperimentalMaxIntraOpParallelismDataset",
        "PrivateThreadPoolDataset",
        "ExperimentalPrivateThreadPoolDataset",
        "ThreadPoolDataset",
        "ExperimentalThreadPoolDataset",
        "AssertCardinalityDataset",
        "AssertNextDataset",
        "ExperimentalAssertNextDataset",
        "AssertPrefetchDataset",
        "NonSerializableDataset",
        "ExperimentalNonSerializableDataset",
        "RepeatDataset",
        "TakeDataset",
    }
)


_PARALLEL_MAP_OPS = frozenset(
    {
        "ParallelMapDataset",
        "ParallelMapDatasetV2",
        "MapAndBatchDataset",
        "ExperimentalMapAndBatchDataset",
    }
)
_SEQUENTIAL_MAP_OPS = frozenset({"MapDataset"})
_CACHE_OPS = frozenset({"CacheDataset", "CacheDatasetV2"})
_BATCH_OPS = frozenset({"BatchDataset", "BatchDatasetV2", "PaddedBatchDatasetV2"})
_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless", "GeneratorDataset"})


@dataclass(frozen=True)
class _PipelineFacts:
    """What the dataset's graph says about its input pipeline (see `_read_pipeline`)."""

    python_input: bool = False  # py_function / generator somewhere in the pipeline
    prefetch: bool = True  # the last stage that does work is a prefetch
    parallel_map: bool = False  # some map runs with num_parallel_calls
    sequential_map: bool = False  # some map runs one element at a time
    cache: str | None = None  # "memory", "file" or None
    map_after_cache: bool = False  # per-example work after the cache (augmentation)
    private_threadpool_size: int | None = None  # tf.data.Options().threading


def _read_pipeline(ds) -> _PipelineFacts | None:
    """Reads the dataset's graph: Python ops, maps, cache, the final prefetch, thread pool.

    Follows the chain of stages from the output back to the source (each stage's first
    input). None when TensorFlow cannot serialize the dataset (no facts, no finding).
    """
    try:
        serialized = tf.raw_ops.DatasetToGraphV2(
            input_dataset=ds._variant_tensor, external_state_policy=1
        )
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(serialized.numpy())
    except Exception:  # a dataset TF cannot serialize
        return None
    ops = [n.op for n in graph.node]
    for fn in graph.library.function:
        ops += [n.op for n in fn.node_def]
    by_name = {n.name: n for n in graph.node}

    def node_of(ref: str):
        return by_name.get(ref.split(":")[0].lstrip("^"))

    ret = next((n for n in graph.node if n.op == "_Retval"), None)
    chain: list[Any] = []  # stages (NodeDefs) from the output back to the source
    top = node_of(ret.input[0]) if ret is not None and ret.input else None
    while top is not None and len(chain) < 10_000:
        chain.append(top)
        top = node_of(top.input[0]) if top.input else None

    working = [n for n in chain if n.op not in _PASS_THROUGH_OPS]
    if ret is not None and ret.input:
        prefetch = bool(working) and "Prefetch" in working[0].op
    else:
        prefetch = "PrefetchDataset" in ops
    cache, map_after_cache, batched = None, False, False
    for node in chain:  # from the output back: maps seen before the cache come after it
        if node.op in _BATCH_OPS or node.op in ("MapAndBatchDataset",):
            batched = True
        if node.op in _CACHE_OPS:
            filename = node_of(node.input[1]) if len(node.input) > 1 else None
            values = list(filename.attr["value"].tensor.string_val) if filename else []
            cache = "file" if values and values[0] else "memory"
            break
        if batched and node.op in _PARALLEL_MAP_OPS | _SEQUENTIAL_MAP_OPS:
            map_after_cache = True  # per-example map between the cache and the batch
        if node.op == "MapAndBatchDataset":
            map_after_cache = True
    if cache is None:
        map_after_cache = False
    try:
        pool = ds.options().threading.private_threadpool_size
    except Exception:
        pool = None
    return _PipelineFacts(
        python_input=any(o in _PYTHON_OPS for o in ops),
        prefetch=prefetch,
        parallel_map=any(n.op in _PARALLEL_MAP_OPS for n in chain),
        sequential_map=any(n.op in _SEQUENTIAL_MAP_OPS for n in chain),
        cache=cache,
        map_after_cache=map_after_cache,
        private_threadpool_size=pool,
    )


def _gpu_facts(notes: list[str]) -> tuple[str | None, list[tuple[int, int]], int | None]:
    """(name, compute capabilities, memory bytes) of the GPUs TensorFlow uses, /GPU:0 first."""
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return None, [], None
    name, ccs, capacity = None, [], None
    for g in gpus:
        try:
            details = tf.config.experimental.get_device_details(g)
        except Exception:
            details = {}
        if details.get("compute_capability"):
            ccs.append(tuple(details["compute_capability"]))
        name = name or details.get("device_name")
    try:
        from tfgpu.callbacks import _tf_gpu_positions
        from tfgpu.monitor.nvml import inventory, visible_gpus

        inv = inventory()
        # TensorFlow's /GPU:0: after CUDA_VISIBLE_DEVICES and tf.config.set_visible_devices.
        cuda = visible_gpus(inv.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        positions = [p for p in (_tf_gpu_positions() or [0]) if p < len(cuda)]
        if inv.available and positions:
            first = cuda[positions[0]]
            name = first.name or name
            capacity = int(first.memory_total_mib * 2**20)
        elif inv.error:
            notes.append(f"NVML unavailable ({inv.error}): no memory capacity, no monitor")
    except Exception as e:  # side feature
        notes.append(f"NVML query failed: {e}")
    return name, ccs, capacity


def _policy_name(model) -> str:
    for layer in model._flatten_layers(include_self=False):
        if layer.weights:
            return layer.dtype_policy.name
    return keras.mixed_precision.global_policy().name


def _loss_scale(model) -> float | None:
    opt = getattr(model, "optimizer", None)
    scale = getattr(opt, "dynamic_scale", None)
    if scale is None:
        return None
    try:
        return float(np.asarray(scale.numpy() if hasattr(scale, "numpy") else scale))
    except Exception:
        return None


def _batch_of(ds) -> tuple[Any, int | None]:
    batch = next(iter(ds))
    first = tf.nest.flatten(batch)[0]
    size = int(first.shape[0]) if first.shape.rank else None
    return batch, size


def _check_batch(model, batch, dataset: tf.data.Dataset) -> None:
    """Refuses data `fit` cannot train on, naming the problem, before any measurement.

    Single examples are told from batches by the dataset's input chain (an unbatched source
    with no batch step after it) or, where the chain cannot tell, by the model's input rank.
    """
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    ranks = [t.shape.rank for t in tf.nest.flatten(x)]
    expected = [len(t.shape) for t in tf.nest.flatten(getattr(model, "inputs", None) or [])]
    if (
        0 in ranks
        or chain_state(dataset)[0] == "examples"
        or (
            expected
            and len(expected) == len(ranks)
            and all(r == e - 1 for r, e in zip(ranks, expected))
        )
    ):
        shapes = [tuple(t.shape) for t in tf.nest.flatten(x)]
        raise ValueError(
            "Invalid value for argument `dataset`. Received: a dataset of single examples "
            f"(inputs of shape {shapes[0] if len(shapes) == 1 else shapes}). Expected batches, "
            "as `fit` takes them: `dataset.batch(32)`, or `tfgpu.data.pipeline(..., "
            "batch_size=32)`."
        )
    custom_step = type(model).train_step is not keras.Model.train_step
    if y is None and getattr(model, "loss", None) is not None and not custom_step:
        raise ValueError(
            "Invalid value for argument `dataset`. Received: batches of inputs without labels "
            f"while the model was compiled with loss={model.loss!r}. Expected `(x, y)` or "
            "`(x, y, sample_weight)` batches (diagnose trains the model as `fit` would)."
        )


def _device_dataset(batch, on_gpu: bool):
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    if on_gpu:
        return ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0", buffer_size=2))
    return ds.prefetch(2)


def _shape_facts(ds) -> tuple[str | None, bool]:
    """(a batch component's shape that changes from batch to batch, as text, or None; whether
    batches differ in size: a partial last batch, no `drop_remainder`).

    A `None` batch dimension alone does not change shapes when every batch is full.
    """
    try:
        batches, _ = source_batches(ds)
    except Exception:
        batches = None
    partial = bool(
        batches is not None
        and not batches.drop_remainder
        and (
            batches.num_examples is None
            or not batches.batch_size
            or batches.num_examples % batches.batch_size != 0
        )
    )
    dynamic = None
    for leaf in tf.nest.flatten(ds.element_spec):
        shape = getattr(leaf, "shape", None)
        if shape is None or not shape.rank:
            continue
        dims = shape.as_list()
        if any(d is None for d in dims[1:]) or (dims[0] is None and partial):
            dynamic = "(" + ", ".join("None" if d is None else str(d) for d in dims)
            dynamic += ",)" if shape.rank == 1 else ")"
            break
    return dynamic, partial and dynamic is not None


def _host_load() -> float | None:
    """The 1-minute load average per CPU core, or None where the OS does not say."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def _warm_real(model, ds, repeated, budget: _Budget) -> None:
    """One untimed pass over the real data's first epoch (every batch shape it has, the
    partial last batch included), so retracing and recompiling fall outside the timed runs.

    Capped at 64 batches and by the budget; an infinite or unknown-length dataset is warmed
    by the timed runs' own warm-up only.
    """

    try:
        n = cardinality(ds)
    except Exception:
        n = None
    if not n or n < 0:
        return
    spe = max(1, int(model.steps_per_execution))
    calls = min(64, max(1, math.ceil(n / spe)) + 1)
    model.fit(
        repeated,
        epochs=1,
        steps_per_epoch=calls * spe,
        verbose=0,
        shuffle=False,
        callbacks=[_Timer(0, budget.deadline, None)],
    )
    model.stop_training = False


def _probe_record(
    base_name: str, variant_name: str, rounds: list[tuple[float, float]], stopped: str | None
) -> dict[str, Any]:
    """A probe's measurements: median step times, the gain and its interval, the rounds."""
    gain, low, high = _probe_gain(rounds, None, None)
    record: dict[str, Any] = {
        base_name: statistics.median(b for b, _ in rounds) if rounds else None,
        variant_name: statistics.median(v for _, v in rounds) if rounds else None,
        "gain": gain,
        "gain_low": low,
        "gain_high": high,
        "rounds": [{"baseline_s": b, "variant_s": v} for b, v in rounds],
    }
    if stopped:
        record["stopped"] = stopped
    return record


def _probe_notes(
    name: str, rounds: list[tuple[float, float]], stopped: str | None, budget_s: float | None
) -> list[str]:
    """One line on a probe that stopped early or could not tell its gain from noise."""
    gain, low, high = _probe_gain(rounds, None, None)
    if gain is None:
        return []
    if stopped == "slower":
        return [f"{name} measured {1 / gain:.1f}x slower after one round: not measured further"]
    if stopped == "budget":
        return [
            f"{name} probe cut short by the time budget of {budget_s:g} s after "
            f"{len(rounds)} round(s): {gain:.2f}x ({low:.2f}x to {high:.2f}x)"
        ]
    return []


def _flops(model, x, size, real, policy, gpu_name, ccs, on_gpu):
    """(FLOPs per step, achieved FLOP/s, MFU, notes), counted with the batch's own shapes and
    checked against the device's peak: a count above the peak is not reported as achieved."""
    from tfgpu.flops import mfu, peak_flops, train_step_flops

    notes: list[str] = []
    if not size:
        return None, None, None, notes
    try:
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), x)
        if isinstance(signature, (list, tuple)) and len(signature) == 1:
            signature = signature[0]
        flops = train_step_flops(model, size, input_signature=signature)
    except Exception as e:  # FLOP counting is a side feature
        # Its message may advise arguments of `train_step_flops`; diagnose takes none of them.
        text = one_line(e)
        text = ". ".join(p for p in text.split(". ") if "input_signature" not in p)
        notes.append(f"FLOPs not counted: {text.rstrip('.')}")
        return None, None, None, notes
    if not flops or not real or real <= 0:
        return flops or None, None, None, notes
    achieved = flops / real
    peak = None
    try:
        if on_gpu:
            peak = peak_flops(gpu_name, _precision_peak_key(policy, ccs)) if gpu_name else None
        else:
            from tfgpu import _cpu

            peak = _cpu.peak_flops(policy)
    except Exception:
        peak = None
    if peak and achieved > peak:
        notes.append(
            f"FLOP count cannot be right: {achieved / 1e9:,.1f} GFLOP/s counted exceeds this "
            f"device's peak of about {peak / 1e9:,.1f} GFLOP/s (not reported as achieved)"
        )
        return flops, None, None, notes
    mfu_value = mfu(flops, real, peak) if on_gpu and peak else None
    return flops, achieved, mfu_value, notes


def _check_args(model, steps, warmup, batch_size, run_dir, profile):
    check_int("steps", steps, minimum=3)
    check_int("warmup", warmup, minimum=1)
    check_int("batch_size", batch_size, allow_none=True, expected="a positive int or None")
    if not isinstance(model, keras.Model):
        raise invalid_type("model", model, "a compiled `keras.Model`")
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ValueError(
            "Invalid value for argument `model`. Received: a model that is not compiled. "
            "Expected a model after `model.compile(optimizer, loss)`."
        )
    check_dir("run_dir", run_dir, allow_none=True)
    if profile and run_dir is None:
        raise ValueError(
            "Invalid value for argument `profile`. Received: profile=True with run_dir=None. "
            "Expected a `run_dir` to write the trace into."
        )


def _as_dataset(dataset, batch_size):
    """Returns (batched dataset, fed-as-NumPy flag)."""
    if isinstance(dataset, tf.data.Dataset):
        return dataset, False
    arrays = dataset
    if isinstance(arrays, (tuple, list, dict)) or hasattr(arrays, "shape"):
        flat = tf.nest.flatten(arrays)
        if flat and all(hasattr(a, "shape") for a in flat):
            ds = tf.data.Dataset.from_tensor_slices(
                tuple(arrays) if isinstance(arrays, list) else arrays
            )
            return ds.batch(batch_size or 32), True
    raise invalid_type(
        "dataset", dataset, "a `tf.data.Dataset` of batches, or arrays `(x, y)` with `batch_size=`"
    )


def diagnose(
    model,
    dataset,
    *,
    steps: int = 20,
    warmup: int = 3,
    batch_size: int | None = None,
    run_dir=None,
    check_xla: bool = True,
    check_steps_per_execution: bool = True,
    monitor: bool = True,
    profile: bool = False,
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S,
) -> Diagnosis:
    """Measures a short training run and says what holds the GPU back, and what to change.

    Measures, in this order of priority, each for `warmup` + `steps` steps: the input
    pipeline alone (`tfgpu.data.benchmark`); `fit` on one batch already in device memory and
    `fit` on the real `dataset` (sampled by `tfgpu.monitor` where a GPU exists), alternated in
    rounds until the input-wait share is clear of the 5% and 20% thresholds (at least 3
    rounds, at most 12) or says "inconclusive"; with `check_steps_per_execution`, steps
    shorter than 50 ms timed with `steps_per_execution=16`; with `check_xla`, the
    device-resident run with `jit_compile` flipped. Everything stays within `time_budget_s`:
    a probe that does not fit is skipped (a note says so), a variant clearly slower than its
    baseline after one round is not measured further. On a GPU, the train step is also traced (not run) to find ops
    that would run on the CPU. The findings (see `docs/diagnosis.md`) name the argument to
    change and the gain, measured where it could be. The model's weights, optimizer state,
    metrics and compile settings are restored afterwards.

    Args:
        model: keras.Model, compiled.
        dataset: `tf.data.Dataset` of batches (what you pass to `fit`), or NumPy arrays
            `(x, y)` with `batch_size`.
        steps: int, timed steps per measurement (>= 3). Defaults to 20.
        warmup: int, untimed steps first (tracing, buffers). Defaults to 3.
        batch_size: int or None, the batch for array input. Defaults to None (32).
        run_dir: str, os.PathLike or None, a run directory: `diagnosis.json` is written
            there (and a profiler trace with `profile=True`). Defaults to None.
        check_xla: bool, measure `jit_compile` both ways. Defaults to True.
        check_steps_per_execution: bool, probe `steps_per_execution=16`. Defaults to True.
        monitor: bool, sample GPU utilization/memory during the real run. Defaults to True.
        profile: bool, capture a TensorBoard profiler trace of a few steps into
            `run_dir/profile` (open with TensorBoard's Profile tab). Defaults to False.
        time_budget_s: float or None, seconds the measurements may take (each `fit` stops
            at the deadline; probes that do not fit are skipped with a note). None: no
            limit. Defaults to 60.0.

    Returns:
        A `Diagnosis`.

    Raises:
        ValueError: on invalid arguments, an uncompiled model, or an empty dataset.
        TypeError: if `model` is not a Keras model, `dataset` is neither a dataset nor
            arrays, or a flag is not a bool.

    Example:

    >>> diagnosis = tfgpu.diagnose(model, train, run_dir="runs/exp1")
    >>> print(diagnosis)           # bottleneck, findings, the knob to turn
    >>> diagnosis.bottleneck
    'input'
    """
    _check_args(model, steps, warmup, batch_size, run_dir, profile)
    check_bool("check_xla", check_xla)
    check_bool("check_steps_per_execution", check_steps_per_execution)
    check_bool("monitor", monitor)
    check_bool("profile", profile)
    time_budget_s = check_number(
        "time_budget_s",
        time_budget_s,
        minimum=0,
        exclusive_minimum=True,
        allow_none=True,
        expected="a finite number of seconds > 0, or None (no limit)",
    )
    budget = _Budget(time_budget_s)
    ds, numpy_input = _as_dataset(dataset, batch_size)
    try:
        batch, size = _batch_of(ds)
    except StopIteration:
        raise ValueError(
            "Invalid value for argument `dataset`. Received: an empty dataset. Expected at "
            "least one batch."
        ) from None
    _check_batch(model, batch, ds)
    run_path = check_dir("run_dir", run_dir, allow_none=True)
    if run_path is not None:
        run_path.mkdir(parents=True, exist_ok=True)

    notes: list[str] = []
    gpu_name, ccs, capacity = _gpu_facts(notes)
    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    mem_device = "GPU:0" if on_gpu else "CPU:0"
    pipeline_facts = _read_pipeline(ds) or _PipelineFacts()
    dynamic_shape, partial = _shape_facts(ds)

    from tfgpu.data import benchmark

    pipeline = benchmark(ds, num_batches=steps, warmup=warmup)

    saved = {
        "steps_per_execution": model.steps_per_execution,
        "jit_compile": model.jit_compile,
        "history": getattr(model, "history", None),
    }
    # Build the model and its optimizer first: slot variables created by the probe steps
    # would escape the snapshot, and training afterwards would start from the probes' state.
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    _prepare_model(model, (x,))
    snapshot = _snapshot_state(model)
    scale_before = _loss_scale(model)
    measurements: dict[str, Any] = {"pipeline": pipeline.to_dict()}
    monitor_aggregate: dict[str, float] = {}
    profile_dir = None
    try:
        device_ds = _device_dataset(batch, on_gpu)
        try:
            tf.config.experimental.reset_memory_stats(mem_device)
        except Exception:
            pass
        # The first pair (this and the first real run) always runs in full, whatever the
        # budget: a diagnosis needs one step time of each.
        compute = _fit_step_time(model, device_ds, steps, warmup)
        try:
            peak = int(tf.config.experimental.get_memory_info(mem_device)["peak"])
        except Exception:
            peak = None
        measurements["peak_memory_bytes"] = peak
        train_step_ops: list[_OpFact] = []
        if on_gpu and not model.jit_compile:  # where ops run matters only beside a GPU
            try:
                train_step_ops = _train_step_ops(model, batch)
            except Exception as e:  # a side check: a note, not a crash
                notes.append(f"train-step op placement not checked: {one_line(e)}")

        sampler = None
        if monitor and on_gpu:
            try:
                from tfgpu.callbacks import _sampler_gpus, _tf_gpu_positions
                from tfgpu.monitor import Sampler

                # The GPUs TensorFlow trains on, /GPU:0 first (gpu0_* in the aggregates).
                sampler = Sampler(interval=0.1, gpus=_sampler_gpus(None, _tf_gpu_positions()))
                sampler.start()
            except Exception as e:  # side feature: never kill the diagnosis
                notes.append(f"GPU monitor not started: {one_line(e)}")
                sampler = None
        rounds: list[tuple[float, float]] = []
        try:
            # Warm the real data once through every batch shape it has (a partial last batch
            # retraces the step, and recompiles it under XLA): not inside a timed window.
            repeated = ds.repeat()
            _warm_real(model, ds, repeated, budget)
            # Alternate the device-resident and the real runs, so that a noisy host favours
            # neither, until the input-wait share is clear of the thresholds.
            rounds_until = (
                None
                if budget.seconds is None
                else budget.start + _ROUNDS_BUDGET_SHARE * budget.seconds
            )
            for i in range(_MAX_ROUNDS):
                if i > 0:
                    if budget.left() <= 0:
                        break
                    if i >= _MIN_ROUNDS:
                        if _share_verdict(rounds)["level"] != "inconclusive":
                            break
                        if rounds_until is not None and _now() >= rounds_until:
                            break
                    compute = _fit_step_time(model, device_ds, steps, warmup, budget.deadline)
                real = _fit_step_time(
                    model, repeated, steps, warmup, budget.deadline if i > 0 else None
                )
                if compute is None or real is None:  # the budget ran out before a timed step
                    break
                rounds.append((compute, real))
            if len(rounds) < _MIN_ROUNDS:
                notes.append(
                    f"only {len(rounds)} of {_MIN_ROUNDS} rounds ran within the time budget of "
                    f"{time_budget_s:g} s: pass a larger `time_budget_s`"
                )
            compute = statistics.median(c for c, _ in rounds)
            real = statistics.median(r for _, r in rounds)
            measurements["rounds"] = [{"device_resident_s": c, "real_s": r} for c, r in rounds]
        finally:
            if sampler is not None:
                try:
                    sampler.stop()
                    monitor_aggregate = sampler.aggregate()
                except Exception as e:
                    notes.append(f"GPU monitor failed: {one_line(e)}")
        if not on_gpu:
            notes.append("no GPU visible to TensorFlow: measured on the CPU, no GPU monitor")
        scale_after = _loss_scale(model)

        skipped: list[str] = []
        spe_rounds: list[tuple[float, float]] = []
        spe = int(model.steps_per_execution)
        spe_name = f"steps_per_execution={PROBE_STEPS_PER_EXECUTION}"
        if check_steps_per_execution and spe == 1 and compute < HOST_OVERHEAD_PROBE_BELOW_S:
            if budget.left() <= 0:
                skipped.append(f"the {spe_name} probe")
            else:
                try:
                    spe_rounds, stopped = _compare(
                        model,
                        device_ds,
                        steps,
                        warmup,
                        {"steps_per_execution": PROBE_STEPS_PER_EXECUTION},
                        threshold=HOST_OVERHEAD_MIN_GAIN,
                        budget=budget,
                    )
                    measurements["steps_per_execution_probe"] = _probe_record(
                        "steps_per_execution=1", spe_name, spe_rounds, stopped
                    )
                    notes.extend(_probe_notes(spe_name, spe_rounds, stopped, time_budget_s))
                except Exception as e:  # a probe never kills the diagnosis
                    notes.append(f"{spe_name} not measured: {one_line(e)}")
                    spe_rounds = []
        xla_rounds: list[tuple[float, float]] = []
        if check_xla:
            current = bool(model.jit_compile)
            xla_name = f"jit_compile={not current}"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model.jit_compile = not current
                supported = bool(model.jit_compile) != current
                model.jit_compile = current
                if not supported:
                    notes.append("XLA not measured: the model does not support jit_compile")
                elif budget.left() <= 0:
                    skipped.append(f"the {xla_name} probe")
                else:
                    xla_rounds, stopped = _compare(
                        model,
                        device_ds,
                        steps,
                        warmup,
                        {"jit_compile": not current},
                        threshold=XLA_MIN_GAIN,
                        budget=budget,
                    )
                    measurements["xla"] = _probe_record(
                        f"jit_compile={current}", xla_name, xla_rounds, stopped
                    )
                    notes.extend(_probe_notes(xla_name, xla_rounds, stopped, time_budget_s))
            except Exception as e:  # XLA may not compile every op: one line, not a crash
                notes.append(f"XLA not measured: {xla_name} failed ({one_line(e)})")
                xla_rounds = []
            finally:
                model.jit_compile = current
                model.train_function = None
        if skipped:
            notes.append(
                f"skipped for the time budget of {time_budget_s:g} s: {', '.join(skipped)} "
                "(pass a larger `time_budget_s`, or None for no limit)"
            )

        if profile and run_path is not None:
            profile_dir = str(run_path / "profile")
            try:
                tf.profiler.experimental.start(profile_dir)
                try:
                    model.fit(
                        ds.repeat(), epochs=1, steps_per_epoch=max(3, spe), verbose=0, shuffle=False
                    )
                finally:
                    tf.profiler.experimental.stop()
            except Exception as e:  # profiler errors should not be fatal
                notes.append(f"profiler trace failed: {one_line(e)}")
                profile_dir = None
    finally:
        _restore_state(model, snapshot)
        model.steps_per_execution = saved["steps_per_execution"]
        model.jit_compile = saved["jit_compile"]
        model.train_function = None
        if saved["history"] is not None:
            model.history = saved["history"]

    policy = _policy_name(model)
    f = _Facts(
        step_time_s=real,
        compute_step_time_s=compute,
        input_batch_time_s=1.0 / pipeline.batches_per_second,
        batch_size=size,
        steps_per_execution=int(saved["steps_per_execution"]),
        jit_compile=bool(saved["jit_compile"]),
        rounds=rounds,
        spe_rounds=spe_rounds,
        xla_rounds=xla_rounds,
        made_by_pipeline=made_by_pipeline(dataset),
        dynamic_shape=dynamic_shape,
        partial_batches=partial,
        replicas=int(model.distribute_strategy.num_replicas_in_sync),
        host_load=_host_load(),
        on_gpu=on_gpu,
        gpu_name=gpu_name,
        compute_capabilities=ccs,
        policy=policy,
        peak_memory_bytes=measurements.get("peak_memory_bytes"),
        memory_capacity_bytes=capacity,
        numpy_input=numpy_input,
        python_input=pipeline_facts.python_input,
        prefetch=pipeline_facts.prefetch,
        parallel_map=pipeline_facts.parallel_map,
        sequential_map=pipeline_facts.sequential_map,
        cache=pipeline_facts.cache,
        map_after_cache=pipeline_facts.map_after_cache,
        private_threadpool_size=pipeline_facts.private_threadpool_size,
        train_step_ops=train_step_ops,
        loss_scale_before=scale_before,
        loss_scale_after=scale_after,
        batch_bytes=_batch_bytes(batch),
    )
    for name, value in _monitor_facts(monitor_aggregate).items():
        setattr(f, name, value)
    if on_gpu:
        try:
            f.tf32_enabled = bool(tf.config.experimental.tensor_float_32_execution_enabled())
            f.float32_layers, f.odd_dim_layers = _precision_layers(model)
        except Exception as e:  # side facts: a note, not a crash
            notes.append(f"tensor-core facts not read: {one_line(e)}")
    bottleneck, level, share, findings = _classify(f)
    notes += _unseen(f)
    verdict = _share_verdict(rounds)
    wait = verdict["wait_s"]
    noise = None
    measurements["noise"] = None
    if verdict["rounds"] >= _MIN_ROUNDS:  # fewer rounds cannot tell the noise
        noise = verdict["high"] - verdict["low"]
        measurements["noise"] = {
            "low": verdict["low"],
            "high": verdict["high"],
            "confidence": verdict["confidence"],
            "rounds": verdict["rounds"],
        }
    if verdict["level"] == "inconclusive" and level == "no":
        notes.append(
            f"input wait between {verdict['low']:.0%} and {verdict['high']:.0%} of the step "
            f"over {verdict['rounds']} rounds (noisy), but the pipeline alone makes a batch in "
            f"{f.input_batch_time_s * 1e3:.2f} ms: even at half that speed it could not hold "
            f"back {INPUT_BOUND_MODERATE:.0%} of a {real * 1e3:.2f} ms step, so not input-bound"
        )
    elif (
        level == "inconclusive"
        and verdict["rounds"] >= _MIN_ROUNDS  # fewer: the budget note says why
        and all(x.kind != "input_wait_unexplained" for x in findings)
    ):
        notes.append(
            f"input wait between {verdict['low']:.0%} and {verdict['high']:.0%} of the step "
            f"over {verdict['rounds']} rounds ({verdict['confidence']:.0%} confidence): too "
            f"noisy to call against the {INPUT_BOUND_MODERATE:.0%} and {INPUT_BOUND_HIGH:.0%} "
            "thresholds; rerun on a quieter machine or with a larger `time_budget_s`"
        )
    if level == "no" and share >= INPUT_BOUND_MODERATE:
        notes.append(
            f"input wait {wait * 1e3:.2f} ms per step ({share:.0%}) is below "
            f"{INPUT_WAIT_MIN_S * 1e3:g} ms: tf.data's per-batch hand-over, not the pipeline's "
            "work, so not called input-bound"
        )
    findings += _lint_mixed_precision(model, ccs)

    flops, achieved, mfu_value, flop_notes = _flops(
        model, x, size, real, policy, gpu_name, ccs, on_gpu
    )
    notes += flop_notes
    measurements["wall_s"] = _now() - budget.start
    measurements["time_budget_s"] = time_budget_s

    device = f"GPU:0 ({gpu_name})" if on_gpu else "CPU"
    diagnosis = Diagnosis(
        bottleneck=bottleneck,
        input_bound=level,
        input_wait_share=share,
        step_time_s=real,
        compute_step_time_s=compute,
        input_batch_time_s=f.input_batch_time_s,
        batch_size=size,
        examples_per_second=(size or 0) / real if real > 0 else math.nan,
        findings=findings,
        device=device,
        flops_per_step=flops,
        achieved_flops_per_second=achieved,
        mfu=mfu_value,
        monitor=monitor_aggregate,
        measurements=measurements,
        notes=notes,
        profile_dir=profile_dir,
        noise=noise,
    )
    if run_path is not None:  # an earlier diagnosis is kept as diagnosis.1.json, ...
        path = run_path / "diagnosis.json"
        rotate(path)
        write_text_atomic(path, json.dumps(diagnosis.to_dict(), indent=2))
    return diagnosis
