"""The pieces of `diagnose`'s measuring protocol: how long each fit may run (`fit_plan`), the
warm-up on the real data, a probe's outcome, record and notes, the GPU monitor around the
rounds, and the failures of side checks as notes (`noted`)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.datasets import cardinality
from tfgpu._internal.helpers.warn import one_line
from tfgpu._internal.measure import timing
from tfgpu._internal.measure.rules import Gain, medians
from tfgpu._internal.measure.variants import DEVICE_RESIDENT
from tfgpu.diagnosis._facts import FIT_SHARE

# The variant without its input pipeline: one batch held in device memory.
DEVICE = {DEVICE_RESIDENT: True}


def fit_plan(
    left_s: float, budget_s: float | None, step_s: float | None, fits: int, warmup: int, spe: int
) -> tuple[int, float | None]:
    """(warm-up steps, seconds of timed steps) for each of the next `fits` fits of steps of
    `step_s` (None: not known yet): timed for at most `FIT_SHARE` of the budget; where such
    fits would not end within `left_s`, one warm-up step (the engine's least: two calls of
    `spe` steps) and fewer timed steps, at least one call. Pure."""
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


def warm_real(model: Any, ds: tf.data.Dataset, budget: timing.Budget) -> None:
    """One untimed pass over the real data's first epoch (at most 64 batches), so that every
    batch shape is traced outside the timed runs; an infinite dataset is not warmed here."""
    try:
        n = cardinality(ds)
    except tf.errors.OpError:
        n = None
    if not n or n < 0:
        return
    spe = max(1, int(model.steps_per_execution))
    steps = min(64, max(1, math.ceil(n / spe)) + 1) * spe
    timing.fit_once(model, ds.repeat(), timing.Timer(0, budget.deadline, None), steps=steps)


@dataclass
class Probe:
    """One probe's outcome: its rounds, its record, its notes, what the budget left out (e.g.
    "the jit_compile=True probe") and why it stopped early ("slower", "faster", "budget")."""

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
