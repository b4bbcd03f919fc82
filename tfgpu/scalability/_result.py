"""What `scaling()` returns and writes: a point per replica count and mode, with the step's
parts and its reason; the cost model's predictions; `scaling.json` and `scaling.png`."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.stats import format_bytes
from tfgpu._internal.measure.result import Result, save_figure
from tfgpu._internal.measure.rules import ALL_REDUCE_SHARE, INPUT_SHARE, Gain
from tfgpu.scalability._cost import ring_s

SHARED_CORES = (
    "{kind}s share this machine's cores, so more replicas add no compute: this run checks "
    "the mechanics (the step's parts, the all-reduce, the update, the input) and calibrates "
    "the prediction; it does not show a GPU's speedup"
)

# A point at this efficiency or above scales; below, the first other reason that holds.
EFFICIENT = 0.9


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.1f}"


@dataclasses.dataclass
class Point:
    """One replica count and mode, measured: the table's row (its columns: docs/scaling.md,
    "Reading the table"); seconds per step, None where not measured.

    Attributes:
        replicas: int, replicas in sync.
        mode: str, `"weak"`, `"strong"`, or `"both"` (one replica: the reference of both).
        global_batch: int, examples per step, all replicas together.
        per_replica_batch: int, examples per replica per step.
        step_s, examples_per_s: float or None, of `fit` (the median of the rounds).
        speedup: `Gain` or None, examples/s against one replica, with its interval.
        efficiency: float or None, speedup / replicas (1.0: linear).
        compute_s, all_reduce_s, update_s, input_s: float or None, the step's parts, timed
            apart.
        input_wait_s, other_s: float or None, the wait for the input; the rest of the step.
        reason, fix: str, why it scales as it does, in one line; what to change ("": nothing).
        error: str, why it could not be timed ("" when it was).
    """

    replicas: int
    mode: str
    global_batch: int
    per_replica_batch: int
    step_s: float | None
    examples_per_s: float | None
    speedup: Gain | None = None
    compute_s: float | None = None
    all_reduce_s: float | None = None
    input_s: float | None = None
    update_s: float | None = None
    error: str = ""
    efficiency: float | None = None
    input_wait_s: float | None = None
    other_s: float | None = None
    reason: str = ""
    fix: str = ""

    def explain(self, base: Point, device_kind: str, gradient_bytes: int) -> None:
        """Fills efficiency, the step's split, the reason and the fix, against `base` (one
        replica), by the first rule of `_REASONS` that holds. Pure."""
        if self.speedup is not None:
            self.efficiency = self.speedup.value / self.replicas
        busy = None
        if self.compute_s is not None and self.all_reduce_s is not None:
            busy = self.compute_s + self.all_reduce_s + (self.update_s or 0.0)
        if self.step_s and busy is not None:
            self.input_wait_s = 0.0 if self.input_s is None else max(0.0, self.input_s - busy)
            self.other_s = max(0.0, self.step_s - busy - self.input_wait_s)
        if self.replicas == 1:
            timed = "the reference: one replica"
            self.reason = timed if self.step_s else "not timed: the budget ran out first"
        elif self.error:
            self.reason = f"not timed: {self.error}"
        elif self.efficiency is None or not self.step_s:
            self.reason = "not timed: the budget ran out first"
        else:
            why = _Why(self, base, device_kind, gradient_bytes)
            self.reason, self.fix = next(r for rule in _REASONS if (r := rule(why)) is not None)


@dataclasses.dataclass(frozen=True)
class _Why:
    """A timed point beside its one-replica base: what the reasons read."""

    p: Point
    base: Point
    device_kind: str
    gradient_bytes: int

    @property
    def eff(self) -> str:
        return f"{self.p.efficiency:.0%} of linear"

    def excess(self) -> dict[str, float]:
        """What grew with the replicas past its ideal (weak: as on one replica; strong: 1/n
        of it): the compute, the update, the rest of the step."""
        ideal = 1.0 if self.p.mode == "weak" else 1.0 / self.p.replicas
        return {
            "compute": _excess(self.p.compute_s, self.base.compute_s, ideal),
            "update": _excess(self.p.update_s, self.base.update_s, ideal),
            "other": _excess(self.p.other_s, self.base.other_s, ideal),
        }

    def grew(self, part: str) -> bool:
        excess = self.excess()
        return max(excess, key=lambda k: excess[k]) == part and excess[part] > 0


Reason = tuple[str, str] | None  # (the reason, the fix) where a rule holds


def _scales(w: _Why) -> Reason:
    return (f"scales: {w.eff}", "") if (w.p.efficiency or 0.0) >= EFFICIENT else None


def _input_bound(w: _Why) -> Reason:
    p = w.p
    waits = p.input_wait_s is not None and p.input_wait_s >= INPUT_SHARE * (p.step_s or 0.0)
    if not (p.input_s and waits):
        return None
    return (
        f"input-bound ({w.eff}): the pipeline alone delivers {p.global_batch / p.input_s:,.0f} "
        f"examples/s, {_ms(p.input_s)} ms per global batch of {p.global_batch}",
        "feed the replicas faster: `tfgpu.data.pipeline` (parallel map, cache, prefetch), a "
        "source other than a Python generator, or tf.data service workers "
        "(docs/data_service.md)",
    )


def _all_reduce_bound(w: _Why) -> Reason:
    p = w.p
    if p.all_reduce_s is None or p.all_reduce_s < ALL_REDUCE_SHARE * (p.step_s or 0.0):
        return None
    return (
        f"all-reduce-bound ({w.eff}): {format_bytes(w.gradient_bytes)} of gradients take "
        f"{_ms(p.all_reduce_s)} ms of a {_ms(p.step_s)} ms step",
        "more compute per all-reduce: a larger per-replica batch (the gradients keep their "
        "size); `tfgpu.tune` tries the other `all_reduce` implementations; between GPUs, "
        "peer-to-peer links (NVLink) over PCIe through the host",
    )


def _update_bound(w: _Why) -> Reason:
    if not w.grew("update"):
        return None
    shared = f"; {w.device_kind}s do it on the shared cores" if w.device_kind != "GPU" else ""
    return (
        f"update-bound ({w.eff}): updating every replica's copy of the weights takes "
        f"{_ms(w.p.update_s)} ms of a {_ms(w.p.step_s)} ms step",
        "more examples per update: a larger per-replica batch (weak scaling); a cheaper "
        f"optimizer, or `jit_compile=True` to fuse the update{shared}",
    )


def _host_bound(w: _Why) -> Reason:
    if not w.grew("other"):
        return None
    return (
        f"host-bound ({w.eff}): {_ms(w.p.other_s)} ms of a {_ms(w.p.step_s)} ms step is neither "
        "compute, all-reduce nor update (Python, kernel launches, `fit`'s host work)",
        "more steps per call: `model.compile(..., steps_per_execution=16)`",
    )


def _compute(w: _Why) -> Reason:
    """What is left: shared cores, too little work per GPU, or GPUs that slow each other."""
    p = w.p
    if w.device_kind != "GPU":
        return f"shared cores ({w.eff}): see the note", ""
    if p.mode == "strong":
        return (
            f"per-replica batch too small ({w.eff}): {p.per_replica_batch} examples per replica "
            f"compute in {_ms(p.compute_s)} ms, not 1/{p.replicas} of {_ms(w.base.compute_s)} ms",
            "keep the per-replica batch (weak scaling): `batch_size="
            "tfgpu.global_batch_size(per_replica, strategy)` with `tfgpu.scale_learning_rate`",
        )
    return (
        f"compute slows with more replicas ({w.eff}): the GPUs slow each other",
        "check the host's threads and the GPUs' clocks (`tfgpu.callbacks.GPUMonitor`)",
    )


# The reasons of a point below linear, the first that holds (the last always does).
_REASONS = (_scales, _input_bound, _all_reduce_bound, _update_bound, _host_bound, _compute)


def _excess(part: float | None, base: float | None, ideal: float) -> float:
    """Seconds `part` exceeds `ideal` times the one-replica `base` (0 when unknown)."""
    if part is None or base is None:
        return 0.0
    return part - ideal * base


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The cost model's step for `replicas` in all (over `machines` machines), calibrated on
    the 1- and 2-replica measurements. Attributes as `Point`'s; `efficiency` against the
    measured one replica."""

    replicas: int
    machines: int
    mode: str
    global_batch: int
    step_s: float
    examples_per_s: float
    efficiency: float
    compute_s: float
    all_reduce_s: float
    input_s: float
    update_s: float


@dataclasses.dataclass
class ScalingResult(Result):
    """What `tfgpu.scaling()` measured and predicted; print it for the table.

    The guide: docs/scaling.md, "Reading the table" and "The cost model".

    Attributes:
        points: list of `Point`, one replica first, then each count weak and strong.
        predictions: list of `Prediction` (more replicas, more machines).
        prediction_errors: dict, `"4 weak"` -> predicted / measured step - 1.
        gradient_bytes: int, bytes of one step's gradients.
        device_kind: str, `"GPU"` or `"logical CPU device"`.
        all_reduce: str, the all-reduce in use, as `tfgpu.strategy(all_reduce=)` names it.
        link: the link between the devices (`kind`, `description`, `bandwidth_bytes_s`,
            `peer_to_peer`), or None where NVML cannot say.
        notes: list of str, what was skipped and why.
        time_s: float, seconds the call took.
    """

    points: list[Point]
    predictions: list[Prediction]
    prediction_errors: dict[str, float]
    gradient_bytes: int
    device_kind: str
    all_reduce: str
    link: Any
    notes: list[str]
    time_s: float = math.nan

    json_name = "scaling.json"
    png_name = "scaling.png"

    def headline(self) -> str:
        """The worst measured efficiency and its reason, in one line."""
        timed = [p for p in self.points if p.replicas > 1 and p.efficiency is not None]
        if not timed:
            return "nothing beyond one replica was timed"
        worst = min(timed, key=lambda p: p.efficiency or 0.0)
        return f"{worst.replicas} replicas, {worst.mode}: {worst.reason}"

    def all_reduce_floor_s(self, replicas: int) -> float | None:
        """The least all-reduce seconds per step a ring over the link allows (None: unknown)."""
        bandwidth = getattr(self.link, "bandwidth_bytes_s", None)
        if self.device_kind != "GPU" or not bandwidth or replicas < 2:
            return None
        return ring_s(replicas, self.gradient_bytes, bandwidth)

    def __str__(self) -> str:
        link = getattr(self.link, "description", "unknown")
        lines = [
            f"Scaling on {self.device_kind}s: {format_bytes(self.gradient_bytes)} of gradients per step, "
            f"all-reduce {self.all_reduce or '-'}, link: {link}",
            "",
            f"{'replicas':>8} {'mode':<6} {'batch':>6} {'examples/s':>11} {'speedup':>20} "
            f"{'eff.':>5} {'step ms':>8} {'compute':>8} {'all-red.':>8} {'update':>7} "
            f"{'input':>7} {'wait':>6} {'other':>6}  reason",
        ]
        fixes: set[str] = set()
        for p in self.points:
            eps = "-" if p.examples_per_s is None else f"{p.examples_per_s:,.0f}"
            sp = "-" if p.speedup is None else f"x{p.speedup.value:.2f}"
            if p.speedup is not None and p.replicas > 1:
                sp += f" ({p.speedup.low:.2f}-{p.speedup.high:.2f})"
            eff = "-" if p.efficiency is None else f"{p.efficiency:.0%}"
            lines.append(
                f"{p.replicas:>8} {p.mode:<6} {p.global_batch:>6} {eps:>11} {sp:>20} {eff:>5} "
                f"{_ms(p.step_s):>8} {_ms(p.compute_s):>8} {_ms(p.all_reduce_s):>8} "
                f"{_ms(p.update_s):>7} {_ms(p.input_s):>7} {_ms(p.input_wait_s):>6} "
                f"{_ms(p.other_s):>6}  {p.reason}"
            )
            if p.fix:
                lines.append(f"{'':>8} fix: {'as above' if p.fix in fixes else p.fix}")
                fixes.add(p.fix)
        if self.predictions:
            lines += ["", "Predicted (cost model calibrated on 1 and 2 replicas; docs/scaling.md):"]
            for q in self.predictions:
                machines = f" on {q.machines} machines" if q.machines > 1 else ""
                floor = self.all_reduce_floor_s(q.replicas) if q.machines == 1 else None
                bound = "" if floor is None else f", the link allows >= {_ms(floor)} ms"
                lines.append(
                    f"  {q.replicas} replicas{machines}, {q.mode}: {q.examples_per_s:,.0f} "
                    f"examples/s, {q.efficiency:.0%} of linear (step {_ms(q.step_s)} ms: "
                    f"compute {_ms(q.compute_s)}, all-reduce {_ms(q.all_reduce_s)}{bound}, "
                    f"update {_ms(q.update_s)}, input {_ms(q.input_s)})"
                )
        if self.prediction_errors:
            errors = ", ".join(f"{k} {v:+.0%}" for k, v in self.prediction_errors.items())
            lines.append(f"  prediction vs measured here: {errors}")
        if self.device_kind != "GPU" and any(p.replicas > 1 for p in self.points):
            lines.append(f"note: {SHARED_CORES.format(kind=self.device_kind)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def plot(self, path: Path) -> None:
        """Examples/s and efficiency against replicas, measured and predicted, into `path`."""
        from matplotlib.figure import Figure  # no pyplot: the user's backend is left alone

        fig = Figure(figsize=(9.0, 3.6))
        rate_ax, eff_ax = fig.subplots(1, 2)
        base = next((p for p in self.points if p.replicas == 1), None)
        for mode, color in (("weak", "tab:blue"), ("strong", "tab:orange")):
            measured = [base, *(p for p in self.points if p.mode == mode)] if base else []
            measured = [p for p in measured if p and p.examples_per_s]
            predicted = [q for q in self.predictions if q.mode == mode and q.machines == 1]
            for points, style, what in (
                (measured, "o-", "measured"),
                (predicted, "x--", "predicted"),
            ):
                if not points:
                    continue
                xs = [p.replicas for p in points]
                effs = [1.0 if p.replicas == 1 else p.efficiency for p in points]
                for ax, ys in ((rate_ax, [p.examples_per_s for p in points]), (eff_ax, effs)):
                    ax.plot(xs, ys, style, color=color, label=f"{mode}, {what}")
        eff_ax.axhline(1.0, color="tab:gray", linewidth=0.8)
        for ax, ylabel in ((rate_ax, "examples/s"), (eff_ax, "efficiency (1 = linear)")):
            ax.set(xlabel="replicas", ylabel=ylabel)
            if ax.get_legend_handles_labels()[0]:  # nothing drawn: no legend to say so
                ax.legend(fontsize=7)
        fig.suptitle(f"scaling on {self.device_kind}s", fontsize=10)
        save_figure(fig, path)
