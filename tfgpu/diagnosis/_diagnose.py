"""`tfgpu.diagnose()`: check the arguments, read what needs no training, measure under
`preserved(model)`, classify, write `diagnosis.json`."""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters import datasets, devices, replicas
from tfgpu._internal.adapters import timing as protocol
from tfgpu._internal.adapters.datasets import has_step, made_by_pipeline, read_first
from tfgpu._internal.adapters.model_state import preserved, supports_xla
from tfgpu._internal.adapters.workload import check_model_and_data
from tfgpu._internal.helpers.checks import check_bool, check_int, check_time_budget
from tfgpu._internal.helpers.files import rotate, writable_dir, write_text_atomic
from tfgpu._internal.helpers.progress import Progress, check_verbose
from tfgpu.diagnosis._advice import advise_service
from tfgpu.diagnosis._classify import classify, monitor_facts, unseen, wait_notes
from tfgpu.diagnosis._facts import (
    DEFAULT_TIME_BUDGET_S,
    FIT_SHARE,
    HOST_OVERHEAD_MIN_GAIN,
    HOST_OVERHEAD_PROBE_BELOW_S,
    MEASURE_SHARE,
    PROBE_STEPS_PER_EXECUTION,
    XLA_MIN_GAIN,
    Facts,
    OpFact,
)
from tfgpu.diagnosis._graph import PipelineFacts, batch_nbytes, read_pipeline, shape_facts, step_ops
from tfgpu.diagnosis._lint import lint_mixed_precision, loss_scale, policy_name, precision_layers
from tfgpu.diagnosis._probes import (
    Probe,
    device_dataset,
    fit_plan,
    host_load,
    measure_rounds,
    monitoring,
    noted,
    run_probe,
)
from tfgpu.diagnosis._result import Diagnosis
from tfgpu.diagnosis._rounds import share_verdict


def gpu_facts(notes: list[str]) -> tuple[str | None, list[tuple[int, int]], int | None]:
    """(name, compute capabilities, memory bytes) of the GPUs TensorFlow uses, /GPU:0 first."""
    if not tf.config.get_visible_devices("GPU"):
        return None, [], None
    gpus = devices.tf_gpus()
    ccs: list[tuple[int, int]] = []
    seen: set[int] = set()
    for g in gpus:  # one capability per physical GPU (a split GPU counts once)
        if g.cuda_index not in seen and g.compute_capability:
            seen.add(g.cuda_index)
            ccs.append(tuple(g.compute_capability))  # type: ignore[arg-type]
    first = gpus[0] if gpus else None
    name = None if first is None else first.name
    capacity = None if first is None else first.memory_total_bytes
    if first is not None and first.nvml is None:
        try:
            from tfgpu.monitor.nvml import inventory

            inv = inventory()
            if inv.error:
                notes.append(f"NVML unavailable ({inv.error}): no memory capacity, no monitor")
        except ImportError as e:  # `inventory` never raises; tfgpu.monitor may not import
            notes.append(f"NVML query failed: {e}")
    return name, ccs, capacity


def full_batch(ds, first, size: int | None, expected: int | None, most: int = 4):
    """(a batch of `expected` examples, its size): `first` when it is full, else the first
    full one among the first `most` batches (a shuffle after `batch()` can put the partial
    last batch first), else the largest of them."""
    if size is None or not expected or size >= expected:
        return first, size
    for batch in read_first(ds.skip(1), most - 1):
        n = tf.nest.flatten(batch)[0].shape[0]
        if n is not None and n > size:
            first, size = batch, int(n)
            if size >= expected:
                break
    return first, size


def flop_facts(model, x, size, real, policy, gpu_name, ccs, on_gpu, replicas=1):
    """(FLOPs per step, achieved FLOP/s, MFU, notes), counted with the batch's own shapes; a
    count above the devices' peak is not reported as achieved.

    The FLOPs are the global batch's: on GPUs the peak is one GPU's times the replicas; logical
    CPU devices share the machine's cores, so the CPU's peak is the machine's.
    """
    from tfgpu.flops import mfu, peak_flops, train_step_flops

    notes: list[str] = []
    if not size:
        return None, None, None, notes
    failure: list[str] = []
    with noted(failure, "{error}"):  # FLOP counting is a side feature
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), x)
        if isinstance(signature, (list, tuple)) and len(signature) == 1:
            signature = signature[0]
        flops = train_step_flops(model, size, input_signature=signature)
    if failure:
        # Its message may advise arguments of `train_step_flops`; diagnose takes none of them.
        text = ". ".join(p for p in failure[0].split(". ") if "input_signature" not in p)
        notes.append(f"FLOPs not counted: {text.rstrip('.')}")
        return None, None, None, notes
    if not flops or not real or real <= 0:
        return flops or None, None, None, notes
    achieved = flops / real
    peak = None
    try:
        if on_gpu:
            precision = devices.peak_precision(policy, ccs)
            one = peak_flops(gpu_name, precision) if gpu_name and precision else None
            peak = None if one is None else one * max(1, replicas)
        else:
            from tfgpu._internal.adapters import cpu

            peak = cpu.peak_flops(policy)
    except (TypeError, ValueError):  # a policy with no peak rate (e.g. "float64")
        peak = None
    if peak and achieved > peak:
        notes.append(
            f"FLOP count cannot be right: {achieved / 1e9:,.1f} GFLOP/s counted exceeds this "
            f"device's peak of about {peak / 1e9:,.1f} GFLOP/s (not reported as achieved)"
        )
        return flops, None, None, notes
    mfu_value = mfu(flops, real, peak) if on_gpu and peak else None
    return flops, achieved, mfu_value, notes


def diagnose(
    model: keras.Model,
    data: tf.data.Dataset | tuple[Any, ...] | list[Any] | dict[str, Any] | np.ndarray,
    *,
    steps: int = 20,
    warmup: int = 3,
    batch_size: int | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    check_xla: bool = True,
    check_steps_per_execution: bool = True,
    monitor: bool = True,
    profile: bool = False,
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S,
    verbose: int | str = "auto",
) -> Diagnosis:
    """Measures a short training run and says what holds the GPU back, and what to change.

    Times the input pipeline alone, `fit` on one batch held in device memory and `fit` on
    the real `data` (sampled by `tfgpu.monitor` on a GPU), alternated in rounds until the
    input-wait share is clear of noise; then probes `steps_per_execution=16` and
    `jit_compile` (`jit_compile=False` first, before the rounds, when the model has it on),
    all within `time_budget_s`. The model's weights, optimizer state,
    metrics, compile settings and `history` are restored afterwards. The protocol, the
    findings and their thresholds: docs/diagnosis.md.

    Args:
        model: keras.Model, compiled.
        data: `tf.data.Dataset` of batches (what you pass to `fit`), or arrays `(x, y)` /
            `(x, y, sample_weight)` (NumPy arrays or tensors, or dicts of them).
        steps: int, timed steps per measurement (>= 3). Defaults to 20.
        warmup: int, untimed steps first (tracing, buffers). Defaults to 3.
        batch_size: int or None, the batch for array input. Defaults to None (32).
        log_dir: str, os.PathLike or None, a run directory for `diagnosis.json` (an
            earlier one kept as `diagnosis.1.json`) and the trace. Defaults to None.
        check_xla: bool, measure `jit_compile` both ways. Defaults to True.
        check_steps_per_execution: bool, probe `steps_per_execution=16`. Defaults to True.
        monitor: bool, sample GPU utilization/memory during the real run. Defaults to True.
        profile: bool, capture a TensorBoard profiler trace into `log_dir/profile`.
            Defaults to False.
        time_budget_s: float or None, seconds the measurements may take; long steps are
            timed over fewer steps, probes that do not fit are skipped with a note; None: no
            limit. Defaults to 60.0.
        verbose: str or int, "auto", 0, 1 or 2: progress lines, as `model.fit` shows them.
            Defaults to "auto".

    Returns:
        A `Diagnosis`.

    Raises:
        ValueError: on invalid arguments, an uncompiled model, arrays of different
            lengths, data without labels for the model's loss, a dataset of single examples,
            or an empty dataset; before any measurement.
        TypeError: if `model` is not a Keras model, `data` is neither a dataset nor
            arrays, a flag is not a bool, or `verbose` is neither a str nor an int.

    Example:

    >>> diagnosis = tfgpu.diagnose(model, train, log_dir="runs/exp1")
    >>> print(diagnosis)           # bottleneck, findings, the knob to turn
    >>> diagnosis.bottleneck
    'input'
    """
    # 1. Check the arguments, before any work.
    check_verbose(verbose)
    check_int("steps", steps, minimum=3)
    check_int("warmup", warmup, minimum=1)
    log_path = None if log_dir is None else writable_dir(log_dir)  # before any work
    if profile and log_path is None:
        raise ValueError(
            "Invalid value for argument `profile`. Received: profile=True with log_dir=None. "
            "Expected a `log_dir` to write the trace into."
        )
    for flag, given in (
        ("check_xla", check_xla),
        ("check_steps_per_execution", check_steps_per_execution),
        ("monitor", monitor),
        ("profile", profile),
    ):
        check_bool(flag, given)
    time_budget_s = check_time_budget(time_budget_s)
    work = check_model_and_data(model, data, batch_size=batch_size)
    budget = protocol.Budget(time_budget_s, MEASURE_SHARE)
    # Read `protocol.now` at call time: the tests script it.
    progress = Progress(
        verbose, title="diagnose", budget_s=time_budget_s, clock=lambda: protocol.now()
    )
    ds = work.dataset
    batch, size = full_batch(ds, *work.first_batch(), work.batch_size)
    if log_path is not None:
        log_path.mkdir(parents=True, exist_ok=True)

    # 2. Read what needs no training: the GPU, the pipeline's graph, the pipeline alone.
    notes: list[str] = []
    gpu_name, ccs, capacity = gpu_facts(notes)
    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    pipeline_facts = read_pipeline(ds) or PipelineFacts()
    dynamic_shape, partial, epoch_examples = shape_facts(ds)

    from tfgpu.data import benchmark

    progress.phase("timing the input pipeline alone")
    pipeline = benchmark(ds, steps=steps, warmup=warmup, timeout_s=datasets.READ_TIMEOUT_S)
    measurements: dict[str, Any] = {"pipeline": pipeline.to_dict()}
    spe, jit_compile = int(model.steps_per_execution), bool(model.jit_compile)

    # 3. Measure, with the model's state put back afterwards.
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    with preserved(model, x):
        m = _measure_model(
            model,
            ds,
            batch,
            on_gpu=on_gpu,
            steps=steps,
            warmup=warmup,
            budget=budget,
            check_xla=check_xla,
            check_steps_per_execution=check_steps_per_execution,
            monitor=monitor,
            profile_dir=str(log_path / "profile") if profile and log_path is not None else None,
            measurements=measurements,
            notes=notes,
            progress=progress,
        )
        progress.phase("restoring the model's weights, optimizer and settings")
    compute, real = protocol.medians(m.rounds)

    # 4. Classify.
    f = Facts(
        step_time_s=real,
        compute_step_time_s=compute,
        input_batch_time_s=1.0 / pipeline.batches_per_s,
        batch_size=size,
        steps_per_execution=spe,
        jit_compile=jit_compile,
        rounds=m.rounds,
        spe_rounds=m.spe_rounds,
        xla_rounds=m.xla_rounds,
        made_by_pipeline=made_by_pipeline(data),
        dynamic_shape=dynamic_shape,
        partial_batches=partial,
        epoch_examples=epoch_examples,
        replicas=int(model.distribute_strategy.num_replicas_in_sync),
        host_load=host_load(),
        pipeline_cpu_busy=pipeline.cpu_busy,
        cpu_cores=pipeline.cpu_cores,
        service=has_step(ds, "dataservice"),
        on_gpu=on_gpu,
        gpu_name=gpu_name,
        compute_capabilities=ccs,
        policy=policy_name(model),
        peak_memory_bytes=measurements.get("peak_memory_bytes"),
        memory_capacity_bytes=capacity,
        numpy_input=work.from_arrays,
        train_step_ops=m.train_step_ops,
        loss_scale_before=m.loss_scale_before,
        loss_scale_after=m.loss_scale_after,
        batch_bytes=batch_nbytes(batch),
        **asdict(pipeline_facts),  # the pipeline's graph: its fields are facts of that name
    )
    for name, value in monitor_facts(m.monitor).items():
        setattr(f, name, value)
    if f.replicas > 1 and budget.left() > 0:
        progress.phase("timing the all-reduce of the gradients alone")
        with noted(notes, "the all-reduce was not timed alone: {error}"):
            f.all_reduce_s = replicas.all_reduce_s(model.distribute_strategy, model, tiny=False)
            f.gradient_bytes = replicas.gradient_bytes(model)
    elif f.replicas > 1:
        notes.append(
            f"the all-reduce was not timed alone: the time budget of {budget.seconds:g} s was "
            "spent (pass a larger `time_budget_s`, or None for no limit)"
        )
    if on_gpu:
        with noted(notes, "tensor-core facts not read: {error}"):
            f.tf32_enabled = devices.tf32_execution_enabled()
            f.float32_layers, f.odd_dim_layers = precision_layers(model)
    verdict = share_verdict(m.rounds)
    bottleneck, level, share, findings = classify(f, verdict)
    service = advise_service(f) if level in ("high", "moderate") else None
    if service is not None:  # the finding says it in words; this is for programs
        measurements["data_service"] = {"workers": service.workers, "cores": service.cores}
    notes += unseen(f)
    notes += wait_notes(f, verdict, level, share, findings)
    measurements["noise"] = None
    noise = None
    if verdict["rounds"] >= protocol.MIN_ROUNDS:  # fewer rounds cannot tell the noise
        noise = verdict["high"] - verdict["low"]
        measurements["noise"] = {k: verdict[k] for k in ("low", "high", "confidence", "rounds")}
    findings += lint_mixed_precision(model, ccs)
    flops = achieved = mfu_value = None
    if budget.seconds is not None and budget.elapsed() >= budget.seconds:
        notes.append(f"FLOPs not counted: the time budget of {budget.seconds:g} s was spent")
    else:
        progress.phase("counting the FLOPs of a training step")
        flops, achieved, mfu_value, flop_notes = flop_facts(
            model, x, size, real, f.policy, gpu_name, ccs, on_gpu, f.replicas
        )
        notes += flop_notes
    measurements["wall_s"] = budget.elapsed()
    measurements["time_budget_s"] = time_budget_s

    diagnosis = Diagnosis(
        bottleneck=bottleneck,
        input_bound=level,
        input_wait_share=share,
        step_time_s=real,
        compute_step_time_s=compute,
        input_batch_time_s=f.input_batch_time_s,
        batch_size=size,
        examples_per_s=(size or 0) / real if real > 0 else math.nan,
        findings=findings,
        device=f"GPU:0 ({gpu_name})" if on_gpu else "CPU",
        flops_per_step=flops,
        achieved_flops_per_s=achieved,
        mfu=mfu_value,
        monitor=m.monitor,
        measurements=measurements,
        notes=notes,
        profile_dir=m.profile_dir,
        noise=noise,
    )
    # 5. Write: an earlier diagnosis is kept as diagnosis.1.json, ...
    if log_path is not None:
        path = log_path / "diagnosis.json"
        rotate(path)
        write_text_atomic(path, json.dumps(diagnosis.to_dict(), indent=2))
    progress.done(f"bottleneck: {bottleneck}")
    return diagnosis


@dataclass
class _Measured:
    """What `_measure_model` measured (its notes and raw records go to the lists passed in)."""

    rounds: list[tuple[float, float]]
    spe_rounds: list[tuple[float, float]]
    xla_rounds: list[tuple[float, float]]
    train_step_ops: list[OpFact]
    monitor: dict[str, float]
    loss_scale_before: float | None
    loss_scale_after: float | None
    profile_dir: str | None


def _measure_model(
    model: keras.Model,
    ds: tf.data.Dataset,
    batch: Any,
    *,
    on_gpu: bool,
    steps: int,
    warmup: int,
    budget: protocol.Budget,
    check_xla: bool,
    check_steps_per_execution: bool,
    monitor: bool,
    profile_dir: str | None,
    measurements: dict[str, Any],
    notes: list[str],
    progress: Progress | None = None,
) -> _Measured:
    """The measuring phase (the model's state is the caller's to put back): the rounds,
    the train step's ops, the probes and the profiler trace."""
    progress = progress or Progress(0, title="diagnose")
    scale_before = loss_scale(model)
    device_ds = device_dataset(batch, on_gpu, ds.element_spec)
    progress.phase("warming up and timing the step on one batch held in memory")
    memory_device = "GPU:0" if on_gpu else "CPU:0"
    devices.reset_peak_memory(memory_device)
    # The first device-resident run always runs (a diagnosis needs one step time), its timed
    # steps within `FIT_SHARE` of the budget.
    spe = int(model.steps_per_execution)
    plan = functools.partial(fit_plan, budget_s=budget.seconds, warmup=warmup, spe=spe)
    started = protocol.now()
    first = protocol.fit_step_time(
        model, device_ds, steps, warmup, None, plan(0.0, step_s=None, fits=1)[1]
    )
    first_s = protocol.now() - started  # about what a probe's first round takes (it traces)
    measurements["peak_memory_bytes"] = devices.peak_memory(memory_device)
    if first and budget.seconds is not None and first * steps > FIT_SHARE * budget.seconds:
        notes.append(
            f"steps of {first:.2f} s: each fit timed for at most {FIT_SHARE * budget.seconds:g}"
            f" s (fewer than {steps} steps, at least one) to fit the time budget of "
            f"{budget.seconds:g} s"
        )
    train_step_ops: list[OpFact] = []
    if on_gpu and not model.jit_compile:  # where ops run matters only beside a GPU
        progress.phase("reading where the train step's ops run")
        with noted(notes, "train-step op placement not checked: {error}"):
            train_step_ops = step_ops(model, batch)

    skipped: list[str] = []

    def probe(**kw: Any) -> Probe:
        warm, limit = plan(budget.left(), step_s=first, fits=2 * protocol.MIN_ROUNDS)
        return run_probe(
            model, device_ds, steps, warm, limit, budget=budget, progress=progress, **kw
        )

    xla = check_xla and supports_xla(model)
    if check_xla and not xla:
        notes.append("XLA not measured: the model does not support jit_compile")
    jit = bool(model.jit_compile)
    xla_probe = functools.partial(
        probe,
        setting="jit_compile",
        current=jit,
        value=not jit,
        threshold=XLA_MIN_GAIN,
        failed="XLA not measured: {name} failed ({error})",
    )
    # Undoing a setting the model has comes first: one round now, `first` its baseline.
    look = xla_probe(first_base=first) if xla and jit else Probe()
    with monitoring(monitor and on_gpu, notes) as aggregate:
        rounds = measure_rounds(
            model, ds, device_ds, first, steps, warmup, budget, progress=progress
        )
    if len(rounds) < protocol.MIN_ROUNDS:
        notes.append(
            f"only {len(rounds)} of {protocol.MIN_ROUNDS} rounds ran within the time budget of "
            f"{budget.seconds:g} s: pass a larger `time_budget_s`"
        )
    measurements["rounds"] = [{"device_resident_s": c, "real_s": r} for c, r in rounds]
    if not on_gpu:
        notes.append("no GPU visible to TensorFlow: measured on the CPU, no GPU monitor")
    scale_after = loss_scale(model)

    # The probes, one that undoes a setting first, each only when the time left is at least
    # what the first run took (its variant traces, or compiles, as that did).
    xla_rounds: list[tuple[float, float]] = []
    if xla and jit:
        if not look.final:
            look = xla_probe(needs_s=first_s, earlier=look.rounds)
        xla_rounds = _record_probe(look, "xla", measurements, notes, skipped)
    compute, _ = protocol.medians(rounds)
    spe_rounds: list[tuple[float, float]] = []
    if check_steps_per_execution and spe == 1 and compute < HOST_OVERHEAD_PROBE_BELOW_S:
        spe_probe = probe(
            setting="steps_per_execution",
            current=spe,
            value=PROBE_STEPS_PER_EXECUTION,
            threshold=HOST_OVERHEAD_MIN_GAIN,
            failed="{name} not measured: {error}",
            needs_s=first_s,
        )
        spe_rounds = _record_probe(
            spe_probe, "steps_per_execution_probe", measurements, notes, skipped
        )
    if xla and not jit:
        xla_rounds = _record_probe(xla_probe(needs_s=first_s), "xla", measurements, notes, skipped)
    if skipped:
        notes.append(
            f"skipped for the time budget of {budget.seconds:g} s: {', '.join(skipped)} "
            "(pass a larger `time_budget_s`, or None for no limit)"
        )
    if profile_dir is not None:
        progress.phase("capturing a profiler trace")
        profile_dir = _profile(model, ds, profile_dir, max(3, spe), notes)
    return _Measured(
        rounds=rounds,
        spe_rounds=spe_rounds,
        xla_rounds=xla_rounds,
        train_step_ops=train_step_ops,
        monitor=aggregate,
        loss_scale_before=scale_before,
        loss_scale_after=scale_after,
        profile_dir=profile_dir,
    )


def _record_probe(
    probe: Probe,
    key: str,
    measurements: dict[str, Any],
    notes: list[str],
    skipped: list[str],
) -> list[tuple[float, float]]:
    """Files a probe's record, notes and skip; returns its rounds."""
    if probe.record is not None:
        measurements[key] = probe.record
    notes.extend(probe.notes)
    if probe.skipped:
        skipped.append(probe.skipped)
    return probe.rounds


def _profile(model: keras.Model, ds: tf.data.Dataset, path: str, steps: int, notes: list[str]):
    """A TensorBoard profiler trace of `steps` steps into `path`; None (and a note) if it fails."""
    with noted(notes, "profiler trace failed: {error}"):
        tf.profiler.experimental.start(path)
        try:
            model.fit(ds.repeat(), epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
        finally:
            tf.profiler.experimental.stop()
        return path
    return None
