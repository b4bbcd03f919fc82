"""What a diagnosis decides from: the core's workload facts extended with what only `diagnose`
measures (`DiagnoseFacts`, `OpFact`), and its own thresholds (sources: docs/diagnosis.md, "Thresholds
and their sources"; those it shares with `tune` are the core's, `_internal.measure.rules`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tfgpu._internal.measure.facts import WorkloadFacts

# The TensorFlow Profiler's input-pipeline analyzer: share of step time waiting for input
# (tensorflow/profiler: input_pipeline_analysis, kHighlyInputBoundThresholdInPercent = 20,
# kModeratelyInputBoundThresholdInPercent = 5).
INPUT_BOUND_HIGH = 0.20
INPUT_BOUND_MODERATE = 0.05

# ...and only when the wait is at least this long per step: below it the wait is tf.data's
# fixed per-batch hand-over, not the pipeline's work.
INPUT_WAIT_MIN_S = 1e-3

# An input wait longer than this many times the pipeline's own time per batch (plus
# `INPUT_WAIT_MIN_S`) is not the pipeline's doing: not called input-bound.
WAIT_UNEXPLAINED_FACTOR = 2.0

PROBE_STEPS_PER_EXECUTION = 16

# Peak device memory below this share of capacity leaves room for a larger batch.
MEMORY_HEADROOM_BELOW = 0.5

# A dynamic loss scale that halves this many times in a short run is collapsing.
LOSS_SCALE_MAX_HALVINGS = 4

# Shares of the budget: rounds beyond the first three stop at the first (the probes need the
# rest), measuring at the second (the rest counts FLOPs and restores the model); one fit's
# timed steps stop after the third (3 s of 60 s); where the fits still to come do not fit
# even so, they warm up on one step and time fewer (`fit_plan`).
ROUNDS_BUDGET_SHARE = 0.6
MEASURE_SHARE = 0.8
FIT_SHARE = 0.05


@dataclass
class DiagnoseFacts(WorkloadFacts):
    """Everything `classify` decides from: the workload's facts (`step_time_s` on the real data,
    `input_time_s` the pipeline alone per batch) and what `diagnose` measured beside them."""

    step_time_s: float = 0.0  # measured here: always a number
    input_time_s: float = 0.0
    compute_step_time_s: float = 0.0  # fit on one device-resident batch
    # Interleaved rounds: (device-resident, real) step times per round, and (baseline,
    # variant) per round of each probe (steps_per_execution=16; jit_compile flipped).
    rounds: list[tuple[float, float]] = field(default_factory=list)
    spe_rounds: list[tuple[float, float]] = field(default_factory=list)
    xla_rounds: list[tuple[float, float]] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    loss_scale_before: float | None = None
    loss_scale_after: float | None = None
    train_step_ops: list[OpFact] = field(default_factory=list)  # None read: empty
    # GPU counters from the monitored real run, gpu0 = TensorFlow's /GPU:0 (see
    # `monitor_facts`); NaN when not measured (no monitor, no GPM, no NVML counter).
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
    all_reduce_s: float | None = None  # the gradients' all-reduce alone, seconds per step
    gradient_bytes: int = 0  # one step's gradients
    host_load: float | None = None  # 1-minute load average per core


@dataclass(frozen=True)
class OpFact:
    """One op of the traced train step, as the graph has it (see `step_ops`)."""

    name: str  # e.g. "sequential/my_layer/EagerPyFunc"
    op: str  # the op type, e.g. "EagerPyFunc"
    device: str = ""  # the requested device ("" when the placer chooses)
    gpu_kernel: bool = True  # a GPU (or device-agnostic) kernel exists for its dtypes
