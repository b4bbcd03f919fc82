"""`find_batch_size()`: open the session, work out the memory budget, run the trials under
`preserved(model)` (or in a subprocess), and build the result."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import keras
import tensorflow as tf

from tfgpu._internal.adapters.model_state import preserved
from tfgpu._internal.helpers.checks import check_bool, check_int, check_number, invalid_value
from tfgpu._internal.measure import rules
from tfgpu._internal.measure.session import Session
from tfgpu._internal.measure.workload import open_workload
from tfgpu.batch_size._result import BatchSizeResult, BatchSizeTrial, build_result
from tfgpu.batch_size._search import next_candidate, stopped_by
from tfgpu.batch_size._subprocess import find_in_subprocess
from tfgpu.batch_size._trial import (
    allocator_statistics,
    device_capacity_bytes,
    make_batch,
    memory_device,
    run_trial,
)


def find_batch_size(
    model: keras.Model,
    data: tf.data.Dataset | tuple[Any, ...] | list[Any],
    *,
    start: int = 8,
    max_batch_size: int = 4096,
    steps: int = 3,
    memory_fraction: float = 0.9,
    memory_limit_mib: float | None = None,
    multiple_of: int = 8,
    max_trials: int = 16,
    target_batch_size: int | None = None,
    in_subprocess: bool = False,
    pool_size: int = 1024,
    time_budget_s: float | None = rules.SEARCH_BUDGET_S,
    log_dir: str | os.PathLike[str] | None = None,
    verbose: int | str = "auto",
) -> BatchSizeResult:
    """Finds the largest batch size that fits in device memory, and the fastest.

    Grows the batch by powers of two from `start` until a trial runs out of memory or passes
    the memory budget, then binary-searches the boundary, timing `steps` training steps per
    trial; batch sizes are global, as `fit(batch_size=)` takes them; the model is put back
    afterwards. The guide: docs/diagnosis.md, section `tfgpu.find_batch_size`.

    Args:
        model: keras.Model, compiled, or a function without arguments that returns one.
        data: `tf.data.Dataset` (batched or not) or arrays `(x, y)` /
            `(x, y, sample_weight)`: examples to train on; the first `pool_size` are used.
        start: int, the first batch size. Defaults to 8.
        max_batch_size: int, the largest batch size to try. Defaults to 4096.
        steps: int, timed training steps per trial (after one warm-up step). Defaults to 3.
        memory_fraction: float in (0, 1], share of device capacity allowed. Defaults to 0.9.
        memory_limit_mib: float or None, a peak-memory limit in MiB (2**20 bytes, as
            `configure(memory_limit_mib=)`). Defaults to None.
        multiple_of: int, binary-search midpoints round down to a multiple of it. Defaults to 8.
        max_trials: int, the most trials to run. Defaults to 16.
        target_batch_size: int or None, a batch per optimizer update to reach with gradient
            accumulation from the fastest size. Defaults to None.
        in_subprocess: bool, run the trials in a fresh process (custom layers must be
            registered serializable). Defaults to False.
        pool_size: int, how many examples to read from `data`. Defaults to 1024.
        time_budget_s: float or None, seconds the trials may take: no trial starts after
            it (None: no limit). Defaults to 300.0.
        log_dir: str, os.PathLike or None, a run directory for `batch_size.json` (an earlier
            one rotated aside). Defaults to None.
        verbose: str or int, "auto", 0, 1 or 2: each trial and its outcome, as `model.fit`
            shows progress. Defaults to "auto".

    Returns:
        A `BatchSizeResult`.

    Raises:
        ValueError: on invalid arguments (e.g. `start` above `max_batch_size`), an
            uncompiled model or invalid data (docs/diagnosis.md); before any trial.
        TypeError: if `model` is not a Keras model, `data` is neither a dataset nor arrays,
            or an argument has the wrong type.

    Example:

    >>> result = tfgpu.find_batch_size(model, (x, y), max_batch_size=1024)
    >>> print(result)  # largest, fastest, trials
    >>> model.fit(x, y, batch_size=result.fastest)
    """
    session = Session.open(
        "find_batch_size", verbose=verbose, time_budget_s=time_budget_s, log_dir=log_dir
    )
    search = _Search.checked(
        start=start,
        max_batch_size=max_batch_size,
        steps=steps,
        memory_fraction=memory_fraction,
        memory_limit_mib=memory_limit_mib,
        multiple_of=multiple_of,
        max_trials=max_trials,
        target_batch_size=target_batch_size,
    )
    check_int("pool_size", pool_size)
    check_bool("in_subprocess", in_subprocess)
    work = open_workload(model, data, examples_ok=True)
    replicas = int(work.model.distribute_strategy.num_replicas_in_sync)
    search.check_replicas(replicas)
    session.progress.phase(f"reading up to {pool_size} examples from `data`")
    pool = work.examples(pool_size)
    if in_subprocess:
        left = session.budget.left() if session.budget.seconds else None
        kwargs = {**dataclasses.asdict(search), "time_budget_s": left}
        result = find_in_subprocess(work.model, pool, kwargs, session.progress)
    else:
        result = search.run(work.model, pool, replicas, session)
    return session.finish(result, _summary(result))


@dataclasses.dataclass(frozen=True)
class _Search:
    """The search's checked arguments (Python numbers: they go into JSON for a subprocess)."""

    start: int
    max_batch_size: int
    steps: int
    memory_fraction: float
    memory_limit_mib: float | None
    multiple_of: int
    max_trials: int
    target_batch_size: int | None

    @classmethod
    def checked(cls, **given: Any) -> _Search:
        ints = ("start", "max_batch_size", "steps", "multiple_of", "max_trials")
        checked: dict[str, Any] = {name: check_int(name, given[name]) for name in ints}
        start, most = checked["start"], checked["max_batch_size"]
        if start > most:  # the search would run one trial at `max_batch_size`
            received = f"start={start} with max_batch_size={most}"
            raise invalid_value("start", start, "start <= max_batch_size", received=received)
        positive = functools.partial(check_number, minimum=0, exclusive_minimum=True)
        checked["memory_limit_mib"] = positive(
            "memory_limit_mib",
            given["memory_limit_mib"],
            allow_none=True,
            expected="a finite number of MiB > 0, or None",
        )
        checked["memory_fraction"] = positive(
            "memory_fraction", given["memory_fraction"], maximum=1, expected="a float in (0, 1]"
        )
        target = given["target_batch_size"]
        checked["target_batch_size"] = check_int("target_batch_size", target, allow_none=True)
        return cls(**checked)

    def check_replicas(self, replicas: int) -> None:
        """Batch sizes are global: `start` and `max_batch_size` split over the replicas."""
        for name in ("start", "max_batch_size"):
            value = getattr(self, name)
            if value % replicas:
                raise invalid_value(
                    name,
                    value,
                    f"a multiple of the strategy's {replicas} replicas (batch sizes are global, "
                    f"as fit takes them), e.g. {name}={max(1, value // replicas) * replicas}",
                )

    def run(self, model: Any, pool: Any, replicas: int, session: Session) -> BatchSizeResult:
        """The trials in this process, under the memory budget, and their result."""
        device = memory_device(model.distribute_strategy)
        memory_source, budget = self._memory_budget(device, session.notes)
        trials, ended = self._trials(model, pool, session, device, budget)
        return build_result(
            trials,
            replicas,
            budget,
            device,
            self.target_batch_size,
            session.notes,
            memory_source=memory_source,
            stopped_by=ended,
        )

    def _memory_budget(self, device: str, notes: list[str]) -> tuple[str | None, int | None]:
        """(where peak memory is read: "allocator" or None, the peak-memory budget in bytes or
        None); a ValueError when `memory_limit_mib` cannot be enforced."""
        limit_mib = self.memory_limit_mib
        memory_source: str | None = "allocator"
        if not allocator_statistics(device):  # none kept, or zeros: the same
            memory_source = None
            if limit_mib is not None:
                raise invalid_value(
                    "memory_limit_mib",
                    limit_mib,
                    "None here; or pass in_subprocess=True (the trials then run with "
                    "TensorFlow's BFC CPU allocator, which keeps them), or set "
                    "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts",
                    received=f"memory_limit_mib={limit_mib:g} while TensorFlow keeps no "
                    f"allocator statistics for {device} in this process (or only zeros), so a "
                    "peak-memory limit cannot be enforced",
                )
            notes.append(
                f"TensorFlow keeps no allocator statistics for {device} here (or only zeros), "
                "so peak memory was not measured and only out-of-memory errors stopped the "
                "search (set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts, or pass "
                "in_subprocess=True, to measure it)"
            )
        capacity = device_capacity_bytes(device)
        budgets = [] if limit_mib is None else [int(limit_mib * 2**20)]
        if capacity is not None:
            budgets.append(int(capacity * self.memory_fraction))
        return memory_source, (min(budgets) if budgets else None)

    def _trials(
        self, model: Any, pool: Any, session: Session, device: str, budget: int | None
    ) -> tuple[list[BatchSizeTrial], str]:
        """The trials at per-replica sizes under `preserved(model)`, and why they ended."""
        replicas = int(model.distribute_strategy.num_replicas_in_sync)
        start, most = self.start // replicas, self.max_batch_size // replicas
        trials: list[BatchSizeTrial] = []
        progress, ran_out = session.progress, ""
        fixed = {"steps": self.steps, "device": device, "budget": budget, "replicas": replicas}
        with preserved(model, make_batch(pool, 1)[0]):
            while True:
                done = [(t.per_replica_batch_size, t.fits) for t in trials]
                nxt = next_candidate(
                    done, start=start, max_batch_size=most, multiple_of=self.multiple_of
                )
                if nxt is None:
                    break
                if len(trials) >= self.max_trials or (trials and session.budget.left() <= 0):
                    ran_out = "max_trials" if len(trials) >= self.max_trials else "time_budget"
                    break
                k = len(trials) + 1
                progress.phase(
                    f"trial {k} of at most {self.max_trials}: batch size {nxt * replicas}"
                )
                t = run_trial(model, pool, nxt, **fixed)  # only the size changes
                trials.append(t)
                progress.phase(f"trial {k}: {_outcome(t)}")
            progress.phase("restoring the model's weights, optimizer and metrics")
        done = [(t.per_replica_batch_size, t.fits) for t in trials]
        ended = stopped_by(done, max_batch_size=most, ran_out=bool(ran_out))
        return trials, ran_out if ended == "max_trials" else ended


_REASONS = {
    "oom": "out of memory",
    "host_oom": "out of host memory building the batch",
    "over_budget": "over the memory budget",
    "oom_on_another_worker": "out of memory on another worker",
}


def _outcome(trial: BatchSizeTrial) -> str:
    """One trial's outcome in a few words, e.g. "batch size 4096 does not fit (out of memory)"."""
    if not trial.fits:
        reason = _REASONS.get(trial.reason, trial.reason)
        return f"batch size {trial.batch_size} does not fit ({reason})"
    return (
        f"batch size {trial.batch_size} fits, {trial.step_time_s * 1e3:,.1f} ms per step, "
        f"{trial.examples_per_s:,.0f} examples/s"
    )


def _summary(result: BatchSizeResult) -> str:
    """The progress's last words: the largest and the fastest size."""
    trials = f"{len(result.trials)} trial{'s' if len(result.trials) != 1 else ''}"
    if result.largest is None:
        return f"{trials}, no batch size fitted"
    return f"{trials}, largest {result.largest}, fastest {result.fastest}"
