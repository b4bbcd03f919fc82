"""What a diagnosis decides from: the facts (`Facts`, `OpFact`), filled by `_diagnose` or by
hand in tests, and every threshold (their sources: docs/diagnosis.md, "Thresholds")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The TensorFlow Profiler's input-pipeline analyzer: share of step time waiting for input
# (tensorflow/profiler: input_pipeline_analysis, kHighlyInputBoundThresholdInPercent = 20,
# kModeratelyInputBoundThresholdInPercent = 5).
INPUT_BOUND_HIGH = 0.20
INPUT_BOUND_MODERATE = 0.05

# ...and only when the wait is at least this long per step: below it the wait is tf.data's
# fixed per-batch hand-over, not the pipeline's work.
INPUT_WAIT_MIN_S = 1e-3

# A faster variant counts only when it wins by at least this factor (noise margin).
HOST_OVERHEAD_MIN_GAIN = 1.3
XLA_MIN_GAIN = 1.1
# The all-reduce of the gradients holds the step when it takes this share of the compute step.
SCALING_SHARE = 0.25

# Probe steps_per_execution only for steps shorter than this (dispatch is ~0.1-1 ms/step).
HOST_OVERHEAD_PROBE_BELOW_S = 0.05

PROBE_STEPS_PER_EXECUTION = 16

# Peak device memory below this share of capacity leaves room for a larger batch.
MEMORY_HEADROOM_BELOW = 0.5

# A dynamic loss scale that halves this many times in a short run is collapsing.
LOSS_SCALE_MAX_HALVINGS = 4

# Interleaved rounds at most (at least `timing.MIN_ROUNDS`): the input wait's, a probe's.
MAX_ROUNDS = 12
PROBE_MAX_ROUNDS = 7

# An input wait longer than this many times the pipeline's own time per batch (plus
# `INPUT_WAIT_MIN_S`) is not the pipeline's doing: not called input-bound.
WAIT_UNEXPLAINED_FACTOR = 2.0

DEFAULT_TIME_BUDGET_S = 60.0

# Rounds beyond `MIN_ROUNDS` stop once this share of the budget is spent (the probes need
# the rest).
ROUNDS_BUDGET_SHARE = 0.6

# Measuring stops at this share of the budget; the rest counts FLOPs and restores the model.
MEASURE_SHARE = 0.8

# One fit's timed steps stop after this share of the budget (3 s of 60 s); where the fits
# still to come do not fit even so, they warm up on one step and time fewer (`fit_plan`).
FIT_SHARE = 0.05

# A probe that undoes a setting the model has (jit_compile=True) takes one round before the
# pairs, on the first device-resident step; that round is final when the variant is this
# much faster (or `timing.CLEARLY_SLOWER` slower). Rounds of one step on a loaded 2-core CPU
# differed by up to 1.7x: one round must show more than that.
CLEARLY_FASTER = 2.0


@dataclass
class Facts:
    """Everything `classify` decides from (filled by measurement or by tests)."""

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
    train_step_ops: list[OpFact] = field(default_factory=list)  # None read: empty
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
    epoch_examples: int | None = None  # examples per epoch, where the batch step's input says
    replicas: int = 1  # the strategy's replicas (> 1: a distributed iterator)
    all_reduce_s: float | None = None  # the gradients' all-reduce alone, seconds per step
    gradient_bytes: int = 0  # one step's gradients
    host_load: float | None = None  # 1-minute load average per core
    # The pipeline alone: the share of this process's usable cores it kept busy (NaN: not
    # measured), and those cores; whether it reads from tf.data service workers.
    pipeline_cpu_busy: float = math.nan
    cpu_cores: int = 0
    service: bool = False


@dataclass(frozen=True)
class OpFact:
    """One op of the traced train step, as the graph has it (see `step_ops`)."""

    name: str  # e.g. "sequential/my_layer/EagerPyFunc"
    op: str  # the op type, e.g. "EagerPyFunc"
    device: str = ""  # the requested device ("" when the placer chooses)
    gpu_kernel: bool = True  # a GPU (or device-agnostic) kernel exists for its dtypes
