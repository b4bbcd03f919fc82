"""`tfgpu.diagnose()`: open the session, read the facts, measure under `preserved(model)`,
classify, write `diagnosis.json`."""

from __future__ import annotations

import math
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters import cpu, devices, replicas
from tfgpu._internal.adapters.datasets import read_first
from tfgpu._internal.adapters.model_state import preserved
from tfgpu._internal.helpers.checks import check_bool, check_int, invalid_value
from tfgpu._internal.measure import reader, rules, timing
from tfgpu._internal.measure.facts import batch_nbytes, gather
from tfgpu._internal.measure.session import Session, check_steps
from tfgpu._internal.measure.variants import Steady, Variants
from tfgpu._internal.measure.workload import Workload, open_workload
from tfgpu.diagnosis import _model, _probes
from tfgpu.diagnosis._advice import advise_service
from tfgpu.diagnosis._classify import classify, monitor_facts, share_verdict, unseen, wait_notes
from tfgpu.diagnosis._facts import (
    FIT_SHARE,
    MEASURE_SHARE,
    PROBE_STEPS_PER_EXECUTION,
    ROUNDS_BUDGET_SHARE,
    DiagnoseFacts,
)
from tfgpu.diagnosis._result import Diagnosis
from tfgpu.flops import mfu, peak_flops, train_step_flops


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


def flop_facts(
    model: Any, x: Any, size: int | None, f: DiagnoseFacts
) -> tuple[Any, Any, Any, list[str]]:
    """(FLOPs per step, achieved FLOP/s, MFU, notes), counted with the batch's own shapes; a
    rate above the devices' peak is not reported as achieved. The FLOPs are the global
    batch's: on GPUs the peak is one GPU's times the replicas; logical CPU devices share the
    machine's cores, so the CPU's peak is the machine's."""
    if not size:
        return None, None, None, []
    failure: list[str] = []
    with _probes.noted(failure, "{error}"):  # FLOP counting is a side feature
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), x)
        if isinstance(signature, (list, tuple)) and len(signature) == 1:
            signature = signature[0]
        flops = train_step_flops(model, size, input_signature=signature)
    if failure:
        # Its message may advise arguments of `train_step_flops`; diagnose takes none of them.
        text = ". ".join(p for p in failure[0].split(". ") if "input_signature" not in p)
        return None, None, None, [f"FLOPs not counted: {text.rstrip('.')}"]
    real = f.step_time_s
    if not flops or not real or real <= 0:
        return flops or None, None, None, []
    achieved = flops / real
    try:
        if f.on_gpu:
            precision = devices.peak_precision(f.policy, list(f.compute_capabilities))
            one = peak_flops(f.gpu_name, precision) if f.gpu_name and precision else None
            peak = None if one is None else one * max(1, f.replicas)
        else:
            peak = cpu.peak_flops(f.policy)
    except (TypeError, ValueError):  # a policy with no peak rate (e.g. "float64")
        peak = None
    if peak and achieved > peak:
        note = (
            f"FLOP count cannot be right: {achieved / 1e9:,.1f} GFLOP/s counted exceeds this "
            f"device's peak of about {peak / 1e9:,.1f} GFLOP/s (not reported as achieved)"
        )
        return flops, None, None, [note]
    return flops, achieved, (mfu(flops, real, peak) if f.on_gpu and peak else None), []


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
    time_budget_s: float | None = rules.OBSERVE_BUDGET_S,
    verbose: int | str = "auto",
) -> Diagnosis:
    """Measures a short training run and says what holds the GPU back, and what to change.

    Times the input pipeline alone, then `fit` on one batch held in device memory against
    `fit` on `data` in rounds until the input wait is clear of noise, then probes
    `steps_per_execution=16` and `jit_compile`, within `time_budget_s`; the model is put back
    afterwards. The guide: docs/diagnosis.md, section `tfgpu.diagnose`.

    Args:
        model: keras.Model, compiled, or a function without arguments that returns one.
        data: `tf.data.Dataset` of batches (what you pass to `fit`), or arrays `(x, y)` /
            `(x, y, sample_weight)`.
        steps: int, timed steps per measurement (>= 3). Defaults to 20.
        warmup: int, untimed steps first (tracing, buffers). Defaults to 3.
        batch_size: int or None, the batch for array input. Defaults to None (32).
        log_dir: str, os.PathLike or None, a run directory for `diagnosis.json` (an
            earlier one kept as `diagnosis.1.json`) and the trace. Defaults to None.
        check_xla: bool, measure `jit_compile` both ways. Defaults to True.
        check_steps_per_execution: bool, probe `steps_per_execution=16`. Defaults to True.
        monitor: bool, sample GPU utilization/memory during the real run. Defaults to True.
        profile: bool, a TensorBoard profiler trace into `log_dir/profile`. Defaults to False.
        time_budget_s: float or None, seconds the measurements may take (None: no limit);
            what does not fit is timed shorter or skipped, with a note. Defaults to 60.0.
        verbose: str or int, "auto", 0, 1 or 2: progress lines, as `model.fit` shows them.
            Defaults to "auto".

    Returns:
        A `Diagnosis`.

    Raises:
        ValueError: on invalid arguments, an uncompiled model or invalid data (docs/diagnosis.md,
            "The model and the data: one check"); before any measurement.
        TypeError: if `model` is not a Keras model, `data` is neither a dataset nor arrays,
            or an argument has the wrong type.

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
        expected = "a `log_dir` to write the trace into"
        raise invalid_value("profile", profile, expected, received="profile=True with log_dir=None")
    check_bool("check_xla", check_xla)
    check_bool("check_steps_per_execution", check_steps_per_execution)
    check_bool("monitor", monitor)
    check_bool("profile", profile)
    run = _Diagnose(session, open_workload(model, data, batch_size=batch_size), steps, warmup)
    facts, batch = run.read()
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    with preserved(run.model, x):
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
        self.variants: Variants

    # 1. What needs no training: the model, the data's graph, the devices, the pipeline alone.
    def read(self) -> tuple[DiagnoseFacts, Any]:
        work = self.work
        batch, size = full_batch(self.dataset, *work.first_batch(), work.batch_size)
        facts = DiagnoseFacts(**gather(work))
        facts.batch_size, facts.host_load = size, _probes.host_load()
        facts.batch_bytes = batch_nbytes(batch)
        if facts.on_gpu and facts.memory_capacity_bytes is None:
            self._nvml_note()
        self.progress.phase("timing the input pipeline alone")
        pipeline = reader.read_alone(self.dataset, self.steps, self.warmup)
        self.measurements["pipeline"] = pipeline.to_dict()
        facts.input_time_s = 1.0 / pipeline.batches_per_s
        facts.pipeline_cpu_busy, facts.cpu_cores = pipeline.cpu_busy, pipeline.cpu_cores
        timed = Steady(self.steps, self.warmup)
        self.variants = Variants(self.model, self.dataset, timed, batch=batch, on_gpu=facts.on_gpu)
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
        self, f: DiagnoseFacts, batch: Any, check_xla: bool, check_spe: bool, monitor: bool
    ) -> None:
        f.loss_scale_before = _model.loss_scale(self.model)
        first, first_s = self._first_look(f, batch)
        xla = check_xla and f.xla_supported
        if check_xla and not xla:
            self.notes.append("XLA not measured: the model does not support jit_compile")
        # Undoing a setting the model has comes first: one round now, `first` its baseline.
        undo = xla and f.jit_compile
        look = self._probe("jit_compile", False, first, first_base=first) if undo else None
        with _probes.monitoring(monitor, self.notes) as aggregate:
            f.rounds = self._rounds(first)
        self.monitor = aggregate
        self._rounds_notes(f)
        f.loss_scale_after = _model.loss_scale(self.model)
        f.compute_step_time_s, f.step_time_s = rules.medians(f.rounds)
        # The probes, one that undoes a setting first, each only when the time left is at least
        # what the first run took (its variant traces, or compiles, as that did).
        skipped: list[str] = []
        if look is not None:
            if look.rounds and look.stopped not in ("slower", "faster"):
                look = self._probe("jit_compile", False, first, first_s, earlier=look.rounds)
            f.xla_rounds = self._record(look, "xla", skipped)
        host_bound = f.compute_step_time_s < rules.HOST_BOUND_STEP_S
        if check_spe and f.steps_per_execution == 1 and host_bound:
            probe = self._probe("steps_per_execution", PROBE_STEPS_PER_EXECUTION, first, first_s)
            f.spe_rounds = self._record(probe, "steps_per_execution_probe", skipped)
        if xla and not f.jit_compile:
            probe = self._probe("jit_compile", True, first, first_s)
            f.xla_rounds = self._record(probe, "xla", skipped)
        if skipped:
            self.notes.append(
                f"skipped for the time budget of {self.budget.seconds:g} s: {', '.join(skipped)} "
                "(pass a larger `time_budget_s`, or None for no limit)"
            )

    def _first_look(self, f: DiagnoseFacts, batch: Any) -> tuple[float | None, float]:
        """The first device-resident run, always (a diagnosis needs one step time), timed within
        `FIT_SHARE` of the budget, and how long it took; the peak memory, the step's ops."""
        self.progress.phase("warming up and timing the step on one batch held in memory")
        memory_device = "GPU:0" if f.on_gpu else "CPU:0"
        devices.reset_peak_memory(memory_device)
        self.variants.timed = Steady(self.steps, self.warmup, self._plan(0.0, None, 1)[1])
        started = timing.now()
        first = self.variants.run_for(_probes.DEVICE)(None, None)
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
            with _probes.noted(self.notes, "train-step op placement not checked: {error}"):
                f.train_step_ops = _model.step_ops(self.model, batch)
        return first, first_s

    def _rounds(self, first: float | None) -> list[tuple[float, float]]:
        """(device-resident, real) seconds per step, round after round, until the input-wait
        share is clear of the thresholds or `ROUNDS_BUDGET_SHARE` of the budget is spent; each
        fit as long as `fit_plan` allows for `MIN_ROUNDS` rounds. `first`: the first look's."""
        budget, progress = self.budget, self.progress
        progress.phase("warming up on the real data")
        _probes.warm_real(self.model, self.dataset, budget)
        fits = 2 * rules.MIN_ROUNDS - (first is not None)
        warm, timed_s = self._plan(budget.left(), first, fits)
        self.variants.timed = Steady(self.steps, warm, timed_s)
        rounds_until = (
            None if budget.seconds is None else budget.start + ROUNDS_BUDGET_SHARE * budget.seconds
        )
        shown: set[int] = set()
        calls = {"compute": 1 if first is not None else 0, "real": 0}

        def announced(kind: str, run: timing.Run) -> timing.Run:
            def timed(deadline: float | None, limit: float | None) -> float | None:
                calls[kind] += 1
                if calls[kind] not in shown:  # the round's first run says which round it is
                    shown.add(calls[kind])
                    progress.phase(
                        "timing the real data against a batch in memory, "
                        f"round {calls[kind]} of at most {rules.MAX_ROUNDS}"
                    )
                # The first real run, like the first device-resident one, ignores the deadline.
                first_real = kind == "real" and calls[kind] == 1
                return run(None if first_real else deadline, limit)

            return timed

        def done(rounds: list[tuple[float, float]]) -> bool:
            if share_verdict(rounds)["level"] != "inconclusive":
                return True
            return rounds_until is not None and timing.now() >= rounds_until

        return timing.compare(
            announced("compute", self.variants.run_for(_probes.DEVICE)),
            {"real": announced("real", self.variants.run_for({}))},
            budget=budget,
            first_base=first,
            done=done,
            clearly_slower=None,
        )["real"].rounds

    def _plan(self, left_s: float, step_s: float | None, fits: int) -> tuple[int, float | None]:
        spe = int(self.model.steps_per_execution)
        return _probes.fit_plan(left_s, self.budget.seconds, step_s, fits, self.warmup, spe)

    def _probe(
        self,
        setting: str,
        value: Any,
        first: float | None,
        needs_s: float = 0.0,
        *,
        first_base: float | None = None,
        earlier: list[tuple[float, float]] | None = None,
    ) -> _probes.Probe:
        """Times the device-resident step with `setting` = `value` against the model's own, in
        rounds, unless less than `needs_s` of the budget is left; an error is a note. With
        `first_base` (the baseline's step, measured) one round, final when clear; `earlier`:
        that round's rounds."""
        warm, limit = self._plan(self.budget.left(), first, 2 * rules.MIN_ROUNDS)
        self.variants.timed = Steady(self.steps, warm, limit)
        current = getattr(self.model, setting)
        name = f"{setting}={value}"
        rounds: list[tuple[float, float]] = []
        stopped: str | None = None
        failure: list[str] = []
        most = 1 if first_base is not None else rules.MAX_ROUNDS
        if self.budget.left() > max(0.0, needs_s):
            calls = [0]
            run = self.variants.run_for({**_probes.DEVICE, setting: value})

            def announced(deadline: float | None, limit: float | None) -> float | None:
                calls[0] += 1
                self.progress.phase(
                    f"trying {name} against {current}, round {calls[0]} of at most {most}"
                )
                return run(deadline, limit)

            if setting == "jit_compile":
                failed = f"XLA not measured: {name} failed ({{error}})"
            else:
                failed = f"{name} not measured: {{error}}"
            with _probes.noted(failure, failed):
                c = timing.compare(
                    self.variants.run_for(_probes.DEVICE),
                    {"variant": announced},
                    budget=self.budget,
                    max_rounds=most,
                    timed_units=max(6, self.steps),
                    first_base=first_base,
                )["variant"]
                rounds, stopped = c.rounds, c.stopped
        elif not earlier:
            return _probes.Probe(skipped=f"the {name} probe")
        else:
            stopped = "budget"
        if failure and not earlier:
            return _probes.Probe(notes=failure)
        rounds = (earlier or []) + rounds
        gain = rules.Gain.of(rounds)
        if first_base is not None and stopped is None and gain and gain.value >= rules.CLEARLY:
            stopped = "faster"
        notes = _probes.probe_notes(name, gain, len(rounds), stopped, self.budget.seconds)
        record = _probes.probe_record(f"{setting}={current}", name, rounds, stopped)
        return _probes.Probe(rounds, record, failure + notes, stopped=stopped)

    def _record(
        self, probe: _probes.Probe, key: str, skipped: list[str]
    ) -> list[tuple[float, float]]:
        """Files a probe's record, notes and skip; returns its rounds."""
        if probe.record is not None:
            self.measurements[key] = probe.record
        self.notes.extend(probe.notes)
        if probe.skipped:
            skipped.append(probe.skipped)
        return probe.rounds

    def _rounds_notes(self, f: DiagnoseFacts) -> None:
        if len(f.rounds) < rules.MIN_ROUNDS:
            self.notes.append(
                f"only {len(f.rounds)} of {rules.MIN_ROUNDS} rounds ran within the time budget of "
                f"{self.budget.seconds:g} s: pass a larger `time_budget_s`"
            )
        self.measurements["rounds"] = [{"device_resident_s": c, "real_s": r} for c, r in f.rounds]
        if not f.on_gpu:
            self.notes.append("no GPU visible to TensorFlow: measured on the CPU, no GPU monitor")

    def profile(self, path: str) -> None:
        """A TensorBoard profiler trace of a few steps into `path` (a note if it fails)."""
        steps = max(3, int(self.model.steps_per_execution))
        with _probes.noted(self.notes, "profiler trace failed: {error}"):
            tf.profiler.experimental.start(path)
            try:
                self.model.fit(
                    self.dataset.repeat(), epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False
                )
            finally:
                tf.profiler.experimental.stop()
            self.profile_dir = path

    # 3. The classification and the result.
    def diagnosis(self, f: DiagnoseFacts, x: Any) -> Diagnosis:
        for name, value in monitor_facts(self.monitor).items():
            setattr(f, name, value)
        self._replica_facts(f)
        if f.on_gpu:
            with _probes.noted(self.notes, "tensor-core facts not read: {error}"):
                f.tf32_enabled = devices.tf32_execution_enabled()
                f.float32_layers, f.odd_dim_layers = _model.precision_layers(self.model)
        verdict = share_verdict(f.rounds)
        bottleneck, level, share, findings = classify(f, verdict)
        service = advise_service(f) if level in ("high", "moderate") else None
        if service is not None:  # the finding says it in words; this is for programs
            self.measurements["data_service"] = {"workers": service.workers, "cores": service.cores}
        self.notes.extend(unseen(f) + wait_notes(f, verdict, level, share, findings))
        noise = None
        self.measurements["noise"] = None
        if verdict["rounds"] >= rules.MIN_ROUNDS:  # fewer rounds cannot tell the noise
            noise = verdict["high"] - verdict["low"]
            kept = ("low", "high", "confidence", "rounds")
            self.measurements["noise"] = {k: verdict[k] for k in kept}
        findings += _model.lint_mixed_precision(self.model, list(f.compute_capabilities))
        flops = achieved = mfu_value = None
        budget = self.budget
        if budget.seconds is not None and budget.elapsed() >= budget.seconds:
            self.notes.append(
                f"FLOPs not counted: the time budget of {budget.seconds:g} s was spent"
            )
        else:
            self.progress.phase("counting the FLOPs of a training step")
            flops, achieved, mfu_value, flop_notes = flop_facts(self.model, x, f.batch_size, f)
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
            batch_size=f.batch_size,
            examples_per_s=(f.batch_size or 0) / real if real > 0 else math.nan,
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

    def _replica_facts(self, f: DiagnoseFacts) -> None:
        """On several replicas, the all-reduce of the gradients timed alone."""
        if f.replicas <= 1:
            return
        if self.budget.left() <= 0:
            self.notes.append(self.session.budget_note("the all-reduce was not timed alone"))
            return
        self.progress.phase("timing the all-reduce of the gradients alone")
        with _probes.noted(self.notes, "the all-reduce was not timed alone: {error}"):
            strategy = self.model.distribute_strategy
            f.all_reduce_s = replicas.all_reduce_s(strategy, self.model, tiny=False)
            f.gradient_bytes = replicas.gradient_bytes(self.model)
