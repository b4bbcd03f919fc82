"""The decision: the bottleneck, the input-bound level and the findings from a `DiagnoseFacts`, by a
table of small rules (`RULES`, as `env/_findings.CHECKS`). Pure. Thresholds shared with `tune`
are the core's (`rules`), the GPU-counter rules `gpu_counters`'; long texts are in `_advice`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from tfgpu._internal.adapters import gpu_counters as counters
from tfgpu._internal.adapters.devices import peak_precision
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import is_finite_number
from tfgpu._internal.measure import rules
from tfgpu.diagnosis import _advice as advice
from tfgpu.diagnosis._facts import (
    INPUT_BOUND_HIGH,
    INPUT_BOUND_MODERATE,
    INPUT_WAIT_MIN_S,
    LOSS_SCALE_MAX_HALVINGS,
    MEMORY_HEADROOM_BELOW,
    PROBE_STEPS_PER_EXECUTION,
    WAIT_UNEXPLAINED_FACTOR,
    DiagnoseFacts,
    OpFact,
)
from tfgpu.diagnosis._result import Finding
from tfgpu.flops import peak_flops
from tfgpu.precision import choose_policy


def wait_and_share(compute_s: float, real_s: float) -> tuple[float, float]:
    """(seconds per step waiting for input, their share of the step) of one pair of steps."""
    wait = max(0.0, real_s - compute_s)
    return wait, (wait / real_s if real_s > 0 else 0.0)


def share_verdict(rounds: list[tuple[float, float]]) -> dict[str, Any]:
    """The input-bound level the rounds (device-resident, real) support, decided at both ends
    of the median's confidence interval of the share and of the wait (`"inconclusive"` when
    they differ, or below `MIN_ROUNDS` rounds), with the medians and the share's interval."""
    waits = [wait_and_share(c, r)[0] for c, r in rounds]
    shares = [wait_and_share(c, r)[1] for c, r in rounds]
    low, high, confidence = rules.median_interval(shares)
    wait_low, wait_high, _ = rules.median_interval(waits)
    at_low, at_high = input_level(low, wait_low), input_level(high, wait_high)
    settled = at_low == at_high and len(rounds) >= rules.MIN_ROUNDS
    return {
        "level": at_low if settled else "inconclusive",
        "share": stats.median(shares),
        "wait_s": stats.median(waits),
        "wait_low_s": wait_low,
        "low": low,
        "high": high,
        "confidence": confidence,
        "rounds": len(rounds),
    }


def input_level(share: float, wait_s: float = math.inf) -> str:
    """`"high"`, `"moderate"` or `"no"` from the wait's share of the step and its length."""
    if wait_s < INPUT_WAIT_MIN_S:
        return "no"
    if share >= INPUT_BOUND_HIGH:
        return "high"
    if share >= INPUT_BOUND_MODERATE:
        return "moderate"
    return "no"


@dataclasses.dataclass(frozen=True)
class Seen:
    """What the rules read beyond the facts, worked out once: the input level (checked against
    what the pipeline can explain), the probes' gains, the CPU ops, the all-reduce, the GPU."""

    level: str
    share: float
    wait_s: float
    unexplained: bool
    spe: rules.Gain | None
    xla: rules.Gain | None
    cpu_ops: list[tuple[OpFact, str]]
    scaling_bound: bool
    gpu: counters.Counters | None


def _helps(gain: rules.Gain | None) -> bool:
    """Whether a probe helps: the low end of its gain's interval clears the margin."""
    return gain is not None and gain.low >= rules.MARGIN


def _no_gain(gain: rules.Gain | None) -> bool:
    """Whether a probe was measured and does not help (its knob is then advised nowhere)."""
    return gain is not None and gain.low < rules.MARGIN


def seen(f: DiagnoseFacts, verdict: dict[str, Any] | None = None) -> Seen:
    """The input level, checked against what the pipeline alone can cost, and the probes."""
    if f.rounds:
        verdict = verdict or share_verdict(f.rounds)
        level, share, wait = verdict["level"], verdict["share"], verdict["wait_s"]
        wait_low = verdict["wait_low_s"]
    else:
        wait, share = wait_and_share(f.compute_step_time_s, f.step_time_s)
        level, wait_low = input_level(share, wait), wait
    # A finding must agree with the figures it prints. The most the pipeline can add to a
    # step is about its own time per batch (measured far more steadily than a difference of
    # two step times): a wait above that in every round is not the pipeline's doing...
    most = WAIT_UNEXPLAINED_FACTOR * f.input_time_s + INPUT_WAIT_MIN_S
    unexplained = level != "no" and wait_low > most
    # ...and a wait within it is the input's only if that most is itself a moderate share.
    if unexplained:
        level = "inconclusive"
    elif level != "no" and f.step_time_s > 0 and input_level(most / f.step_time_s) == "no":
        level = "no"
    cpu_ops = _cpu_placed_ops(f.train_step_ops) if f.on_gpu and not f.jit_compile else []
    spe, xla = rules.Gain.of(f.spe_rounds), rules.Gain.of(f.xla_rounds)
    # Keras under tf.distribute runs the all-reduce after the backward pass, not beside it.
    reduce_s, step_s = (f.all_reduce_s if f.replicas > 1 else None), f.compute_step_time_s
    scaling = reduce_s is not None and step_s > 0 and reduce_s >= rules.ALL_REDUCE_SHARE * step_s
    gpu = _counters(f) if f.on_gpu else None
    return Seen(level, share, wait, unexplained, spe, xla, cpu_ops, scaling, gpu)


def _input_bound(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if s.unexplained:
        return advice.unexplained_wait_finding(f, s.wait_s)
    if s.level not in ("high", "moderate"):
        return None
    busy = (
        f" and keeps {f.pipeline_cpu_busy:.0%} of {f.cpu_cores} CPU cores busy."
        if math.isfinite(f.pipeline_cpu_busy) and f.cpu_cores
        else "."
    )
    return Finding(
        kind="input_bound",
        severity=s.level,
        title=f"Input-bound ({s.level}): {s.share:.0%} of each step waits for input",
        detail=f"{f.step_time_s * 1e3:.2f} ms per step with the pipeline vs "
        f"{f.compute_step_time_s * 1e3:.2f} ms on a device-resident batch; the pipeline "
        f"alone takes {f.input_time_s * 1e3:.2f} ms per batch{busy}",
        recommendation=advice.input_advice(f, _no_gain(s.spe)),
        expected_gain=(
            f.step_time_s / f.compute_step_time_s if f.compute_step_time_s > 0 else None
        ),
        gain_measured=True,
    )


def _host_overhead(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not _helps(s.spe) or s.spe is None:
        return None
    base, probe = rules.medians(f.spe_rounds)
    rec = (
        f"`model.compile(..., steps_per_execution={PROBE_STEPS_PER_EXECUTION})` (or more) "
        "runs that many steps per call, so Python and dispatch cost is paid once."
    )
    if f.on_gpu:
        rec += (
            " On GPUs also set the environment variable `TF_GPU_THREAD_MODE=gpu_private` "
            "before TensorFlow starts (dedicated threads launch the kernels)."
        )
    return Finding(
        kind="host_overhead",
        severity="high",
        title="Host-overhead-bound: steps are so short that dispatching them dominates",
        detail=f"{base * 1e3:.2f} ms per step with steps_per_execution="
        f"{f.steps_per_execution}, {probe * 1e3:.2f} ms with "
        f"steps_per_execution={PROBE_STEPS_PER_EXECUTION}.",
        recommendation=rec,
        expected_gain=s.spe.value,
        gain_measured=True,
    )


def _host_device_traffic(f: DiagnoseFacts, s: Seen) -> Finding | None:
    device_hint = " or `tf.data.experimental.prefetch_to_device('/gpu:0')`" if f.on_gpu else ""
    seen_and_fixed = (  # (whether it is seen, what was seen, the fix)
        (f.from_arrays, "the data is fed as NumPy arrays, copied from host memory batch by batch",
         "`tfgpu.data.pipeline((x, y), batch_size=...)` (cached, prefetched tf.data)"),
        (f.python_input, "the pipeline runs Python every step (`tf.py_function` / a generator), "
         "which holds the GIL and cannot run in parallel",
         "rewrite that step with TF ops, or `cache()` after it"),
        (not f.prefetch, "batches are not prefetched",
         f"end the pipeline with `.prefetch(tf.data.AUTOTUNE)`{device_hint}"),
    )  # fmt: skip
    traffic = [(what, fix) for found, what, fix in seen_and_fixed if found]
    title = "Host-side input work every step"
    if s.cpu_ops:
        traffic.append(advice.cpu_ops_traffic(s.cpu_ops))
        both = " and host-side input work" if len(traffic) > 1 else ""
        title = "Train-step ops placed on the CPU" + both
    if not traffic:
        return None
    return Finding(
        kind="host_device_traffic",
        severity="moderate" if s.level != "no" or s.cpu_ops else "info",
        title=title,
        detail="; ".join(seen for seen, _ in traffic) + ".",
        recommendation="; ".join(fix for _, fix in traffic) + ".",
    )


def _memory_headroom(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not (f.on_gpu and f.peak_memory_bytes and f.memory_capacity_bytes):
        return None
    used = f.peak_memory_bytes / f.memory_capacity_bytes
    if used >= MEMORY_HEADROOM_BELOW:
        return None
    room = 0.9 * f.memory_capacity_bytes / f.peak_memory_bytes
    return Finding(
        kind="memory_headroom",
        severity="info",
        title=f"Memory headroom: the step peaks at {used:.0%} of device memory",
        detail=f"Peak {f.peak_memory_bytes / 2**30:.2f} GiB of "
        f"{f.memory_capacity_bytes / 2**30:.1f} GiB: the batch could grow about {room:.1f}x.",
        recommendation=f"A larger `batch_size` (now {f.batch_size}); "
        "`tfgpu.find_batch_size(model, data)` finds the largest and the fastest. Scale the "
        "learning rate with `tfgpu.scale_learning_rate`.",
    )


def _precision(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not (f.on_gpu and f.compute_capabilities and f.policy == "float32"):
        return None
    ccs = list(f.compute_capabilities)
    choice = choose_policy(ccs)
    if choice.policy == "float32":
        return None
    gain = None
    if f.gpu_name:
        now = peak_flops(f.gpu_name, peak_precision("float32", ccs, f.tf32_enabled) or "float32")
        mixed = peak_flops(f.gpu_name, choice.policy)
        gain = mixed / now if now and mixed else None
    return Finding(
        kind="precision",
        severity="moderate",
        title="float32 on a tensor-core GPU",
        detail=f"The policy is float32; {choice.reason}.",
        recommendation=f'`tfgpu.configure(precision="{choice.policy}")` before building the '
        f'model (or `keras.mixed_precision.set_global_policy("{choice.policy}")`).',
        expected_gain=gain,
    )


def _xla(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not _helps(s.xla) or s.xla is None:
        return None
    base, variant = rules.medians(f.xla_rounds)
    other = not f.jit_compile
    return Finding(
        kind="xla",
        severity="moderate",
        title=f"XLA {'on' if other else 'off'} is faster for this model",
        detail=f"{base * 1e3:.2f} ms per step with jit_compile={f.jit_compile}, "
        f"{variant * 1e3:.2f} ms with jit_compile={other}.",
        recommendation=f"`model.compile(..., jit_compile={other})`.",
        expected_gain=s.xla.value,
        gain_measured=True,
    )


def _loss_scale(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not f.loss_scale_before or f.loss_scale_after is None:
        return None
    halvings = math.log2(f.loss_scale_before / max(f.loss_scale_after, 1e-30))
    if halvings >= LOSS_SCALE_MAX_HALVINGS or f.loss_scale_after < 1:
        return advice.loss_scale_finding(f.loss_scale_before, f.loss_scale_after)
    return None


def _tensor_cores_idle(f: DiagnoseFacts, s: Seen) -> Finding | None:
    ccs = f.compute_capabilities
    tensor_gpu = bool(ccs) and all(tuple(cc) >= (7, 0) for cc in ccs)
    idle = counters.tensor_cores_idle(s.gpu) if s.gpu and tensor_gpu else None
    return None if idle is None else advice.tensor_idle_finding(f, idle, _no_gain(s.xla))


def _small_kernels(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if s.gpu is None:
        return None
    probes = {"steps_per_execution": s.spe, "jit_compile": s.xla}
    no_gain = frozenset(knob for knob, gain in probes.items() if _no_gain(gain))
    more = max(PROBE_STEPS_PER_EXECUTION, 4 * f.steps_per_execution)
    fix = counters.small_kernels_fix(
        f.batch_size, f.steps_per_execution, more, f.jit_compile, measured_no_gain=no_gain
    )
    small = counters.small_kernels(s.gpu, fix)
    return None if small is None else advice.finding(small)


def _pcie_traffic(f: DiagnoseFacts, s: Seen) -> Finding | None:
    pcie = counters.pcie_traffic(s.gpu, f.step_time_s, f.batch_bytes) if s.gpu else None
    return None if pcie is None else advice.pcie_finding(f, pcie, s.cpu_ops)


def _clocks_throttled(f: DiagnoseFacts, s: Seen) -> Finding | None:
    throttled = counters.clocks_throttled(s.gpu) if s.gpu else None
    return None if throttled is None else advice.finding(throttled)


def _scaling_bound(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not s.scaling_bound or f.all_reduce_s is None:
        return None
    return Finding(
        kind="scaling_bound",
        severity="high",
        title="Scaling-bound: the all-reduce of the gradients holds the step on "
        f"{f.replicas} replicas",
        detail=f"{f.gradient_bytes / 2**20:,.1f} MiB of gradients take "
        f"{f.all_reduce_s * 1e3:.2f} ms of a {f.compute_step_time_s * 1e3:.2f} ms step (the "
        "all-reduce timed alone).",
        recommendation="`tfgpu.scaling(build_model, data)` times 1, 2, 4, ... replicas and "
        "names what to change; more compute per all-reduce (a larger per-replica batch) "
        "helps, and `tfgpu.tune` tries the other `all_reduce` implementations.",
        expected_gain=f.compute_step_time_s / max(1e-9, f.compute_step_time_s - f.all_reduce_s),
    )


# The rules, each a function of the facts and what was seen beyond them to the finding it
# makes (or None). What GPU utilization hides: the shared `gpu_counters` rules, with what
# only a diagnosis knows (the layers, the policy, TF32, the CPU ops, the batch's bytes).
def _one_replica_strategy(f: DiagnoseFacts, s: Seen) -> Finding | None:
    if not f.one_replica_strategy or len(f.compute_capabilities) > 1:
        return None
    return Finding(
        kind="one_replica_strategy",
        severity="moderate",
        title=f"A {f.one_replica_strategy} of one replica: its distribution is only overhead",
        detail=f"The model was built under a {f.one_replica_strategy}, which this machine gives "
        "one replica: every step and batch still go through its distribution (the dataset "
        "distributed, the step run per replica, the gradients reduced) with nothing to "
        "share.",
        recommendation="`strategy = tfgpu.strategy()` in its place (the default strategy on a "
        "CPU, `OneDeviceStrategy` on one GPU; `MirroredStrategy` where there are several), "
        "then build the model in its scope; `tfgpu.tune` measures the gain on your model.",
    )


RULES: tuple[Callable[[DiagnoseFacts, Seen], Finding | None], ...] = (
    _input_bound, _host_overhead, _host_device_traffic, _memory_headroom, _precision, _xla,
    _loss_scale, _tensor_cores_idle, _small_kernels, _pcie_traffic, _clocks_throttled,
    _scaling_bound, _one_replica_strategy,
)  # fmt: skip

# The finding that leads for each bottleneck.
_LEAD = {"input": "input_bound", "host_overhead": "host_overhead",
         "inconclusive": "input_wait_unexplained", "scaling": "scaling_bound"}  # fmt: skip
_ORDER = {"high": 0, "moderate": 1, "info": 2}


def bottleneck(f: DiagnoseFacts, s: Seen) -> str:
    """The bottleneck: host overhead where `steps_per_execution` helps (tiny steps also wait
    on the per-step hand-over of each batch: when the pipeline alone outpaces the step, that
    wait is dispatch cost too), else the input, the all-reduce, noise, or the device."""
    if _helps(s.spe) and (s.level != "high" or f.input_time_s < f.compute_step_time_s):
        return "host_overhead"
    if s.level in ("high", "moderate"):
        return "input"
    if s.scaling_bound:
        return "scaling"
    return "inconclusive" if s.level == "inconclusive" else "compute"


def classify(
    f: DiagnoseFacts, verdict: dict[str, Any] | None = None
) -> tuple[str, str, float, list[Finding]]:
    """(the bottleneck, the input-bound level, the input wait's share of the step, the
    findings, most important first) from the facts, by `RULES`. `verdict` is
    `share_verdict(f.rounds)` where the caller has it already."""
    s = seen(f, verdict)
    findings = [finding for finding in (rule(f, s) for rule in RULES) if finding is not None]
    name = bottleneck(f, s)
    lead = _LEAD.get(name)
    findings.sort(key=lambda x: (x.kind != lead, _ORDER[x.severity]))
    return name, s.level, s.share, findings


_COUNTERS = tuple(c.name for c in dataclasses.fields(counters.Counters))


def _counters(f: DiagnoseFacts) -> counters.Counters:
    """The GPU counters among the facts (`DiagnoseFacts` has every field of `Counters`)."""
    return counters.Counters(**{name: getattr(f, name) for name in _COUNTERS})


def unseen(f: DiagnoseFacts) -> list[str]:
    """Notes on what the GPU counters could not show (NaN where the monitor ran). Pure."""
    if not f.on_gpu:
        return []  # no GPU: its own note says so
    notes = counters.unseen(_counters(f))
    measured = is_finite_number(f.util_pct_mean) and is_finite_number(f.pcie_mib_s_mean)
    if measured and not f.batch_bytes:
        at = len(notes) - (counters.POWER_UNSEEN in notes)  # before the power note, if any
        notes.insert(at, "PCIe traffic per step not compared: the batch's size in bytes is unknown")
    return notes


def monitor_facts(aggregate: dict[str, Any]) -> dict[str, float]:
    """The `DiagnoseFacts` GPU counters from `Sampler.aggregate()`'s `gpu0_*` (`/GPU:0`), NaN where
    absent; PCIe is transmitted + received (either alone where only one was). Pure."""

    def get(key: str) -> float:
        value = aggregate.get(f"gpu0_{key}") if isinstance(aggregate, dict) else None
        return float(value) if value is not None and is_finite_number(value) else math.nan

    pcie = [v for v in (get("pcie_tx_mib_s_mean"), get("pcie_rx_mib_s_mean")) if math.isfinite(v)]
    facts = {name: get(name) for name in (*_COUNTERS, "energy_j")}
    facts["pcie_mib_s_mean"] = sum(pcie) if pcie else math.nan
    return facts


_PY_FUNC_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})

# Graph plumbing: never a cost (constants, arguments, control).
_PLUMBING_OPS = frozenset({"Const", "Placeholder", "_Arg", "_Retval", "NoOp", "HostConst"})


def _cpu_placed_ops(ops: list[OpFact]) -> list[tuple[OpFact, str]]:
    """The train-step ops that run on the CPU of a GPU host, each with why: pinned there, a
    `tf.py_function`, or no GPU kernel for its dtypes (soft placement). Pure."""
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


def wait_notes(
    f: DiagnoseFacts, verdict: dict[str, Any], level: str, share: float, findings: list[Finding]
) -> list[str]:
    """The notes on an input wait that was noisy, or too short to be the pipeline's. Pure."""
    if verdict["level"] != "no" and level == "no":  # the pipeline is too fast to be the cause
        measured = (
            f"between {verdict['low']:.0%} and {verdict['high']:.0%} of the step over "
            f"{verdict['rounds']} rounds (noisy)"
            if verdict["level"] == "inconclusive"
            else f"{verdict['wait_s'] * 1e3:.2f} ms per step ({share:.0%})"
        )
        return [
            f"input wait {measured}, but the pipeline alone makes a batch in "
            f"{f.input_time_s * 1e3:.2f} ms: even at half that speed it could not hold back "
            f"{INPUT_BOUND_MODERATE:.0%} of a {f.step_time_s * 1e3:.2f} ms step, so not "
            "input-bound"
        ]
    if (
        level == "inconclusive"
        and verdict["rounds"] >= rules.MIN_ROUNDS  # fewer: the budget note says why
        and all(x.kind != "input_wait_unexplained" for x in findings)
    ):
        return [
            f"input wait between {verdict['low']:.0%} and {verdict['high']:.0%} of the step "
            f"over {verdict['rounds']} rounds ({verdict['confidence']:.0%} confidence): too "
            f"noisy to call against the {INPUT_BOUND_MODERATE:.0%} and {INPUT_BOUND_HIGH:.0%} "
            "thresholds; rerun on a quieter machine or with a larger `time_budget_s`"
        ]
    if level == "no" and share >= INPUT_BOUND_MODERATE and verdict["wait_s"] < INPUT_WAIT_MIN_S:
        return [
            f"input wait {verdict['wait_s'] * 1e3:.2f} ms per step ({share:.0%}) is below "
            f"{INPUT_WAIT_MIN_S * 1e3:g} ms: tf.data's per-batch hand-over, not the pipeline's "
            "work, so not called input-bound"
        ]
    return []
