"""The decision: bottleneck, input-bound level and findings from a `Facts`. Pure: no hardware.

Its texts are in `_advice`; the GPU-counter rules in `_internal.adapters.gpu_counters`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tfgpu._internal.adapters import gpu_counters as counters
from tfgpu._internal.adapters import timing as protocol
from tfgpu._internal.adapters.devices import peak_precision
from tfgpu._internal.helpers.checks import is_finite_number
from tfgpu.diagnosis._advice import (
    cpu_ops_traffic,
    finding,
    input_advice,
    loss_scale_finding,
    pcie_finding,
    tensor_idle_finding,
    unexplained_wait_finding,
)
from tfgpu.diagnosis._facts import (
    HOST_OVERHEAD_MIN_GAIN,
    INPUT_BOUND_HIGH,
    INPUT_BOUND_MODERATE,
    INPUT_WAIT_MIN_S,
    LOSS_SCALE_MAX_HALVINGS,
    MEMORY_HEADROOM_BELOW,
    PROBE_STEPS_PER_EXECUTION,
    SCALING_SHARE,
    WAIT_UNEXPLAINED_FACTOR,
    XLA_MIN_GAIN,
    Facts,
    OpFact,
)
from tfgpu.diagnosis._result import Finding
from tfgpu.diagnosis._rounds import input_level, share_verdict, wait_and_share


def classify(
    f: Facts, verdict: dict[str, Any] | None = None
) -> tuple[str, str, float, list[Finding]]:
    """Returns (bottleneck, input level, input wait share, findings) from the facts.

    `verdict` is `share_verdict(f.rounds)` where the caller has it already.
    """
    from tfgpu.flops import peak_flops
    from tfgpu.precision import choose_policy

    findings: list[Finding] = []
    if f.rounds:
        verdict = verdict or share_verdict(f.rounds)
        level, share, wait = verdict["level"], verdict["share"], verdict["wait_s"]
        wait_low = verdict["wait_low_s"]
    else:
        wait, share = wait_and_share(f.compute_step_time_s, f.step_time_s)
        wait_low = wait
        level = input_level(share, wait)
    spe_gain, spe_low, _ = protocol.gain(
        f.spe_rounds, f.spe_baseline_step_time_s or f.compute_step_time_s, f.spe_probe_step_time_s
    )
    spe_no_gain = spe_gain is not None and not spe_low >= HOST_OVERHEAD_MIN_GAIN
    xla_gain, xla_low, _ = protocol.gain(
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
        and input_level(most_input_can_cost / f.step_time_s) == "no"
    ):
        level = "no"
    if unexplained:
        level = "inconclusive"
        findings.append(unexplained_wait_finding(f, wait))
    elif level in ("high", "moderate"):
        gain = f.step_time_s / f.compute_step_time_s if f.compute_step_time_s > 0 else None
        findings.append(
            Finding(
                "input_bound",
                "high" if level == "high" else "moderate",
                f"Input-bound ({level}): {share:.0%} of each step waits for input",
                f"{f.step_time_s * 1e3:.2f} ms per step with the pipeline vs "
                f"{f.compute_step_time_s * 1e3:.2f} ms on a device-resident batch; the "
                f"pipeline alone takes {f.input_batch_time_s * 1e3:.2f} ms per batch"
                + (
                    f" and keeps {f.pipeline_cpu_busy:.0%} of {f.cpu_cores} CPU cores busy."
                    if math.isfinite(f.pipeline_cpu_busy) and f.cpu_cores
                    else "."
                ),
                input_advice(f, spe_no_gain),
                gain,
                True,
            )
        )

    spe_base, spe_probe = (
        protocol.medians(f.spe_rounds)
        if f.spe_rounds
        else (f.spe_baseline_step_time_s or f.compute_step_time_s, f.spe_probe_step_time_s or 0.0)
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
        traffic.append(cpu_ops_traffic(cpu_ops))
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
                now = peak_flops(
                    f.gpu_name,
                    peak_precision("float32", f.compute_capabilities, f.tf32_enabled) or "float32",
                )
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
        xla_base, xla_variant = (
            protocol.medians(f.xla_rounds)
            if f.xla_rounds
            else (
                f.xla_baseline_step_time_s or f.compute_step_time_s,
                f.xla_other_step_time_s or 0.0,
            )
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
            findings.append(loss_scale_finding(f.loss_scale_before, f.loss_scale_after))

    findings += _counter_findings(f, cpu_ops, spe_no_gain, xla_no_gain)

    # Keras under tf.distribute runs the all-reduce after the backward pass, not beside it.
    scaling_bound = (
        f.replicas > 1
        and f.all_reduce_s is not None
        and f.compute_step_time_s > 0
        and f.all_reduce_s >= SCALING_SHARE * f.compute_step_time_s
    )
    if scaling_bound and f.all_reduce_s is not None:
        findings.append(
            Finding(
                "scaling_bound",
                "high",
                f"Scaling-bound: the all-reduce of the gradients holds the step on "
                f"{f.replicas} replicas",
                f"{f.gradient_bytes / 2**20:,.1f} MiB of gradients take "
                f"{f.all_reduce_s * 1e3:.2f} ms of a {f.compute_step_time_s * 1e3:.2f} ms "
                "step (the all-reduce timed alone).",
                "`tfgpu.scaling(build_model, data)` times 1, 2, 4, ... replicas and names "
                "what to change; more compute per all-reduce (a larger per-replica batch) "
                "helps, and `tfgpu.tune` tries the other `all_reduce` implementations.",
                f.compute_step_time_s / max(1e-9, f.compute_step_time_s - f.all_reduce_s),
                False,
            )
        )

    # Tiny steps also wait on the per-step hand-over of each batch; when the pipeline alone
    # outpaces the step, that wait is dispatch cost too, and steps_per_execution removes it.
    pipeline_keeps_up = f.input_batch_time_s < f.compute_step_time_s
    if host_bound and (level != "high" or pipeline_keeps_up):
        bottleneck = "host_overhead"
    elif level in ("high", "moderate"):
        bottleneck = "input"
    elif scaling_bound:
        bottleneck = "scaling"
    elif level == "inconclusive":
        bottleneck = "inconclusive"
    else:
        bottleneck = "compute"
    order = {"high": 0, "moderate": 1, "info": 2}
    lead = {
        "input": "input_bound",
        "host_overhead": "host_overhead",
        "inconclusive": "input_wait_unexplained",
        "scaling": "scaling_bound",
    }.get(bottleneck)
    findings.sort(key=lambda x: (x.kind != lead, order[x.severity]))
    return bottleneck, level, share, findings


_COUNTERS = tuple(c.name for c in dataclasses.fields(counters.Counters))


def _counters(f: Facts) -> counters.Counters:
    """The GPU counters among the facts (`Facts` has every field of `Counters`)."""
    return counters.Counters(**{name: getattr(f, name) for name in _COUNTERS})


def _counter_findings(
    f: Facts,
    cpu_ops: list[tuple[OpFact, str]],
    spe_no_gain: bool = False,
    xla_no_gain: bool = False,
) -> list[Finding]:
    """What GPU utilization hides: the shared `gpu_counters` rules, with what only a diagnosis
    knows (the layers, the policy, TF32, the CPU ops, the batch's bytes). Pure."""
    if not f.on_gpu:
        return []
    c = _counters(f)
    findings = []
    tensor_gpu = bool(f.compute_capabilities) and all(
        tuple(cc) >= (7, 0) for cc in f.compute_capabilities
    )
    idle = counters.tensor_cores_idle(c) if tensor_gpu else None
    if idle is not None:
        findings.append(tensor_idle_finding(f, idle, xla_no_gain))
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
        findings.append(finding(small))
    pcie = counters.pcie_traffic(c, f.step_time_s, f.batch_bytes)
    if pcie is not None:
        findings.append(pcie_finding(f, pcie, cpu_ops))
    throttled = counters.clocks_throttled(c)
    if throttled is not None:
        findings.append(finding(throttled))
    return findings


def unseen(f: Facts) -> list[str]:
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


def monitor_facts(aggregate: dict[str, Any], gpu: int = 0) -> dict[str, float]:
    """The `Facts` GPU counters from `Sampler.aggregate()` keys `gpu{gpu}_*`; absent or
    non-finite: NaN. PCIe is transmitted + received (either alone where only one was). Pure."""

    def get(key: str) -> float:
        value = aggregate.get(f"gpu{gpu}_{key}") if isinstance(aggregate, dict) else None
        return float(value) if value is not None and is_finite_number(value) else math.nan

    tx, rx = get("pcie_tx_mib_s_mean"), get("pcie_rx_mib_s_mean")
    pcie = [v for v in (tx, rx) if math.isfinite(v)]
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
    f: Facts, verdict: dict[str, Any], level: str, share: float, findings: list[Finding]
) -> list[str]:
    """The notes on an input wait that was noisy, or too short to be the pipeline's. Pure."""
    notes = []
    if verdict["level"] != "no" and level == "no":  # the pipeline is too fast to be the cause
        measured = (
            f"between {verdict['low']:.0%} and {verdict['high']:.0%} of the step over "
            f"{verdict['rounds']} rounds (noisy)"
            if verdict["level"] == "inconclusive"
            else f"{verdict['wait_s'] * 1e3:.2f} ms per step ({share:.0%})"
        )
        notes.append(
            f"input wait {measured}, but the pipeline alone makes a batch in "
            f"{f.input_batch_time_s * 1e3:.2f} ms: even at half that speed it could not hold "
            f"back {INPUT_BOUND_MODERATE:.0%} of a {f.step_time_s * 1e3:.2f} ms step, so not "
            "input-bound"
        )
    elif (
        level == "inconclusive"
        and verdict["rounds"] >= protocol.MIN_ROUNDS  # fewer: the budget note says why
        and all(x.kind != "input_wait_unexplained" for x in findings)
    ):
        notes.append(
            f"input wait between {verdict['low']:.0%} and {verdict['high']:.0%} of the step "
            f"over {verdict['rounds']} rounds ({verdict['confidence']:.0%} confidence): too "
            f"noisy to call against the {INPUT_BOUND_MODERATE:.0%} and {INPUT_BOUND_HIGH:.0%} "
            "thresholds; rerun on a quieter machine or with a larger `time_budget_s`"
        )
    elif level == "no" and share >= INPUT_BOUND_MODERATE and verdict["wait_s"] < INPUT_WAIT_MIN_S:
        notes.append(
            f"input wait {verdict['wait_s'] * 1e3:.2f} ms per step ({share:.0%}) is below "
            f"{INPUT_WAIT_MIN_S * 1e3:g} ms: tf.data's per-batch hand-over, not the pipeline's "
            "work, so not called input-bound"
        )
    return notes
