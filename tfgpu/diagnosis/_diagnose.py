"""`tfgpu.diagnose()`: open the session, read the facts, measure under `preserved(model)`,
classify, write `diagnosis.json`."""

from __future__ import annotations

import math
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters import devices, replicas
from tfgpu._internal.adapters.datasets import read_first
from tfgpu._internal.adapters.model_state import preserved
from tfgpu._internal.helpers.checks import check_bool, check_int, invalid_value
from tfgpu._internal.measure import reader, timing
from tfgpu._internal.measure.facts import gather
from tfgpu._internal.measure.rules import HOST_BOUND_STEP_S, MIN_ROUNDS, medians
from tfgpu._internal.measure.session import OBSERVE_BUDGET_S, Session, check_steps
from tfgpu._internal.measure.variants import Steady, Variants
from tfgpu._internal.measure.workload import Workload, open_workload
from tfgpu.diagnosis._advice import advise_service
from tfgpu.diagnosis._classify import classify, monitor_facts, unseen, wait_notes
from tfgpu.diagnosis._facts import (
    FIT_SHARE,
    MEASURE_SHARE,
    PROBE_STEPS_PER_EXECUTION,
    Facts,
)
from tfgpu.diagnosis._graph import batch_nbytes, step_ops
from tfgpu.diagnosis._lint import lint_mixed_precision, loss_scale, precision_layers
from tfgpu.diagnosis._probes import (
    DEVICE,
    Probe,
    fit_plan,
    host_load,
    measure_rounds,
    monitoring,
    noted,
    run_probe,
)
from tfgpu.diagnosis._result import Diagnosis
from tfgpu.diagnosis._rounds import share_verdict


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


def flop_facts(model: Any, x: Any, size: int | None, f: Facts) -> tuple[Any, Any, Any, list[str]]:
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
    real, on_gpu = f.step_time_s, f.on_gpu
    if not flops or not real or real <= 0:
        return flops or None, None, None, notes
    achieved = flops / real
    peak = None
    try:
        if on_gpu:
            precision = devices.peak_precision(f.policy, list(f.compute_capabilities))
            one = peak_flops(f.gpu_name, precision) if f.gpu_name and precision else None
            peak = None if one is None else one * max(1, f.replicas)
        else:
            from tfgpu._internal.adapters import cpu

            peak = cpu.peak_flops(f.policy)
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
    time_budget_s: float | None = OBSERVE_BUDGET_S,
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
        model: keras.Model, compiled, or a function without arguments that builds and
            compiles one.
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
    session = Session.open(
        "diagnose",
        verbose=verbose,
        time_budget_s=time_budget_s,
        log_dir=log_dir,
        measure_share=MEASURE_SHARE,
    )
    check_steps(steps)
    check_int("warmup", warmup, minimum=1)
    if profile and session.log_path is None:
        raise invalid_value(
            "profile",
            profile,
            "a `log_dir` to write the trace into",
            received="profile=True with log_dir=None",
        )
    for flag, given in (
        ("check_xla", check_xla),
        ("check_steps_per_execution", check_steps_per_execution),
        ("monitor", monitor),
        ("profile", profile),
    ):
        check_bool(flag, given)
    work = open_workload(model, data, batch_size=batch_size)
    run = _Diagnose(session, work, steps, warmup)
    facts, batch = run.read()
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    with preserved(work.model, x):
        run.measure(facts, batch, check_xla, check_steps_per_execution, monitor and facts.on_gpu)
        if profile and session.log_path is not None:
            session.progress.phase("capturing a profiler trace")
            run.profile(str(session.log_path / "profile"))
        session.progress.phase("restoring the model's weights, optimizer and settings")
    diagnosis = run.diagnosis(facts, x)
    return session.finish(diagnosis, f"bottleneck: {diagnosis.bottleneck}")


class _Diagnose:
    """One diagnosis: the facts read, the measurements, the classification, in phases."""

    def __init__(self, session: Session, work: Workload, steps: int, warmup: int):
        self.session, self.work = session, work
        self.model, self.dataset = work.model, work.dataset
        self.steps, self.warmup = steps, warmup
        self.budget, self.progress, self.notes = session.budget, session.progress, session.notes
        self.measurements: dict[str, Any] = {}
        self.monitor: dict[str, float] = {}
        self.profile_dir: str | None = None
        self.size: int | None = None
        self.variants: Variants

    # 1. What needs no training: the model, the data's graph, the devices, the pipeline alone.
    def read(self) -> tuple[Facts, Any]:
        work = self.work
        batch, self.size = full_batch(self.dataset, *work.first_batch(), work.batch_size)
        facts = Facts(
            **gather(
                self.model,
                self.dataset,
                from_arrays=work.from_arrays,
                has_factory=work.factory is not None,
            )
        )
        facts.batch_size = self.size
        facts.host_load = host_load()
        facts.batch_bytes = batch_nbytes(batch)
        if facts.on_gpu and facts.memory_capacity_bytes is None:
            self._nvml_note()
        self.progress.phase("timing the input pipeline alone")
        pipeline = reader.read_alone(self.dataset, self.steps, self.warmup)
        self.measurements["pipeline"] = pipeline.to_dict()
        facts.input_time_s = 1.0 / pipeline.batches_per_s
        facts.pipeline_cpu_busy, facts.cpu_cores = pipeline.cpu_busy, pipeline.cpu_cores
        self.variants = Variants(
            self.model,
            self.dataset,
            Steady(self.steps, self.warmup),
            batch=batch,
            on_gpu=facts.on_gpu,
        )
        return facts, batch

    def _nvml_note(self) -> None:
        try:
            from tfgpu.monitor.nvml import inventory

            inv = inventory()
            if inv.error:
                self.notes.append(f"NVML unavailable ({inv.error}): no memory capacity, no monitor")
        except ImportError as e:  # `inventory` never raises; tfgpu.monitor may not import
            self.notes.append(f"NVML query failed: {e}")

    # 2. The measurements (the model's state is the caller's to put back).
    def measure(
        self, f: Facts, batch: Any, check_xla: bool, check_spe: bool, monitor: bool
    ) -> None:
        v = self.variants
        f.loss_scale_before = loss_scale(self.model)
        first, first_s = self._first_look(f, batch)
        xla = check_xla and f.xla_supported
        if check_xla and not xla:
            self.notes.append("XLA not measured: the model does not support jit_compile")
        # Undoing a setting the model has comes first: one round now, `first` its baseline.
        look = (
            self._probe("jit_compile", not f.jit_compile, first, first_base=first)
            if (xla and f.jit_compile)
            else Probe()
        )
        with monitoring(monitor, self.notes) as aggregate:
            f.rounds = measure_rounds(v, first, self.steps, self.warmup, self.budget, self.progress)
        self.monitor = aggregate
        self._rounds_notes(f)
        f.loss_scale_after = loss_scale(self.model)
        f.compute_step_time_s, f.step_time_s = medians(f.rounds)
        # The probes, one that undoes a setting first, each only when the time left is at least
        # what the first run took (its variant traces, or compiles, as that did).
        skipped: list[str] = []
        if xla and f.jit_compile:
            if not look.final:
                look = self._probe(
                    "jit_compile", False, first, needs_s=first_s, earlier=look.rounds
                )
            f.xla_rounds = self._record(look, "xla", skipped)
        if check_spe and f.steps_per_execution == 1 and f.compute_step_time_s < HOST_BOUND_STEP_S:
            probe = self._probe(
                "steps_per_execution", PROBE_STEPS_PER_EXECUTION, first, needs_s=first_s
            )
            f.spe_rounds = self._record(probe, "steps_per_execution_probe", skipped)
        if xla and not f.jit_compile:
            f.xla_rounds = self._record(
                self._probe("jit_compile", True, first, needs_s=first_s), "xla", skipped
            )
        if skipped:
            self.notes.append(
                f"skipped for the time budget of {self.budget.seconds:g} s: {', '.join(skipped)} "
                "(pass a larger `time_budget_s`, or None for no limit)"
            )

    def _first_look(self, f: Facts, batch: Any) -> tuple[float | None, float]:
        """The first device-resident run (it always runs: a diagnosis needs one step time),
        its timed steps within `FIT_SHARE` of the budget; the peak memory, the step's ops."""
        self.progress.phase("warming up and timing the step on one batch held in memory")
        memory_device = "GPU:0" if f.on_gpu else "CPU:0"
        devices.reset_peak_memory(memory_device)
        self.variants.timed = Steady(self.steps, self.warmup, self._plan(0.0, None, 1)[1])
        started = timing.now()
        first = self.variants.run_for(DEVICE)(None, None)
        first_s = timing.now() - started  # about what a probe's first round takes (it traces)
        f.peak_memory_bytes = devices.peak_memory(memory_device)
        self.measurements["peak_memory_bytes"] = f.peak_memory_bytes
        budget_s = self.budget.seconds
        if first and budget_s is not None and first * self.steps > FIT_SHARE * budget_s:
            self.notes.append(
                f"steps of {first:.2f} s: each fit timed for at most {FIT_SHARE * budget_s:g}"
                f" s (fewer than {self.steps} steps, at least one) to fit the time budget of "
                f"{budget_s:g} s"
            )
        if f.on_gpu and not f.jit_compile:  # where ops run matters only beside a GPU
            self.progress.phase("reading where the train step's ops run")
            with noted(self.notes, "train-step op placement not checked: {error}"):
                f.train_step_ops = step_ops(self.model, batch)
        return first, first_s

    def _plan(self, left_s: float, step_s: float | None, fits: int) -> tuple[int, float | None]:
        spe = int(self.model.steps_per_execution)
        return fit_plan(left_s, self.budget.seconds, step_s, fits, self.warmup, spe)

    def _probe(self, setting: str, value: Any, first: float | None, **kw: Any) -> Probe:
        warm, limit = self._plan(self.budget.left(), first, 2 * MIN_ROUNDS)
        self.variants.timed = Steady(self.steps, warm, limit)
        failed = (
            "XLA not measured: {name} failed ({error})"
            if setting == "jit_compile"
            else "{name} not measured: {error}"
        )
        return run_probe(
            self.variants,
            setting=setting,
            value=value,
            budget=self.budget,
            failed=failed,
            progress=self.progress,
            **kw,
        )

    def _record(self, probe: Probe, key: str, skipped: list[str]) -> list[tuple[float, float]]:
        """Files a probe's record, notes and skip; returns its rounds."""
        if probe.record is not None:
            self.measurements[key] = probe.record
        self.notes.extend(probe.notes)
        if probe.skipped:
            skipped.append(probe.skipped)
        return probe.rounds

    def _rounds_notes(self, f: Facts) -> None:
        if len(f.rounds) < MIN_ROUNDS:
            self.notes.append(
                f"only {len(f.rounds)} of {MIN_ROUNDS} rounds ran within the time budget of "
                f"{self.budget.seconds:g} s: pass a larger `time_budget_s`"
            )
        self.measurements["rounds"] = [{"device_resident_s": c, "real_s": r} for c, r in f.rounds]
        if not f.on_gpu:
            self.notes.append("no GPU visible to TensorFlow: measured on the CPU, no GPU monitor")

    def profile(self, path: str) -> None:
        """A TensorBoard profiler trace of a few steps into `path` (a note if it fails)."""
        steps = max(3, int(self.model.steps_per_execution))
        with noted(self.notes, "profiler trace failed: {error}"):
            tf.profiler.experimental.start(path)
            try:
                self.model.fit(
                    self.dataset.repeat(), epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False
                )
            finally:
                tf.profiler.experimental.stop()
            self.profile_dir = path

    # 3. The classification and the result.
    def diagnosis(self, f: Facts, x: Any) -> Diagnosis:
        for name, value in monitor_facts(self.monitor).items():
            setattr(f, name, value)
        self._replica_facts(f)
        if f.on_gpu:
            with noted(self.notes, "tensor-core facts not read: {error}"):
                f.tf32_enabled = devices.tf32_execution_enabled()
                f.float32_layers, f.odd_dim_layers = precision_layers(self.model)
        verdict = share_verdict(f.rounds)
        bottleneck, level, share, findings = classify(f, verdict)
        service = advise_service(f) if level in ("high", "moderate") else None
        if service is not None:  # the finding says it in words; this is for programs
            self.measurements["data_service"] = {"workers": service.workers, "cores": service.cores}
        self.notes.extend(unseen(f) + wait_notes(f, verdict, level, share, findings))
        noise = None
        self.measurements["noise"] = None
        if verdict["rounds"] >= MIN_ROUNDS:  # fewer rounds cannot tell the noise
            noise = verdict["high"] - verdict["low"]
            self.measurements["noise"] = {
                k: verdict[k] for k in ("low", "high", "confidence", "rounds")
            }
        findings += lint_mixed_precision(self.model, list(f.compute_capabilities))
        flops = achieved = mfu_value = None
        budget = self.budget
        if budget.seconds is not None and budget.elapsed() >= budget.seconds:
            self.notes.append(
                f"FLOPs not counted: the time budget of {budget.seconds:g} s was spent"
            )
        else:
            self.progress.phase("counting the FLOPs of a training step")
            flops, achieved, mfu_value, flop_notes = flop_facts(self.model, x, self.size, f)
            self.notes.extend(flop_notes)
        self.measurements["time_budget_s"] = budget.seconds
        real = f.step_time_s
        return Diagnosis(
            bottleneck=bottleneck,
            input_bound=level,
            input_wait_share=share,
            step_time_s=real,
            compute_step_time_s=f.compute_step_time_s,
            input_batch_time_s=f.input_time_s,
            batch_size=self.size,
            examples_per_s=(self.size or 0) / real if real > 0 else math.nan,
            findings=findings,
            device=f"GPU:0 ({f.gpu_name})" if f.on_gpu else "CPU",
            flops_per_step=flops,
            achieved_flops_per_s=achieved,
            mfu=mfu_value,
            monitor=self.monitor,
            measurements=self.measurements,
            notes=self.notes,
            profile_dir=self.profile_dir,
            noise=noise,
        )

    def _replica_facts(self, f: Facts) -> None:
        """On several replicas, the all-reduce of the gradients timed alone."""
        if f.replicas <= 1:
            return
        if self.budget.left() <= 0:
            self.notes.append(self.session.budget_note("the all-reduce was not timed alone"))
            return
        self.progress.phase("timing the all-reduce of the gradients alone")
        with noted(self.notes, "the all-reduce was not timed alone: {error}"):
            strategy = self.model.distribute_strategy
            f.all_reduce_s = replicas.all_reduce_s(strategy, self.model, tiny=False)
            f.gradient_bytes = replicas.gradient_bytes(self.model)
