"""The demo's figures: what each side measured, what must be equal, and the printed table.
Pure: nothing here touches TensorFlow, Keras or the disk."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tfgpu._internal.helpers.stats import mean, median


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a side trained (read after `fit`): what must be equal on both sides."""

    global_batch: int
    steps_trained: int
    learning_rate: dict[str, Any]  # the schedule's config (without its name), or {"value": lr}
    initial_weights_sha256: str


@dataclasses.dataclass(frozen=True)
class Figures:
    """One side's figures, as stored in `demo.json` and printed in the table. Steady-state ones
    leave out the first epoch (tracing, cache filling) if there are more; one not measured: None."""

    examples_per_s: float | None
    step_time_s: float | None
    input_wait_share: float | None  # from tfgpu.diagnose() on this side
    gpu_util_pct: float | None
    mfu: float | None
    host_cpu_pct: float | None
    train_time_s: float  # wall time of all epochs
    train_accuracy: list[float]  # per epoch
    test_accuracy: float


@dataclasses.dataclass(frozen=True)
class Speedups:
    """tfgpu over naive: by wall time of all epochs, and by steady-state examples/s."""

    wall_time: float | None
    examples_per_s: float | None


def side_figures(
    history: Mapping[str, Sequence[float]],
    *,
    wall_time_s: float,
    test_accuracy: float,
    input_wait_share: float | None,
    on_gpu: bool,
) -> Figures:
    """The figures of one side, from its Keras history (`History.history`) and measurements."""

    def steady(key: str, stat: Callable[[Iterable[Any]], float] = median) -> float | None:
        """Over the epochs after the first (tracing, cache filling), or the only one."""
        values = list(history.get(key, []))
        value = stat(values[1:] if len(values) > 1 else values)
        return None if math.isnan(value) else value

    return Figures(
        examples_per_s=steady("examples_per_s"),
        step_time_s=steady("step_time_median_s"),
        input_wait_share=input_wait_share,
        gpu_util_pct=steady("gpu_util_pct_mean", mean) if on_gpu else None,
        mfu=steady("mfu") if on_gpu else None,
        host_cpu_pct=steady("host_cpu_pct_mean", mean),
        train_time_s=wall_time_s,
        train_accuracy=[float(a) for a in history.get("accuracy", [])],
        test_accuracy=test_accuracy,
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def speedups(naive: Figures, tuned: Figures) -> Speedups:
    return Speedups(
        wall_time=_ratio(naive.train_time_s, tuned.train_time_s),
        examples_per_s=_ratio(tuned.examples_per_s, naive.examples_per_s),
    )


# How the table shows each kind of figure.
_FORMATS: dict[str, Callable[[float], str]] = {
    "rate": "{:,.0f}".format, "ms": lambda value: f"{value * 1e3:.1f} ms",
    "share": "{:.0%}".format, "gpu": "{:.0f}%".format, "pct": "{:.0f}%".format,
    "mfu": "{:.1%}".format, "s": "{:.1f} s".format, "acc": "{:.3f}".format, "x": "{:.2f}x".format,
}  # fmt: skip


def _fmt(value: float | None, kind: str, on_gpu: bool = True) -> str:
    if kind in ("gpu", "mfu") and not on_gpu:
        return "n/a (no GPU)"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return _FORMATS[kind](value)


def format_table(naive: Figures, tuned: Figures, *, on_gpu: bool, epochs: int) -> str:
    """The side-by-side table printed at the end (and stored in `demo.json`)."""
    speed = speedups(naive, tuned)
    rows = [
        ("examples/s (steady state)", "examples_per_s", "rate"),
        ("step time (median)", "step_time_s", "ms"),
        ("input-wait share", "input_wait_share", "share"),
        ("GPU utilization", "gpu_util_pct", "gpu"),
        ("MFU", "mfu", "mfu"),
        ("host CPU", "host_cpu_pct", "pct"),
        (f"train time ({epochs} epochs)", "train_time_s", "s"),
        ("final accuracy (test)", "test_accuracy", "acc"),
    ]
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{'':<{width}}{'naive':>16}{'tfgpu':>16}"]
    for label, key, kind in rows:
        a, b = (_fmt(getattr(side, key), kind, on_gpu) for side in (naive, tuned))
        lines.append(f"{label:<{width}}{a:>16}{b:>16}")
    lines.append(
        f"{'speedup':<{width}}{'1.00x':>16}{_fmt(speed.wall_time, 'x'):>16}"
        f"   (wall time; {_fmt(speed.examples_per_s, 'x')} by examples/s)"
    )
    return "\n".join(lines)


def waterfall_lines(result: Any, *, width: int = 30) -> list[str]:
    """`tfgpu.tune`'s waterfall (a `TuneResult`) as text, one line per bar of `width` at most:
    the baseline, each kept setting's step (scaled by its log-gain to end at the verified
    total, as in `tune.png`: docs/tuning.md) with its gain as measured, and the total."""
    base = result.baseline_examples_per_s
    if base is None or not math.isfinite(base) or base <= 0:
        return ["(tune could not time the baseline within its budget: nothing measured)"]
    kept = [
        (t.name, float(t.gain.value))
        for t in result.trials
        if t.status == "kept" and t.gain and math.isfinite(t.gain.value) and t.gain.value > 0
    ]
    total = math.fsum(math.log(g) for _, g in kept)
    speedup = result.speedup.value if math.isfinite(result.speedup.value) else 1.0
    scale = math.log(speedup) / total if total > 0 and speedup > 1 else 0.0
    rows: list[tuple[str, float, str]] = [("baseline", base, "")]
    level = base
    for name, gain in kept:
        level *= math.exp(math.log(gain) * scale)
        rows.append((f"+ {name}", level, f"measured x{gain:.2f} against the best before it"))
    tuned = result.tuned_examples_per_s
    if tuned is None or not math.isfinite(tuned):
        tuned = base
    how = "verified together" if result.verified else "not verified together"
    rows.append((f"tuned ({how})", tuned, result.speedup.text()))
    top = max(value for _, value, _ in rows)
    label_width = max(len(label) for label, _, _ in rows)
    lines = []
    for label, value, note in rows:
        bar = "#" * max(1, round(width * value / top))
        lines.append(
            f"{label:<{label_width}}  {value:>10,.0f} ex/s  {bar:<{width}}  {note}".rstrip()
        )
    return lines
