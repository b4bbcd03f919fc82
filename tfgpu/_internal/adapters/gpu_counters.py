"""What GPU utilization hides: rules shared by `diagnose` and `tfgpu report`, pure functions of
one GPU's means over a window (a NaN decides nothing); thresholds and sources: docs/diagnosis.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tfgpu._internal.helpers.checks import is_finite_number

# Tensor cores idle: tensor-pipe activity below this while the GPU is busy at least...
TENSOR_ACTIVE_LOW_PCT = 5.0
TENSOR_BUSY_UTIL_PCT = 50.0
# Small kernels: utilization at least this high while SMs are active less than that.
SMALL_KERNELS_UTIL_PCT = 80.0
SMALL_KERNELS_SM_ACTIVE_PCT = 50.0
# Host-device traffic inside the step: PCIe bytes per step above this many batches' bytes;
# throttled: mean power below this share of the limit with a throttle reason other than idle.
PCIE_BATCH_FACTOR = 4.0
POWER_LOW_SHARE = 0.6

# NVML's clocks-event (throttle) reasons, bit -> (what it says, what to do): nvmlClocksEventReason*
# / nvmlClocksThrottleReason* in nvml.h; nvidia-smi --query-gpu=clocks_throttle_reasons.active.
THROTTLE_REASONS: dict[int, tuple[str, str]] = {
    0x2: ("applications clocks setting", "the application clocks are set below the maximum: "
          "`nvidia-smi -rac` resets them (needs root)"),
    0x4: ("SW power cap", "the driver holds clocks down to stay under the power limit: check it "
          "with `nvidia-smi -q -d POWER` and raise it with `nvidia-smi -pl` (needs root) if it "
          "was lowered"),
    0x8: ("HW slowdown", "the hardware halved the clocks (temperature too high or the power "
          "supply cannot deliver): check cooling and the power supply (`nvidia-smi -q -d "
          "PERFORMANCE`)"),
    0x10: ("sync boost", "clocks are held to those of the other GPUs of a sync-boost group: "
           "check the slowest one"),
    0x20: ("SW thermal slowdown", "the driver lowers clocks to keep the GPU under its "
           "temperature target: improve cooling and airflow (`nvidia-smi -q -d TEMPERATURE`)"),
    0x40: ("HW thermal slowdown", "the GPU reached its hardware temperature limit: fix the "
           "cooling (fans, airflow, blocked heatsink)"),
    0x80: ("HW power brake slowdown", "an external power-brake signal (the power supply or "
           "chassis) slows the GPU: check the system's power supply"),
    0x100: ("display clock setting", "clocks are limited by the display clock setting"),
}  # fmt: skip
THROTTLE_IDLE = 0x1  # "GPU idle": nothing to run, not a throttle
THROTTLE_SEVERE = 0x8 | 0x40 | 0x80  # hardware slowdowns: high severity

# What a GPU without these counters cannot show (notes, said once).
GPM_UNSEEN = (
    "tensor/SM activity not measured: GPM needs a Hopper or newer GPU; utilization alone "
    "cannot tell idle SMs from busy ones"
)
PCIE_UNSEEN = (
    "PCIe traffic not measured (no GPM or NVML PCIe counter on this GPU): host-device "
    "transfers inside the step not checked"
)
POWER_UNSEEN = "power limit or clock throttle reasons not reported by NVML: throttling not checked"

# Fixes that need no model: the generic halves of the recommendations.
ELEMENTWISE_FIX = (
    "if the step is mostly element-wise work (normalization, activations, embedding "
    "look-ups) rather than matmuls and convolutions, tensor cores have little to do: "
    "`jit_compile=True` fuses that work"
)
MULTIPLES_OF_8 = (
    "round `units` / `filters` / `output_dim` (pad vocabularies, channels, input features) "
    "to multiples of 8, which tensor cores need"
)
TENSOR_IDLE_FIX = (
    'Mixed precision: `tfgpu.configure(precision="mixed_bfloat16")` (`"mixed_float16"` before '
    f"Ampere) before building the model; {MULTIPLES_OF_8}; leave TF32 on for float32 matmuls "
    "(do not call `tf.config.experimental.enable_tensor_float_32_execution(False)`); "
    f"{ELEMENTWISE_FIX}. `tfgpu.diagnose(model, data)` names the layers that keep the matmuls "
    "off the tensor cores."
)
PCIE_FIX = (
    "Keep the step on the GPU: ops placed on the CPU (pinned with `tf.device`, or without "
    "a GPU kernel; `tf.debugging.set_log_device_placement(True)` lists them) move into the "
    "input pipeline or get a GPU op; NumPy conversions in a callback (`.numpy()`, "
    "`np.asarray(...)`, `float(tensor)` in `on_train_batch_end`) copy tensors back every "
    "batch: do them per epoch, or keep the values as tensors; `tf.py_function` in the "
    "model runs on the host: rewrite it with TF ops."
)

_MIB = 2**20


@dataclass(frozen=True)
class Counters:
    """One GPU's counters, means over a monitored window; NaN where not measured."""

    util_pct_mean: float = math.nan  # NVML (`nvidia-smi --query-gpu=utilization.gpu`)
    sm_active_pct_mean: float = math.nan  # GPM
    tensor_active_pct_mean: float = math.nan  # GPM tensor-pipe activity
    pcie_mib_s_mean: float = math.nan  # transmitted + received
    power_w_mean: float = math.nan
    power_limit_w_max: float = math.nan
    throttle_reasons_any: float = math.nan  # the bitwise OR of NVML's throttle-reason bitmasks
    sm_clock_mhz_mean: float = math.nan


@dataclass(frozen=True)
class CounterFinding:
    """What one rule found: text pieces that `diagnose` and the report put together."""

    kind: str  # "tensor_cores_idle", "small_kernels", "pcie_traffic" or "clocks_throttled"
    severity: str  # "high", "moderate" or "info"
    title: str  # one line
    measured: str  # what was measured (a clause, no final period)
    meaning: str  # what that means (a clause, no final period; may be empty)
    recommendation: str  # the generic fix (a sentence)

    def detail(self) -> str:
        """`measured: meaning.` as one sentence."""
        return self.measured + (f": {self.meaning}" if self.meaning else "") + "."


def tensor_cores_idle(c: Counters) -> CounterFinding | None:
    """Tensor-pipe activity near zero while the GPU is busy (the caller checks that the GPU
    has tensor cores; GPM, which measures it, needs Hopper or newer)."""
    tensor, util = c.tensor_active_pct_mean, c.util_pct_mean
    if not (is_finite_number(tensor) and is_finite_number(util)):
        return None
    if not (tensor < TENSOR_ACTIVE_LOW_PCT and util >= TENSOR_BUSY_UTIL_PCT):
        return None
    return CounterFinding(
        "tensor_cores_idle",
        "moderate",
        "Tensor cores nearly idle while the GPU is busy",
        f"Tensor-core activity {tensor:.1f}% (GPM) at {util:.0f}% utilization",
        "the matmuls and convolutions do not run on the tensor cores",
        TENSOR_IDLE_FIX,
    )


def small_kernels_fix(
    batch_size: int | None = None,
    steps_per_execution: int | None = None,
    suggested_steps_per_execution: int | None = None,
    jit_compile: bool | None = None,
    *,
    measured_no_gain: frozenset[str] = frozenset(),
) -> str:
    """The small-kernels fix, with what the caller knows of the model (None: unknown); the
    knobs in `measured_no_gain` (measured as no faster here) are never advised."""
    batch = f"now {batch_size}" if batch_size else "per replica"
    parts = [
        f"A larger `batch_size` ({batch}; `tfgpu.find_batch_size(model, data)` finds the "
        "largest that fits, and scale the learning rate with `tfgpu.scale_learning_rate`)"
    ]
    if "steps_per_execution" not in measured_no_gain:
        if suggested_steps_per_execution:
            now = f" (now {steps_per_execution})" if steps_per_execution else ""
            spe = f"`model.compile(..., steps_per_execution={suggested_steps_per_execution})`{now}"
        else:
            spe = "a larger `steps_per_execution` in `model.compile(...)`"
        parts.append(f"{spe} so kernels are queued back to back")
    if jit_compile:
        parts.append("XLA is already on (`jit_compile=True`): look for ops it cannot fuse")
    elif "jit_compile" not in measured_no_gain:
        parts.append(
            "`model.compile(..., jit_compile=True)`: XLA fuses small element-wise kernels into "
            "fewer, larger ones"
        )
    return "; ".join(parts) + "."


def small_kernels(c: Counters, fix: str | None = None) -> CounterFinding | None:
    """Utilization high while few SMs are active: kernels too small to fill the GPU."""
    util, sm = c.util_pct_mean, c.sm_active_pct_mean
    if not (is_finite_number(util) and is_finite_number(sm)):
        return None
    if not (util >= SMALL_KERNELS_UTIL_PCT and sm < SMALL_KERNELS_SM_ACTIVE_PCT):
        return None
    return CounterFinding(
        "small_kernels",
        "moderate",
        "Utilization high, SM activity low: kernels too small to fill the GPU",
        f"NVML utilization {util:.0f}% says a kernel was running that share of the time; GPM "
        f"says the SMs were active only {sm:.0f}% of it on average",
        "each kernel occupies a few SMs and leaves the rest idle",
        fix if fix is not None else small_kernels_fix(),
    )


def pcie_per_step_bytes(c: Counters, step_time_s: float) -> float:
    """PCIe bytes per step (the mean rate times the step time), NaN when either is unknown."""
    rate = c.pcie_mib_s_mean
    if is_finite_number(rate) and is_finite_number(step_time_s) and step_time_s > 0:
        return float(rate) * _MIB * float(step_time_s)
    return math.nan


def pcie_measured(c: Counters, step_time_s: float) -> str:
    """`"X MiB crossed PCIe per step (R MiB/s sent and received x T ms per step)"`."""
    per_step = pcie_per_step_bytes(c, step_time_s)
    return (
        f"{per_step / _MIB:,.1f} MiB crossed PCIe per step ({c.pcie_mib_s_mean:,.1f} MiB/s "
        f"sent and received x {step_time_s * 1e3:.2f} ms per step)"
    )


def pcie_traffic(c: Counters, step_time_s: float, batch_bytes: int | None) -> CounterFinding | None:
    """PCIe traffic per step above `PCIE_BATCH_FACTOR` times the batch's bytes (needs both)."""
    per_step = pcie_per_step_bytes(c, step_time_s)
    if not (math.isfinite(per_step) and batch_bytes and batch_bytes > 0):
        return None
    if per_step <= PCIE_BATCH_FACTOR * batch_bytes:
        return None
    return CounterFinding(
        "pcie_traffic",
        "moderate",
        "Host-device transfers inside the step: PCIe traffic far above the batch's size",
        f"{pcie_measured(c, step_time_s)}, {per_step / batch_bytes:.0f}x the batch's "
        f"{batch_bytes / _MIB:,.2f} MiB",
        "",
        PCIE_FIX,
    )


def pcie_unjudged(c: Counters, step_time_s: float) -> CounterFinding | None:
    """PCIe traffic per step, not judged: the batch's bytes are unknown (a timeline alone)."""
    if not math.isfinite(pcie_per_step_bytes(c, step_time_s)):
        return None
    return CounterFinding(
        "pcie_traffic",
        "info",
        "PCIe traffic per step (not judged: the batch's size in bytes is unknown here)",
        pcie_measured(c, step_time_s),
        f"more than {PCIE_BATCH_FACTOR:g}x the bytes of one batch (inputs, labels, weights) "
        "would mean tensors crossing between host and GPU inside the step",
        "`tfgpu.diagnose(model, data)` knows the batch's bytes and compares them; if the "
        "figure is far above a batch: " + PCIE_FIX[:1].lower() + PCIE_FIX[1:],
    )


def throttle_names(reasons: int) -> list[tuple[str, str]]:
    """The (name, fix) of each bit set in an NVML throttle-reason bitmask (idle left out)."""
    named = [THROTTLE_REASONS[bit] for bit in sorted(THROTTLE_REASONS) if reasons & bit]
    unknown = reasons & ~THROTTLE_IDLE & ~sum(THROTTLE_REASONS)
    if unknown:
        named.append(
            (f"reason bits {unknown:#x}", "see `nvidia-smi -q -d PERFORMANCE` for the reason")
        )
    return named


def clocks_throttled(c: Counters) -> CounterFinding | None:
    """Power far below the limit while NVML names a throttle reason other than idle."""
    power, limit, bits = c.power_w_mean, c.power_limit_w_max, c.throttle_reasons_any
    if not all(is_finite_number(v) for v in (power, limit, bits)) or limit <= 0 or bits < 0:
        return None
    reasons = int(bits) & ~THROTTLE_IDLE
    if not (power < POWER_LOW_SHARE * limit and reasons):
        return None
    named = throttle_names(reasons)
    names = ", ".join(name for name, _ in named)
    clock = ""
    if is_finite_number(c.sm_clock_mhz_mean):
        clock = f" at {c.sm_clock_mhz_mean:.0f} MHz SM clock (mean)"
    return CounterFinding(
        "clocks_throttled",
        "high" if reasons & THROTTLE_SEVERE else "moderate",
        "Clocks throttled: " + names,
        f"Power {power:.0f} W on average, {power / limit:.0%} of the {limit:.0f} W "
        f"limit{clock}, while NVML reported clock throttle reasons {reasons:#x} ({names})",
        "",
        "; ".join(f"{name}: {fix}" for name, fix in named) + ".",
    )


def unseen(c: Counters, *, with_util: bool = True) -> list[str]:
    """Notes on what the counters could not show (NaN); none without utilization. `with_util`:
    the GPM note quotes a high utilization (the report leaves it out for several GPUs)."""
    if not is_finite_number(c.util_pct_mean):
        return []
    notes = []
    if not (is_finite_number(c.sm_active_pct_mean) or is_finite_number(c.tensor_active_pct_mean)):
        high = (
            f" (utilization averaged {c.util_pct_mean:.0f}% here: a kernel was running, not "
            "necessarily on every SM)"
            if with_util and c.util_pct_mean >= SMALL_KERNELS_UTIL_PCT
            else ""
        )
        notes.append(GPM_UNSEEN + high)
    if not is_finite_number(c.pcie_mib_s_mean):
        notes.append(PCIE_UNSEEN)
    if not (is_finite_number(c.power_limit_w_max) and is_finite_number(c.throttle_reasons_any)):
        notes.append(POWER_UNSEEN)
    return notes
