"""What `find_batch_size` returns (`BatchSizeTrial`, `BatchSizeResult`), built by `build_result`;
every batch size is global, as `fit` takes it, per-replica figures are `per_replica_*`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tfgpu._internal.measure.result import Result
from tfgpu.batch_size._search import accumulation_plan


@dataclass(frozen=True)
class BatchSizeTrial:
    """One trial of the batch-size search.

    Args:
        batch_size: int, the global batch size tried (what `fit(batch_size=)` takes).
        per_replica_batch_size: int, `batch_size` over the strategy's replicas.
        fits: bool, whether the steps ran without OOM and within the memory budget.
        reason: str, `"ok"`, `"oom"`, `"host_oom"` (a `MemoryError` building the batch),
            `"over_budget"` or `"oom_on_another_worker"`.
        peak_memory_bytes: int or None, peak device memory during the trial (None where
            TensorFlow keeps no allocator statistics for the device).
        step_time_s: float, median seconds per step (NaN when it did not fit).
        examples_per_s: float, examples per second, all replicas (NaN when it did not fit).
    """

    batch_size: int
    per_replica_batch_size: int
    fits: bool
    reason: str
    peak_memory_bytes: int | None
    step_time_s: float
    examples_per_s: float


@dataclass
class BatchSizeResult(Result):
    """What `find_batch_size` found. Batch sizes are global, as `fit(batch_size=)` takes them.

    Args:
        largest: int or None, the largest batch size that fitted (None if none).
        fastest: int or None, the batch size with the highest throughput.
        per_replica_largest: int or None, `largest` over the replicas.
        per_replica_fastest: int or None, `fastest` over the replicas.
        replicas: int, replicas in sync under the strategy (1 without one).
        trials: list of `BatchSizeTrial`, in the order they ran.
        memory_budget_bytes: int or None, the peak-memory limit applied (None: OOM only).
        device: str, the device whose memory was measured, e.g. `"GPU:0"`.
        target_batch_size: int or None, the batch per optimizer update that was asked for.
        gradient_accumulation_steps: int or None, steps to accumulate to reach the target
            (pass to the Keras optimizer as `gradient_accumulation_steps=`).
        accumulation_batch_size: int or None, the batch size to `fit` with it.
        in_subprocess: bool, whether the trials ran in a separate Python process.
        notes: list of str, remarks (e.g. that a subprocess was used, and why).
        memory_source: str or None, `"allocator"`, or None: not measured (out of memory only).
        stopped_by: str, why the search ended: `"limit"` (it found the boundary),
            `"max_batch_size"`, `"max_trials"`, `"time_budget"` or `"nothing_fits"`.
        time_s: float, seconds the call took.
    """

    largest: int | None
    fastest: int | None
    per_replica_largest: int | None
    per_replica_fastest: int | None
    replicas: int
    trials: list[BatchSizeTrial]
    memory_budget_bytes: int | None
    device: str
    target_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    accumulation_batch_size: int | None = None
    in_subprocess: bool = False
    notes: list[str] = field(default_factory=list)
    memory_source: str | None = None
    stopped_by: str = "limit"
    time_s: float = math.nan

    json_name = "batch_size.json"

    def __str__(self) -> str:
        lines = [
            f"Batch size ({self.replicas} replica(s), device {self.device}; global, as "
            "fit(batch_size=) takes it):",
            f"  largest that fits: {self.largest}{self._per_replica(self.per_replica_largest)}"
            + {
                "max_batch_size": " - not a limit: every size tried fitted",
                "max_trials": " - not a limit: the search ran out of trials",
                "time_budget": " - not a limit: the time budget ran out",
            }.get(self.stopped_by, ""),
            f"  fastest:           {self.fastest}{self._per_replica(self.per_replica_fastest)}",
        ]
        if self.memory_budget_bytes is not None:
            lines.append(f"  memory budget:     {self.memory_budget_bytes / 2**20:.1f} MiB")
        if self.memory_source is None:
            lines.append("  peak memory:       not measured (out-of-memory errors only)")
        if self.gradient_accumulation_steps is not None:
            lines.append(
                f"  to reach a batch of {self.target_batch_size} per update: batch_size="
                f"{self.accumulation_batch_size} with "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}"
            )
        lines.append("  trials:")
        for t in self.trials:
            mem = "-" if t.peak_memory_bytes is None else f"{t.peak_memory_bytes / 2**20:.1f} MiB"
            speed = f"{t.examples_per_s:,.0f} ex/s" if t.fits else t.reason
            lines.append(f"    {t.batch_size:>6}  peak {mem:>12}  {speed}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _per_replica(self, size: int | None) -> str:
        return "" if self.replicas == 1 or size is None else f" ({size} per replica)"


def build_result(
    trials: list[BatchSizeTrial],
    replicas: int,
    budget: int | None,
    device: str,
    target: int | None,
    notes: list[str],
    *,
    memory_source: str | None = None,
    stopped_by: str = "limit",
) -> BatchSizeResult:
    """The result of a search's `trials` (its notes on why it ended included)."""
    fitting = [t.batch_size for t in trials if t.fits]
    largest = max(fitting) if fitting else None
    timed = [t for t in trials if t.fits and not math.isnan(t.examples_per_s)]
    fastest = max(timed, key=lambda t: t.examples_per_s).batch_size if timed else None
    notes = list(notes)
    if largest is None:
        notes.append("no batch size fitted, not even the smallest tried")
    elif stopped_by == "max_batch_size":
        notes.append(
            f"every size tried fitted, up to max_batch_size={largest}: the memory limit lies "
            "above it (raise max_batch_size to find it)"
        )
    elif stopped_by in ("max_trials", "time_budget"):
        failed = [t.batch_size for t in trials if not t.fits]
        above = f"{min(failed)}" if failed else "max_batch_size"
        why = "ran out of time (time_budget_s)"
        if stopped_by == "max_trials":
            why = f"ran out of trials (max_trials={len(trials)})"
        notes.append(
            f"the search {why} before narrowing down: the largest size that fits lies "
            f"between {largest} and {above}"
        )
    steps = accumulation = None
    if target is not None and fastest is not None:
        steps, per_replica = accumulation_plan(target, fastest // replicas, replicas)
        accumulation = per_replica * replicas
    return BatchSizeResult(
        largest=largest,
        fastest=fastest,
        per_replica_largest=None if largest is None else largest // replicas,
        per_replica_fastest=None if fastest is None else fastest // replicas,
        replicas=replicas,
        trials=trials,
        memory_budget_bytes=budget,
        device=device,
        target_batch_size=target,
        gradient_accumulation_steps=steps,
        accumulation_batch_size=accumulation,
        notes=notes,
        memory_source=memory_source,
        stopped_by=stopped_by,
    )


def trial_from_dict(d: dict[str, Any]) -> BatchSizeTrial:
    """A trial from its `to_dict()` record (null figures are NaN again)."""
    figures = {k: math.nan for k in ("step_time_s", "examples_per_s") if d.get(k) is None}
    return BatchSizeTrial(**{**d, **figures})
