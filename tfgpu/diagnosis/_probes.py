"""The measuring protocol on the timing engine (`_internal.adapters.timing`): `measure_rounds`
alternates a device-resident batch and the real data, `run_probe` a compile setting's two
values; the failures of side checks become notes (`noted`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters import timing as protocol
from tfgpu._internal.adapters.datasets import cardinality
from tfgpu._internal.helpers.progress import Progress
from tfgpu._internal.helpers.warn import one_line
from tfgpu.diagnosis._facts import (
    CLEARLY_FASTER,
    FIT_SHARE,
    MAX_ROUNDS,
    PROBE_MAX_ROUNDS,
    ROUNDS_BUDGET_SHARE,
)
from tfgpu.diagnosis._rounds import share_verdict


def _compare(
    model,
    dataset,
    steps,
    warmup,
    attrs: dict[str, Any],
    *,
    threshold: float = 1.0,
    budget: protocol.Budget | None = None,
    max_rounds: int = PROBE_MAX_ROUNDS,
    progress: Progress | None = None,
    label: str = "",
    limit: float | None = None,
    first_base: float | None = None,
) -> tuple[list[tuple[float, float]], str | None]:
    """Per-round step times (baseline, variant) with `attrs` set on the model, by
    `timing.compare` (`first_base`: the baseline's first round, measured already); each fit's
    timed steps stop after `limit` seconds too; each round is announced as a `progress` phase."""
    base, variant = (
        _limited(protocol.with_attrs(model, dataset, steps, warmup, a), limit) for a in ({}, attrs)
    )
    if progress is not None:
        variant = _announced(variant, progress, label, max_rounds)
    c = protocol.compare(
        base,
        {"variant": variant},
        threshold=threshold,
        budget=budget,
        max_rounds=max_rounds,
        timed_units=max(6, steps),
        first_base=first_base,
    )["variant"]
    return c.rounds, c.stopped


def _limited(run: protocol.Run, limit: float | None) -> protocol.Run:
    """`run` with its timed steps stopped after `limit` seconds too (None: as it is)."""
    if limit is None:
        return run
    return lambda deadline, most: run(deadline, limit if most is None else min(most, limit))


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
    warm_calls, _ = protocol.call_counts(spe, 1, warmup)
    if warm_calls * call_s + most <= left_s / fits:
        return warmup, most
    return 1, max(0.5 * call_s, min(most, left_s / fits - 2 * call_s))


def _announced(run: protocol.Run, progress: Progress, label: str, most: int) -> protocol.Run:
    """`run`, showing "`label`, round k of at most `most`" before each call (the protocol
    runs the variant first in each round)."""
    calls = [0]

    def announced(deadline: float | None, limit: float | None) -> float | None:
        calls[0] += 1
        progress.phase(f"{label}, round {calls[0]} of at most {most}")
        return run(deadline, limit)

    return announced


def device_dataset(batch, on_gpu: bool, spec=None):
    """`batch` repeated (prefetched to the GPU on GPUs), its shapes as the real data's
    `spec` has them (`None` dims), so that the real data's fits run the step traced here
    (and under XLA reuse the shapes compiled here)."""
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    if spec is not None:

        def relax(value, leaf):
            if not isinstance(leaf, tf.TensorSpec):
                return value
            return tf.raw_ops.PlaceholderWithDefault(input=value, shape=leaf.shape)

        def relaxed(*parts):
            element = parts if isinstance(spec, tuple) else parts[0]
            return tf.nest.map_structure(relax, element, spec)

        ds = ds.map(relaxed)
    if on_gpu:
        return ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0", buffer_size=2))
    return ds.prefetch(2)


def host_load() -> float | None:
    """The 1-minute load average per CPU core, or None where the OS does not say."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def _warm_real(model, ds, repeated, budget: protocol.Budget) -> None:
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
        repeated,
        epochs=1,
        steps_per_epoch=calls * spe,
        verbose=0,
        shuffle=False,
        callbacks=[protocol.Timer(0, budget.deadline, None)],
    )
    model.stop_training = False


def _probe_record(
    base_name: str, variant_name: str, rounds: list[tuple[float, float]], stopped: str | None
) -> dict[str, Any]:
    """A probe's measurements: median step times, the gain and its interval, the rounds."""
    gain, low, high = protocol.gain(rounds)
    base, variant = protocol.medians(rounds) if rounds else (None, None)
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
    gain, low, high = protocol.gain(rounds)
    if gain is None:
        return []
    if stopped in ("slower", "faster"):
        factor = 1 / gain if stopped == "slower" else gain
        return [f"{name} measured {factor:.1f}x {stopped} after one round: not measured further"]
    if stopped == "budget":
        return [
            f"{name} probe cut short by the time budget of {budget_s:g} s after "
            f"{len(rounds)} round(s): {gain:.2f}x ({low:.2f}x to {high:.2f}x)"
        ]
    return []


def measure_rounds(
    model: Any,
    ds: Any,
    device_ds: Any,
    first_compute: float | None,
    steps: int,
    warmup: int,
    budget: protocol.Budget,
    *,
    progress: Progress | None = None,
) -> list[tuple[float, float]]:
    """(device-resident, real) seconds per step, round after round, until the input-wait
    share is clear of the thresholds or `ROUNDS_BUDGET_SHARE` of the budget is spent; each
    fit as long as `fit_plan` allows for `MIN_ROUNDS` rounds."""
    progress = progress or Progress(0, title="diagnose")
    repeated = ds.repeat()
    progress.phase("warming up on the real data")
    _warm_real(model, ds, repeated, budget)
    spe = max(1, int(model.steps_per_execution))
    fits = 2 * protocol.MIN_ROUNDS - (first_compute is not None)
    warm, timed_s = fit_plan(budget.left(), budget.seconds, first_compute, fits, warmup, spe)
    rounds_until = (
        None if budget.seconds is None else budget.start + ROUNDS_BUDGET_SHARE * budget.seconds
    )
    shown: set[int] = set()
    calls = {"compute": 1 if first_compute is not None else 0, "real": 0}

    def timed(kind: str, dataset: Any) -> protocol.Run:
        def run(deadline: float | None, limit: float | None) -> float | None:
            calls[kind] += 1
            if calls[kind] not in shown:  # the round's first run says which round it is
                shown.add(calls[kind])
                progress.phase(
                    "timing the real data against a batch in memory, "
                    f"round {calls[kind]} of at most {MAX_ROUNDS}"
                )
            # The first real run, like the first device-resident one, ignores the deadline.
            first_real = kind == "real" and calls[kind] == 1
            return protocol.fit_step_time(
                model, dataset, steps, warm, None if first_real else deadline, timed_s
            )

        return run

    def done(rounds: list[tuple[float, float]]) -> bool:
        if share_verdict(rounds)["level"] != "inconclusive":
            return True
        return rounds_until is not None and protocol.now() >= rounds_until

    return protocol.compare(
        timed("compute", device_ds),
        {"real": timed("real", repeated)},
        budget=budget,
        max_rounds=MAX_ROUNDS,
        first_base=first_compute,
        done=done,
        clearly_slower=None,
    )["real"].rounds


@dataclass
class Probe:
    """One probe's outcome: its rounds, its record for `measurements`, its notes."""

    rounds: list[tuple[float, float]] = field(default_factory=list)
    record: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # what the budget left out, e.g. "the jit_compile=True probe"

    @property
    def final(self) -> bool:
        """Whether a first look settled it (or nothing more can be measured)."""
        return not self.rounds or (self.record or {}).get("stopped") in ("slower", "faster")


def run_probe(
    model: Any,
    device_ds: Any,
    steps: int,
    warmup: int,
    limit: float | None,
    *,
    budget: protocol.Budget,
    setting: str,
    current: Any,
    value: Any,
    threshold: float,
    failed: str,
    progress: Progress | None = None,
    needs_s: float = 0.0,
    first_base: float | None = None,
    earlier: list[tuple[float, float]] | None = None,
) -> Probe:
    """Times the device-resident step with `setting` = `value` against `current`, in rounds;
    skipped when less than `needs_s` of the budget is left; an error is the note `failed`,
    never a crash. With `first_base` (the baseline's step, measured already) one round only,
    final ("faster" or "slower") when it is clear; `earlier`: rounds of such a first look."""
    base_name, name = f"{setting}={current}", f"{setting}={value}"
    rounds: list[tuple[float, float]] = []
    stopped: str | None = None
    failure: list[str] = []
    if budget.left() > max(0.0, needs_s):
        with noted(failure, failed.format(name=name, error="{error}")):
            rounds, stopped = _compare(
                model,
                device_ds,
                steps,
                warmup,
                {setting: value},
                threshold=threshold,
                budget=budget,
                max_rounds=1 if first_base is not None else PROBE_MAX_ROUNDS,
                progress=progress,
                label=f"trying {name} against {current}",
                limit=limit,
                first_base=first_base,
            )
    elif not earlier:
        return Probe(skipped=f"the {name} probe")
    else:
        stopped = "budget"
    if failure and not earlier:
        return Probe(notes=failure)
    rounds = (earlier or []) + rounds
    gain = protocol.gain(rounds)[0]
    if first_base is not None and stopped is None and gain and gain >= CLEARLY_FASTER:
        stopped = "faster"
    return Probe(
        rounds=rounds,
        record=_probe_record(base_name, name, rounds, stopped),
        notes=failure + _probe_notes(name, rounds, stopped, budget.seconds),
    )


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
