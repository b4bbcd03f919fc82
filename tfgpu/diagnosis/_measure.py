"""The measuring protocol: timed `fit` calls under a time budget, interleaved in rounds.

`_measure_rounds` alternates a device-resident batch and the real data until the input
wait is clear of the thresholds; `_run_probe` alternates a compile setting's two values
(`steps_per_execution`, `jit_compile`). Every clock read goes through `_now`, and every
timed fit through `_fit_step_time`, both module attributes here (the tests' scripted clock
replaces them).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from tfgpu import _stats
from tfgpu._datasets import cardinality
from tfgpu._warnings import one_line
from tfgpu.diagnosis._facts import (
    _MAX_ROUNDS,
    _MEASURE_SHARE,
    _MIN_ROUNDS,
    _PROBE_FIT_LIMIT_FACTOR,
    _PROBE_MAX_ROUNDS,
    _ROUNDS_BUDGET_SHARE,
    PROBE_CLEARLY_SLOWER,
)
from tfgpu.diagnosis._rounds import _medians, _probe_gain, _probe_settled, _share_verdict

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
    return _stats.median(gaps) / spe if gaps else None


@dataclass
class _Budget:
    """The time budget of one diagnosis, on `_now`'s clock (None: no limit)."""

    seconds: float | None
    start: float = field(default_factory=lambda: _now())

    @property
    def deadline(self) -> float | None:
        """When measuring stops: the rest of the budget counts FLOPs and restores the model."""
        return None if self.seconds is None else self.start + _MEASURE_SHARE * self.seconds

    def elapsed(self) -> float:
        """Seconds since the diagnosis started."""
        return _now() - self.start

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


def _device_dataset(batch, on_gpu: bool):
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    if on_gpu:
        return ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0", buffer_size=2))
    return ds.prefetch(2)


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
    base, variant = _medians(rounds) if rounds else (None, None)
    record: dict[str, Any] = {
        base_name: base,
        variant_name: variant,
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


def _first_device_run(
    model: Any, device_ds: Any, steps: int, warmup: int, mem_device: str
) -> tuple[float | None, int | None]:
    """(seconds per step, peak device memory) of the first device-resident run.

    It always runs in full, whatever the budget: a diagnosis needs one step time.
    """
    try:
        tf.config.experimental.reset_memory_stats(mem_device)
    except Exception:
        pass
    compute = _fit_step_time(model, device_ds, steps, warmup)
    try:
        peak: int | None = int(tf.config.experimental.get_memory_info(mem_device)["peak"])
    except Exception:
        peak = None
    return compute, peak


def _measure_rounds(
    model: Any,
    ds: Any,
    device_ds: Any,
    first_compute: float | None,
    steps: int,
    warmup: int,
    budget: _Budget,
) -> list[tuple[float, float]]:
    """(device-resident, real) seconds per step, round after round, until the input-wait
    share is clear of the thresholds (at least `_MIN_ROUNDS`, at most `_MAX_ROUNDS`) or
    `_ROUNDS_BUDGET_SHARE` of the budget is spent. The first real run, like the first
    device-resident one (`first_compute`), runs in full."""
    # Warm the real data once through every batch shape it has (a partial last batch
    # retraces the step, and recompiles it under XLA): not inside a timed window.
    repeated = ds.repeat()
    _warm_real(model, ds, repeated, budget)
    # Alternate the device-resident and the real runs, so that a noisy host favours
    # neither, until the input-wait share is clear of the thresholds.
    rounds_until = (
        None if budget.seconds is None else budget.start + _ROUNDS_BUDGET_SHARE * budget.seconds
    )
    compute = first_compute
    rounds: list[tuple[float, float]] = []
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
        real = _fit_step_time(model, repeated, steps, warmup, budget.deadline if i > 0 else None)
        if compute is None or real is None:  # the budget ran out before a timed step
            break
        rounds.append((compute, real))
    return rounds


@dataclass
class _Probe:
    """One probe's outcome: its rounds, its record for `measurements`, its notes."""

    rounds: list[tuple[float, float]] = field(default_factory=list)
    record: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # what the budget left out, e.g. "the jit_compile=True probe"


def _run_probe(
    model: Any,
    device_ds: Any,
    steps: int,
    warmup: int,
    budget: _Budget,
    *,
    setting: str,
    current: Any,
    value: Any,
    threshold: float,
    failed: str,
) -> _Probe:
    """Times the device-resident step with `setting` = `value` against `current`, in rounds.

    Skipped when the budget is spent; an error is one note (`failed`, formatted with the
    variant's `name` and the `error`), never a crash.
    """
    base_name, name = f"{setting}={current}", f"{setting}={value}"
    if budget.left() <= 0:
        return _Probe(skipped=f"the {name} probe")
    try:
        rounds, stopped = _compare(
            model, device_ds, steps, warmup, {setting: value}, threshold=threshold, budget=budget
        )
    except Exception as e:  # a probe never kills the diagnosis
        return _Probe(notes=[failed.format(name=name, error=one_line(e))])
    return _Probe(
        rounds=rounds,
        record=_probe_record(base_name, name, rounds, stopped),
        notes=_probe_notes(name, rounds, stopped, budget.seconds),
    )


def _supports_xla(model: Any) -> bool:
    """Whether Keras accepts `jit_compile` flipped for this model (it refuses some models)."""
    current = bool(model.jit_compile)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.jit_compile = not current
        return bool(model.jit_compile) != current
    finally:
        model.jit_compile = current


@contextlib.contextmanager
def _monitoring(enabled: bool, notes: list[str]) -> Iterator[dict[str, float]]:
    """Samples the GPUs TensorFlow trains on during the body; the dict it gives is filled
    with `Sampler.aggregate()` on exit (`gpu0_*` is `/GPU:0`). Failures are notes."""
    aggregate: dict[str, float] = {}
    sampler = None
    if enabled:
        try:
            from tfgpu import _devices
            from tfgpu.monitor import Sampler

            sampler = Sampler(interval=0.1, gpus=_devices.cuda_indices(None))
            sampler.start()
        except Exception as e:  # side feature: never kill the diagnosis
            notes.append(f"GPU monitor not started: {one_line(e)}")
            sampler = None
    try:
        yield aggregate
    finally:
        if sampler is not None:
            try:
                sampler.stop()
                aggregate.update(sampler.aggregate())
            except Exception as e:
                notes.append(f"GPU monitor failed: {one_line(e)}")
