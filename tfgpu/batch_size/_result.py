"""What `find_batch_size` returns: `BatchSizeTrial`, `BatchSizeResult` (text, JSON), and
`build_result`, which assembles one from the trials."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tfgpu.batch_size._search import accumulation_plan, pick_fastest

# The trial fields that are NaN when it did not fit: None in JSON.
NAN_AS_NONE = ("step_time_s", "examples_per_s")


@dataclass(frozen=True)
class BatchSizeTrial:
    """One trial of the batch-size search.

    Args:
        batch_size: int, the per-replica batch size tried.
        global_batch_size: int, `batch_size` times the number of replicas.
        fits: bool, whether the steps ran without OOM and within the memory budget.
        reason: str, `"ok"`, `"oom"` (`ResourceExhaustedError`), `"host_oom"` (the host
            ran out of memory building the batch: `MemoryError`), `"over_budget"` or
            `"oom_on_another_worker"`.
        peak_memory_bytes: int or None, peak device memory during the trial (None where
            TensorFlow keeps no allocator statistics for the device).
        step_time_s: float, median seconds per step (NaN when it did not fit).
        examples_per_s: float, global examples per second (NaN when it did not fit).
    """

    batch_size: int
    global_batch_size: int
    fits: bool
    reason: str
    peak_memory_bytes: int | None
    step_time_s: float
    examples_per_s: float


@dataclass(frozen=True)
class BatchSizeResult:
    """What `find_batch_size` found.

    Args:
        largest: int or None, the largest per-replica batch size that fitted (None if none).
        fastest: int or None, the per-replica batch size with the highest throughput.
        largest_global: int or None, `largest` times `num_replicas`.
        fastest_global: int or None, `fastest` times `num_replicas`.
        num_replicas: int, replicas in sync under the strategy (1 without one).
        trials: list of `BatchSizeTrial`, in the order they ran.
        memory_budget_bytes: int or None, the peak-memory limit applied (None: OOM only).
        device: str, the device whose memory was measured, e.g. `"GPU:0"`.
        target_global_batch_size: int or None, the global batch that was asked for.
        gradient_accumulation_steps: int or None, steps to accumulate to reach the target
            (pass to the Keras optimizer as `gradient_accumulation_steps=`).
        accumulation_batch_size: int or None, the per-replica batch to use with it.
        in_subprocess: bool, whether the trials ran in a separate Python process.
        notes: list of str, remarks (e.g. that a subprocess was used, and why).
        memory_source: str or None, `"allocator"` (TensorFlow's allocator statistics) or
            None (not measured: the search stopped at out-of-memory errors only).
        stopped_by: str, why the search ended: `"limit"` (it found the boundary),
            `"max_batch_size"` (every size fitted: the limit lies above), `"max_trials"`
            or `"nothing_fits"` (even batch size 1 failed).
    """

    largest: int | None
    fastest: int | None
    largest_global: int | None
    fastest_global: int | None
    num_replicas: int
    trials: list[BatchSizeTrial]
    memory_budget_bytes: int | None
    device: str
    target_global_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    accumulation_batch_size: int | None = None
    in_subprocess: bool = False
    notes: list[str] = field(default_factory=list)
    memory_source: str | None = None
    stopped_by: str = "limit"

    def to_dict(self) -> dict[str, Any]:
        """Returns the result as JSON-ready data."""
        d = asdict(self)
        for t in d["trials"]:
            for k in NAN_AS_NONE:
                if isinstance(t[k], float) and math.isnan(t[k]):
                    t[k] = None
        return d

    def __str__(self) -> str:
        lines = [
            f"Batch size (per replica, {self.num_replicas} replica(s), device {self.device}):",
            f"  largest that fits: {self.largest} (global {self.largest_global})"
            + {
                "max_batch_size": " - not a limit: every size tried fitted",
                "max_trials": " - not a limit: the search ran out of trials",
            }.get(self.stopped_by, ""),
            f"  fastest:           {self.fastest} (global {self.fastest_global})",
        ]
        if self.memory_budget_bytes is not None:
            lines.append(f"  memory budget:     {self.memory_budget_bytes / 2**20:.1f} MiB")
        if self.memory_source is None:
            lines.append("  peak memory:       not measured (out-of-memory errors only)")
        if self.gradient_accumulation_steps is not None:
            lines.append(
                f"  to reach global batch {self.target_global_batch_size}: batch_size="
                f"{self.accumulation_batch_size} per replica with "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}"
            )
        lines.append("  trials:")
        for t in self.trials:
            mem = "-" if t.peak_memory_bytes is None else f"{t.peak_memory_bytes / 2**20:.1f} MiB"
            speed = f"{t.examples_per_s:,.0f} ex/s" if t.fits else t.reason
            lines.append(f"    {t.batch_size:>6}  peak {mem:>12}  {speed}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def build_result(
    trials,
    replicas,
    budget,
    device,
    target,
    notes,
    in_subprocess=False,
    *,
    memory_source=None,
    stopped_by="limit",
):
    fitting = [t.batch_size for t in trials if t.fits]
    largest = max(fitting) if fitting else None
    fastest = pick_fastest(trials)
    notes = list(notes)
    if largest is None:
        notes.append("no batch size fitted, not even the smallest tried")
    elif stopped_by == "max_batch_size":
        notes.append(
            f"every size tried fitted, up to max_batch_size={largest}: the memory limit lies "
            "above it (raise max_batch_size to find it)"
        )
    elif stopped_by == "max_trials":
        failed = [t.batch_size for t in trials if not t.fits]
        above = f" and {min(failed)}" if failed else ""
        notes.append(
            f"the search ran out of trials (max_trials={len(trials)}) before narrowing down: "
            f"the largest size that fits lies between {largest}{above}"
            + ("" if failed else " and max_batch_size")
        )
    steps = per_replica = None
    if target is not None and fastest is not None:
        steps, per_replica = accumulation_plan(target, fastest, replicas)
    return BatchSizeResult(
        largest=largest,
        fastest=fastest,
        largest_global=None if largest is None else largest * replicas,
        fastest_global=None if fastest is None else fastest * replicas,
        num_replicas=replicas,
        trials=trials,
        memory_budget_bytes=budget,
        device=device,
        target_global_batch_size=target,
        gradient_accumulation_steps=steps,
        accumulation_batch_size=per_replica,
        in_subprocess=in_subprocess,
        notes=notes,
        memory_source=memory_source,
        stopped_by=stopped_by,
    )
