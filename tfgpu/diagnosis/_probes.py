"""The measuring protocol of `diagnose`, on the measuring core's variants and timing engine:
`measure_rounds` alternates the step on one batch held in device memory with the step on the
real data; a probe's record and notes; the failures of side checks become notes (`noted`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.datasets import cardinality
from tfgpu._internal.helpers.progress import Progress
from tfgpu._internal.helpers.warn import one_line
from tfgpu._internal.measure import timing
from tfgpu._internal.measure.rules import MAX_ROUNDS, MIN_ROUNDS, Gain, medians
from tfgpu._internal.measure.variants import DEVICE_RESIDENT, Steady, Variants
from tfgpu.diagnosis._classify import share_verdict
from tfgpu.diagnosis._facts import FIT_SHARE, ROUNDS_BUDGET_SHARE

# The variant without its input pipeline: one batch held in device memory.
DEVICE = {DEVICE_RESIDENT: True}


def fit_plan(
    left_s: float, budget_s: float | None, step_s: float | None, fits: int, warmup: int, spe: int
) -> tuple[int, float | None]:
    """(warm-up steps, seconds of timed steps) for each of the next `fits` fits of steps of
    `step_s` (None: not known yet): timed for at most `FIT_SHARE` of the budget; where such
    fits would not end within `left_s`, one warm-up step (the engine's least: two calls of
    `spe` steps) and fewer timed steps, at least one call. Pure.

    Example:

    >>> fit_plan(20.0, 60.0, 1.0, 5, 3, 1)  # 5 fits of 3 + 3 s do not fit in 20 s
    (1, 2.0)
    """
    if budget_s is None:
        return warmup, None
    most = FIT_SHARE * budget_s
    if not step_s:
        return warmup, most
    call_s = step_s * spe
    warm_calls, _ = timing.call_counts(spe, 1, warmup)
    if warm_calls * call_s + most <= left_s / fits:
        return warmup, most
    return 1, max(0.5 * call_s, min(most, left_s / fits - 2 * call_s))


def host_load() -> float | None:
    """The 1-minute load average per CPU core, or None where the OS does not say."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def _warm_real(model: Any, ds: tf.data.Dataset, budget: timing.Budget) -> None:
    """One untimed pass over the real data's first epoch (at most 64 batches), so that every
    batch shape is traced outside the timed runs; an infinite dataset is not warmed here."""
    try:
        n = cardinality(ds)
    except tf.errors.OpError:
        n = None
    if not n or n < 0:
        return
    spe = max(1, int(model.steps_per_execution))
    calls = min(64, max(1, math.ceil(n / spe)) + 1)
    model.fit(
        ds.repeat(),
        epochs=1,
        steps_per_epoch=calls * spe,
        verbose=0,
        shuffle=False,
        callbacks=[timing.Timer(0, budget.deadline, None)],
    )
    model.stop_training = False


def measure_rounds(
    variants: Variants,
    first_compute: float | None,
    steps: int,
    warmup: int,
    budget: timing.Budget,
    progress: Progress,
) -> list[tuple[float, float]]:
    """(device-resident, real) seconds per step, round after round, until the input-wait
    share is clear of the thresholds or `ROUNDS_BUDGET_SHARE` of the budget is spent; each
    fit as long as `fit_plan` allows for `MIN_ROUNDS` rounds."""
    model = variants.model
    progress.phase("warming up on the real data")
    _warm_real(model, variants.dataset, budget)
    spe = max(1, int(model.steps_per_execution))
    fits = 2 * MIN_ROUNDS - (first_compute is not None)
    warm, timed_s = fit_plan(budget.left(), budget.seconds, first_compute, fits, warmup, spe)
    variants.timed = Steady(steps, warm, timed_s)
    rounds_until = (
        None if budget.seconds is None else budget.start + ROUNDS_BUDGET_SHARE * budget.seconds
    )
    shown: set[int] = set()
    calls = {"compute": 1 if first_compute is not None else 0, "real": 0}

    def announced(kind: str, run: timing.Run) -> timing.Run:
        def timed(deadline: float | None, limit: float | None) -> float | None:
            calls[kind] += 1
            if calls[kind] not in shown:  # the round's first run says which round it is
                shown.add(calls[kind])
                progress.phase(
                    "timing the real data against a batch in memory, "
                    f"round {calls[kind]} of at most {MAX_ROUNDS}"
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
        announced("compute", variants.run_for(DEVICE)),
        {"real": announced("real", variants.run_for({}))},
        budget=budget,
        first_base=first_compute,
        done=done,
        clearly_slower=None,
    )["real"].rounds


@dataclass
class Probe:
    """One probe's outcome: its rounds, its record for `measurements`, its notes, what the
    budget left out (e.g. "the jit_compile=True probe") and why it stopped early ("slower",
    "faster", "budget" or None)."""

    rounds: list[tuple[float, float]] = field(default_factory=list)
    record: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    stopped: str | None = None


def probe_record(
    base_name: str, variant_name: str, rounds: list[tuple[float, float]], stopped: str | None
) -> dict[str, Any]:
    """A probe's measurements: median step times, the gain and its interval, the rounds."""
    base, variant = medians(rounds) if rounds else (None, None)
    record: dict[str, Any] = {
        base_name: base,
        variant_name: variant,
        "gain": Gain.of(rounds),
        "rounds": [{"baseline_s": b, "variant_s": v} for b, v in rounds],
    }
    if stopped:
        record["stopped"] = stopped
    return record


def probe_notes(
    name: str, gain: Gain | None, rounds: int, stopped: str | None, budget_s: float | None
) -> list[str]:
    """One line on a probe that stopped early."""
    if gain is None:
        return []
    if stopped in ("slower", "faster"):
        factor = 1 / gain.value if stopped == "slower" else gain.value
        return [f"{name} measured {factor:.1f}x {stopped} after one round: not measured further"]
    if stopped == "budget":
        return [
            f"{name} probe cut short by the time budget of {budget_s:g} s after "
            f"{rounds} round(s): {gain.text()}"
        ]
    return []


@contextlib.contextmanager
def monitoring(enabled: bool, notes: list[str]) -> Iterator[dict[str, float]]:
    """Samples TensorFlow's GPUs during the body; the dict given is filled with
    `Sampler.aggregate()` on exit (`gpu0_*` is `/GPU:0`). Failures are notes."""
    aggregate: dict[str, float] = {}
    sampler = None
    if enabled:
        with noted(notes, "GPU monitor not started: {error}"):
            from tfgpu._internal.adapters import devices
            from tfgpu.monitor import Sampler

            started = Sampler(interval=0.1, gpus=devices.cuda_indices(None))
            started.start()
            sampler = started
    try:
        yield aggregate
    finally:
        if sampler is not None:
            with noted(notes, "GPU monitor failed: {error}"):
                sampler.stop()
                aggregate.update(sampler.aggregate())


@contextlib.contextmanager
def noted(notes: list[str], note: str) -> Iterator[None]:
    """Runs the body; if it raises, `note` (its `{error}` filled in) goes to `notes` instead."""
    try:
        yield
    except Exception as e:  # the diagnosis's one catch-all: a failed probe or side check
        # (the user's model, TensorFlow, NVML: any error) is a note, never a crash
        notes.append(note.format(error=one_line(e)))
