"""`find_batch_size()`: check the arguments, work out the memory budget, run the trials
under `preserved(model)` (or in a subprocess), and build the result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfgpu._internal.adapters.model_state import preserved
from tfgpu._internal.adapters.workload import check_model_and_data
from tfgpu._internal.helpers.checks import check_bool, check_int, check_number
from tfgpu._internal.helpers.progress import Progress, check_verbose
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

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


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
    target_global_batch_size: int | None = None,
    in_subprocess: bool = False,
    pool_size: int = 1024,
    verbose: int | str = "auto",
) -> BatchSizeResult:
    """Finds the largest per-replica batch that fits in device memory, and the fastest.

    Grows the batch by powers of two from `start` until a trial runs out of memory or its
    peak device memory passes the budget (`memory_fraction` of the capacity, capped by
    `memory_limit_mib`), then binary-searches the boundary. Every trial runs `steps` real
    training steps on a batch cut from `data` and measures throughput. Under a strategy the
    sizes are per replica. The model's weights, optimizer state and metrics are restored
    afterwards. The long story (the CPU, multi-worker, `in_subprocess`): docs/diagnosis.md.

    Args:
        model: keras.Model, compiled (`model.compile(optimizer, loss)`).
        data: `tf.data.Dataset` (batched or not) or arrays `(x, y)` /
            `(x, y, sample_weight)` (NumPy arrays or tensors, or dicts of them): examples
            to train on; the first `pool_size` are used.
        start: int, the first per-replica batch size. Defaults to 8.
        max_batch_size: int, the largest per-replica size to try. Defaults to 4096.
        steps: int, timed training steps per trial (after one warm-up step). Defaults to 3.
        memory_fraction: float in (0, 1], share of device capacity allowed. Defaults to 0.9.
        memory_limit_mib: float or None, an absolute peak-memory limit in MiB (2**20
            bytes; `configure(memory_limit_mib=)` counts in the same unit). Defaults to None.
        multiple_of: int, binary-search midpoints are rounded down to a multiple of this.
            Defaults to 8.
        max_trials: int, the most trials to run. Defaults to 16.
        target_global_batch_size: int or None, a global batch to reach with gradient
            accumulation; the result gives `gradient_accumulation_steps` and the
            per-replica batch (based on the fastest size). Defaults to None.
        in_subprocess: bool, run the trials in a fresh process (TensorFlow keeps GPU memory
            after an OOM; custom layers must be registered serializable). Defaults to False.
        pool_size: int, how many examples to read from `data`. Defaults to 1024.
        verbose: str or int, "auto", 0, 1 or 2: each trial and its outcome, as `model.fit`
            shows progress. Defaults to "auto".

    Returns:
        A `BatchSizeResult`.

    Raises:
        ValueError: on invalid arguments (e.g. `start` above `max_batch_size`), a model
            that is not compiled, arrays of different lengths, or data without labels for
            the model's loss; before any trial.
        TypeError: if `model` is not a Keras model, `data` is neither a dataset nor
            arrays, or `verbose` is neither a str nor an int.

    Example:

    >>> result = tfgpu.find_batch_size(model, (x, y), max_batch_size=1024)
    >>> print(result)  # largest, fastest, trials
    >>> model.fit(x, y, batch_size=result.fastest)
    """
    for name, value in (
        ("start", start),
        ("max_batch_size", max_batch_size),
        ("steps", steps),
        ("multiple_of", multiple_of),
        ("max_trials", max_trials),
        ("pool_size", pool_size),
    ):
        check_int(name, value)
    if start > max_batch_size:  # the search would run one trial at `max_batch_size`
        raise ValueError(
            f"Invalid value for argument `start`. Received: start={start} with "
            f"max_batch_size={max_batch_size}. Expected start <= max_batch_size (both are "
            "per-replica batch sizes)."
        )
    limit_mib = check_number(
        "memory_limit_mib",
        memory_limit_mib,
        minimum=0,
        exclusive_minimum=True,
        allow_none=True,
        expected="a finite number of MiB > 0, or None",
    )
    limit_bytes = None if limit_mib is None else int(limit_mib * 2**20)
    target = check_int("target_global_batch_size", target_global_batch_size, allow_none=True)
    fraction = check_number(
        "memory_fraction",
        memory_fraction,
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
        expected="a float in (0, 1]",
    )
    check_bool("in_subprocess", in_subprocess)
    check_verbose(verbose)
    work = check_model_and_data(model, data, examples_ok=True)
    progress = Progress(verbose, title="find_batch_size")
    progress.phase(f"reading up to {pool_size} examples from `data`")
    pool = work.examples(pool_size)
    if in_subprocess:
        result = find_in_subprocess(
            model,
            pool,
            dict(  # checked values: Python numbers (NumPy scalars do not go into JSON)
                start=int(start),
                max_batch_size=int(max_batch_size),
                steps=int(steps),
                memory_fraction=fraction,
                memory_limit_mib=limit_mib,
                multiple_of=int(multiple_of),
                max_trials=int(max_trials),
                target_global_batch_size=target,
            ),
            progress=progress,
        )
        progress.done(_summary(result))
        return result

    strategy = model.distribute_strategy
    replicas = int(strategy.num_replicas_in_sync)
    device = memory_device(strategy)
    notes: list[str] = []
    memory_source: str | None = "allocator"
    if not allocator_statistics(device):  # none kept, or zeros: the same
        memory_source = None
        if memory_limit_mib is not None:
            raise ValueError(
                "Invalid value for argument `memory_limit_mib`. Received: "
                f"memory_limit_mib={memory_limit_mib!r} while TensorFlow keeps no allocator "
                f"statistics for {device} in this process (or only zeros), so a peak-memory "
                "limit cannot be enforced. Expected None here; or pass in_subprocess=True (the trials then run "
                "with TensorFlow's BFC CPU allocator, which keeps them), or set "
                "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts."
            )
        notes.append(
            f"TensorFlow keeps no allocator statistics for {device} here (or only zeros), so "
            "peak memory was not measured and only out-of-memory errors stopped the search (set "
            "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts, or pass "
            "in_subprocess=True, to measure it)"
        )
    capacity = device_capacity_bytes(device)
    budgets = [b for b in (limit_bytes,) if b is not None]
    if capacity is not None:
        budgets.append(int(capacity * memory_fraction))
    budget = min(budgets) if budgets else None

    trials: list[BatchSizeTrial] = []
    ran_out = False
    with preserved(model, make_batch(pool, 1, None)[0]):
        while True:
            nxt = next_candidate(
                [(t.batch_size, t.fits) for t in trials],
                start=start,
                max_batch_size=max_batch_size,
                multiple_of=multiple_of,
            )
            if nxt is None:
                break
            if len(trials) >= max_trials:
                ran_out = True
                break
            k = len(trials) + 1
            progress.phase(f"trial {k} of at most {max_trials}: batch size {nxt}")
            trial = run_trial(
                model, pool, nxt, steps=steps, device=device, budget=budget, replicas=replicas
            )
            trials.append(trial)
            progress.phase(f"trial {k}: {_outcome(trial)}")
        progress.phase("restoring the model's weights, optimizer and metrics")
    ended_by = stopped_by(
        [(t.batch_size, t.fits) for t in trials], max_batch_size=max_batch_size, ran_out=ran_out
    )
    result = build_result(
        trials,
        replicas,
        budget,
        device,
        target_global_batch_size,
        notes,
        memory_source=memory_source,
        stopped_by=ended_by,
    )
    progress.done(_summary(result))
    return result


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
