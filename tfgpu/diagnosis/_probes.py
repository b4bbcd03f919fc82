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
from tfgpu.diagnosis._facts import MAX_ROUNDS, PROBE_MAX_ROUNDS, ROUNDS_BUDGET_SHARE
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
) -> tuple[list[tuple[float, float]], str | None]:
    """Per-round step times (baseline, variant) with `attrs` set on the model, by
    `timing.interleave`; each round is announced as a `progress` phase."""
    variant = protocol.with_attrs(model, dataset, steps, warmup, attrs)
    if progress is not None:
        variant = _announced(variant, progress, label, max_rounds)
    return protocol.interleave(
        protocol.with_attrs(model, dataset, steps, warmup, {}),
        variant,
        threshold=threshold,
        budget=budget,
        max_rounds=max_rounds,
        timed_units=max(6, steps),
    )


def _announced(run: protocol.Run, progress: Progress, label: str, most: int) -> protocol.Run:
    """`run`, showing "`label`, round k of at most `most`" before each call (the protocol
    runs the variant first in each round)."""
    calls = [0]

    def announced(deadline: float | None, limit: float | None) -> float | None:
        calls[0] += 1
        progress.phase(f"{label}, round {calls[0]} of at most {most}")
        return run(deadline, limit)

    return announced


def device_dataset(batch, on_gpu: bool):
    ds = tf.data.Dataset.from_tensors(batch).repeat()
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
    if stopped == "slower":
        return [f"{name} measured {1 / gain:.1f}x slower after one round: not measured further"]
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
    share is clear of the thresholds or `ROUNDS_BUDGET_SHARE` of the budget is spent."""
    progress = progress or Progress(0, title="diagnose")
    repeated = ds.repeat()
    progress.phase("warming up on the real data")
    _warm_real(model, ds, repeated, budget)
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
            # The first real run, like the first device-resident one, runs in full.
            first_real = kind == "real" and calls[kind] == 1
            return protocol.fit_step_time(
                model, dataset, steps, warmup, None if first_real else deadline
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


def run_probe(
    model: Any,
    device_ds: Any,
    steps: int,
    warmup: int,
    budget: protocol.Budget,
    *,
    setting: str,
    current: Any,
    value: Any,
    threshold: float,
    failed: str,
    progress: Progress | None = None,
) -> Probe:
    """Times the device-resident step with `setting` = `value` against `current`, in rounds;
    skipped when the budget is spent; an error is the note `failed`, never a crash."""
    base_name, name = f"{setting}={current}", f"{setting}={value}"
    if budget.left() <= 0:
        return Probe(skipped=f"the {name} probe")
    failure: list[str] = []
    with noted(failure, failed.format(name=name, error="{error}")):
        rounds, stopped = _compare(
            model,
            device_ds,
            steps,
            warmup,
            {setting: value},
            threshold=threshold,
            budget=budget,
            progress=progress,
            label=f"trying {name} against {current}",
        )
    if failure:
        return Probe(notes=failure)
    return Probe(
        rounds=rounds,
        record=_probe_record(base_name, name, rounds, stopped),
        notes=_probe_notes(name, rounds, stopped, budget.seconds),
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
