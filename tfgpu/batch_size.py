"""The batch-size finder: the largest per-replica batch that fits, and the fastest one.

The search is a pure function of the trials made so far (`_next_candidate`): powers of two
from `start` until a trial fails, then a binary search between the largest size that fitted
and the smallest that failed (midpoints rounded down to a multiple of `multiple_of`, 8 by
default, the size tensor cores like). A trial fails when TensorFlow raises
`tf.errors.ResourceExhaustedError` (caught by type) or when the peak device memory it used
(`tf.config.experimental.get_memory_info(device)["peak"]`) passes the memory budget. Each
trial runs real training steps (`Model.train_on_batch` on a batch already in memory) and
measures throughput, and the model's weights, optimizer state and metrics are put back
afterwards.

Where the memory figure comes from: TensorFlow's allocator statistics. GPUs always keep
them. On the CPU, TensorFlow keeps them only with its BFC CPU allocator, which is on by
default on some CPUs and off on others (`TF_CPU_ALLOCATOR_USE_BFC=true` turns it on, read
when TensorFlow starts). Without statistics the search stops at out-of-memory errors alone,
the result says so (`memory_source=None`), and a `memory_limit_bytes` that cannot be
enforced is refused; `in_subprocess=True` turns the statistics on for the trials.
"""

from __future__ import annotations

import gc
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tfgpu._checks import check_int, check_number, invalid_type
from tfgpu._datasets import source_batches
from tfgpu._model_state import preserved

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = ["BatchSizeResult", "BatchSizeTrial", "find_batch_size"]


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
        step_time_s: float, mean seconds per step (NaN when it did not fit).
        examples_per_second: float, global examples per second (NaN when it did not fit).
    """

    batch_size: int
    global_batch_size: int
    fits: bool
    reason: str
    peak_memory_bytes: int | None
    step_time_s: float
    examples_per_second: float


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
        memory_source: str or None, where peak memory came from: `"allocator"`
            (TensorFlow's allocator statistics, `tf.config.experimental.get_memory_info`)
            or None (not measured: the search stopped at out-of-memory errors only).
        stopped_by: str, why the search ended: `"limit"` (it narrowed down to the boundary
            between a size that fits and one that does not), `"max_batch_size"` (every size
            up to it fitted: the limit lies above), `"max_trials"` (out of trials before
            narrowing down) or `"nothing_fits"` (even batch size 1 failed).
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
            for k in ("step_time_s", "examples_per_second"):
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
            speed = f"{t.examples_per_second:,.0f} ex/s" if t.fits else t.reason
            lines.append(f"    {t.batch_size:>6}  peak {mem:>12}  {speed}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Pure decisions


def _next_candidate(
    trials: list[tuple[int, bool]], *, start: int, max_batch_size: int, multiple_of: int
) -> int | None:
    """The next per-replica batch size to try, or None when the search is over."""
    if not trials:
        return min(start, max_batch_size)
    fits = [b for b, ok in trials if ok]
    fails = [b for b, ok in trials if not ok]
    lo = max(fits) if fits else None
    hi = min(fails) if fails else None
    if lo is None:  # even the first size failed: halve down
        nxt = min(fails) // 2  # = hi: trials is not empty, so something failed
        return nxt if nxt >= 1 else None
    if hi is None:  # still growing by powers of two
        if lo >= max_batch_size:
            return None
        return min(lo * 2, max_batch_size)
    mid = (lo + hi) // 2
    if multiple_of > 1 and mid >= multiple_of:
        mid = mid // multiple_of * multiple_of
    if mid <= lo or mid >= hi:
        return None
    return mid


def _stopped_by(trials: list[tuple[int, bool]], *, max_batch_size: int, ran_out: bool) -> str:
    """Why a search over `trials` ended (see `BatchSizeResult.stopped_by`); pure."""
    fits = [b for b, ok in trials if ok]
    if not fits and trials and min(b for b, _ in trials) == 1:
        return "nothing_fits"
    if ran_out:
        return "max_trials"
    if fits and max(fits) >= max_batch_size:
        return "max_batch_size"
    return "limit"


def _accumulation_plan(target: int, max_per_replica: int, replicas: int) -> tuple[int, int]:
    """(steps, per-replica batch) reaching `target` global examples per optimizer update.

    Prefers an exact split (target divisible by replicas * steps); otherwise rounds the
    per-replica batch up so that each update sees at least `target` examples.
    """
    per_step = max_per_replica * replicas
    steps = max(1, math.ceil(target / per_step))
    for s in range(steps, steps * 2 + 1):
        if target % (replicas * s) == 0 and target // (replicas * s) <= max_per_replica:
            return s, target // (replicas * s)
    return steps, math.ceil(target / (replicas * steps))


def _pick_fastest(trials: list[BatchSizeTrial]) -> int | None:
    ok = [t for t in trials if t.fits and not math.isnan(t.examples_per_second)]
    return max(ok, key=lambda t: t.examples_per_second).batch_size if ok else None


# ----------------------------------------------------------------------------------------
# Data: a pool of examples from which batches of any size are cut


def _is_array_like(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _example_pool(data, pool_size: int):
    """Returns (x, y, sample_weight) as NumPy structures with a leading example axis."""
    import keras
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        batched, ambiguous = source_batches(data)
        ds = data.unbatch() if batched is not None or ambiguous else data
        element = next(iter(ds.take(pool_size).batch(pool_size)))
        element = tf.nest.map_structure(lambda t: t.numpy(), element)
    elif _is_array_like(data):
        element = data
    elif isinstance(data, (tuple, list)) and all(
        _is_array_like(a) or isinstance(a, (dict, list, tuple)) or a is None for a in data
    ):
        element = tuple(data)
    else:
        raise invalid_type(
            "data",
            data,
            "a `tf.data.Dataset` or a tuple of arrays `(x, y)` / `(x, y, sample_weight)`",
        )
    x, y, sw = keras.utils.unpack_x_y_sample_weight(element)
    lengths = {
        len(a) if np.ndim(a) else 0
        for part in (x, y, sw)
        if part is not None
        for a in tf.nest.flatten(part)
    }
    if len(lengths) > 1:
        raise ValueError(
            "Invalid value for argument `data`. Received: arrays of different lengths "
            f"({', '.join(map(str, sorted(lengths)))} examples). Expected x, y (and "
            "sample_weight) with one entry per example each."
        )
    n = lengths.pop() if lengths else 0
    if n == 0:
        raise ValueError("Invalid value for argument `data`. Received: no examples.")
    take = min(n, pool_size)
    cut = lambda a: None if a is None else np.asarray(a)[:take]  # noqa: E731
    return (
        tf.nest.map_structure(cut, x),
        None if y is None else tf.nest.map_structure(cut, y),
        None if sw is None else tf.nest.map_structure(cut, sw),
    )


def _make_batch(pool, batch_size: int, device: str | None):
    import tensorflow as tf

    n = len(tf.nest.flatten(pool[0])[0])
    idx = np.arange(batch_size) % n

    def cut(a):
        return tf.constant(a[idx])

    if device is None:
        return tuple(None if p is None else tf.nest.map_structure(cut, p) for p in pool)
    with tf.device(device):
        return tuple(None if p is None else tf.nest.map_structure(cut, p) for p in pool)


# ----------------------------------------------------------------------------------------
# Effects: run one trial


def _memory_device(strategy) -> str:
    import tensorflow as tf

    try:
        devices = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError):  # the default strategy has none
        devices = []
    if devices:
        name = devices[0].split("device:")[-1]
        return name.upper()
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def _device_capacity_bytes(device: str) -> int | None:
    """Total memory of the measured GPU, TensorFlow's `/GPU:k` (from NVML), or None (CPU,
    or NVML missing). `/GPU:k` follows `CUDA_VISIBLE_DEVICES` and `configure(gpus=...)`."""
    if not device.startswith("GPU"):
        return None
    try:
        from tfgpu import _devices

        gpu = _devices.gpu_record(int(device.split(":")[1]))
    except Exception:  # side feature: fall back to OOM detection only
        return None
    return None if gpu is None else gpu.memory_total_bytes


def _reset_peak(device: str) -> bool:
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(device)
        return True
    except (ValueError, tf.errors.OpError):
        return False


def _has_allocator_stats(device: str) -> bool:
    """Whether TensorFlow keeps allocator statistics (current, peak) for `device` here."""
    import tensorflow as tf

    try:
        tf.config.experimental.get_memory_info(device)
        return True
    except (ValueError, tf.errors.OpError):
        return False


def _peak(device: str) -> int | None:
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info(device)["peak"])
    except (ValueError, tf.errors.OpError):
        return None


def _agree(strategy, fits: bool, seconds: float) -> tuple[bool, float]:
    """Under multi-worker training, all workers take the same decision for a trial."""
    import tensorflow as tf

    extended = strategy.extended
    multi = getattr(extended, "_in_multi_worker_mode", lambda: False)()
    if not multi:
        return fits, seconds
    value = tf.constant([0.0 if fits else 1.0, seconds], tf.float32)
    per_replica = strategy.run(lambda: tf.identity(value))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
    n = strategy.num_replicas_in_sync
    return bool(total[0] == 0), float(total[1] / n)


def _run_trial(model, pool, batch_size, *, steps, device, budget, replicas) -> BatchSizeTrial:
    import tensorflow as tf

    measured = _reset_peak(device)
    nan = float("nan")
    fits, reason, seconds = True, "ok", nan
    batch = None
    try:
        batch = _make_batch(pool, batch_size, None)
        x, y, sw = batch
        model.train_on_batch(x, y, sample_weight=sw)  # trace and warm up
        t0 = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(x, y, sample_weight=sw)  # returns host values: synced
        seconds = (time.perf_counter() - t0) / steps
    except tf.errors.ResourceExhaustedError:
        fits, reason = False, "oom"
    except MemoryError:  # the host could not even hold the batch (an absurd size)
        fits, reason = False, "host_oom"
    finally:
        del batch
    peak = _peak(device) if measured else None
    if fits and budget is not None and peak is not None and peak > budget:
        fits, reason = False, "over_budget"
    fits_all, seconds = _agree(model.distribute_strategy, fits, seconds)
    if fits and not fits_all:
        fits, reason = False, "oom_on_another_worker"
    if not fits:
        seconds = nan
        gc.collect()
    global_batch = batch_size * replicas
    return BatchSizeTrial(
        batch_size=batch_size,
        global_batch_size=global_batch,
        fits=fits,
        reason=reason,
        peak_memory_bytes=peak,
        step_time_s=seconds,
        examples_per_second=global_batch / seconds if fits else nan,
    )


# ----------------------------------------------------------------------------------------
# Public entry point


def find_batch_size(
    model: keras.Model,
    data: tf.data.Dataset | tuple[Any, ...] | list[Any],
    *,
    start: int = 8,
    max_batch_size: int = 4096,
    steps: int = 3,
    memory_fraction: float = 0.9,
    memory_limit_bytes: int | None = None,
    multiple_of: int = 8,
    max_trials: int = 16,
    target_global_batch_size: int | None = None,
    in_subprocess: bool = False,
    pool_size: int = 1024,
) -> BatchSizeResult:
    """Finds the largest per-replica batch that fits in device memory, and the fastest.

    Grows the batch by powers of two from `start` until a trial runs out of memory
    (`tf.errors.ResourceExhaustedError`) or its peak device memory passes the budget, then
    binary-searches between the last size that fitted and the first that failed. Every trial
    runs `steps` real training steps on a batch cut from `data` (repeating examples when the
    batch is larger than the data) and measures throughput. The model's weights, optimizer
    state and metric state are restored afterwards.

    The memory budget is `memory_fraction` of the device's capacity (on GPUs, from NVML;
    1 - `memory_fraction` is the safety margin for what fit adds: prefetch buffers,
    fragmentation), capped by `memory_limit_bytes`. Without a known capacity (the CPU) only
    `memory_limit_bytes` and OOM errors stop the growth. Under a distribution strategy
    (`model` built in `strategy.scope()`) sizes are per replica, each replica runs the full
    per-replica batch, and the global sizes are reported too; under multi-worker training
    every worker takes the same decision per trial.

    TensorFlow does not give GPU memory back after an OOM. With `in_subprocess=True` the
    trials run in a fresh Python process (the model is saved to a temporary `.keras` file),
    so this process's GPU memory stays untouched; the result says so in `notes`. Custom
    layers must then be registered with `keras.saving.register_keras_serializable` in an
    importable module (the subprocess imports the modules that define them).

    Args:
        model: keras.Model, compiled (`model.compile(optimizer, loss)`).
        data: `tf.data.Dataset` (batched or not) or a tuple of arrays `(x, y)` /
            `(x, y, sample_weight)`: examples to train on; the first `pool_size` are used.
        start: int, the first per-replica batch size. Defaults to 8.
        max_batch_size: int, the largest per-replica size to try. Defaults to 4096.
        steps: int, timed training steps per trial (after one warm-up step). Defaults to 3.
        memory_fraction: float in (0, 1], share of device capacity allowed. Defaults to 0.9.
        memory_limit_bytes: int or None, an absolute peak-memory limit. Defaults to None.
        multiple_of: int, binary-search midpoints are rounded down to a multiple of this.
            Defaults to 8.
        max_trials: int, the most trials to run. Defaults to 16.
        target_global_batch_size: int or None, a global batch to reach with gradient
            accumulation; the result gives `gradient_accumulation_steps` and the
            per-replica batch (based on the fastest size). Defaults to None.
        in_subprocess: bool, run the trials in a fresh process. Defaults to False.
        pool_size: int, how many examples to read from `data`. Defaults to 1024.

    Returns:
        A `BatchSizeResult`.

    Raises:
        ValueError: on invalid arguments (e.g. `start` above `max_batch_size`), or a model
            that is not compiled; before any trial.
        TypeError: if `data` is neither a dataset nor arrays.

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
    check_int("memory_limit_bytes", memory_limit_bytes, allow_none=True)
    check_int("target_global_batch_size", target_global_batch_size, allow_none=True)
    check_number(
        "memory_fraction",
        memory_fraction,
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
        expected="a float in (0, 1]",
    )
    if not isinstance(in_subprocess, bool):
        raise invalid_type("in_subprocess", in_subprocess, "True or False")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ValueError(
            "Invalid value for argument `model`. Received: a model that is not compiled. "
            "Expected a model after `model.compile(optimizer, loss)`."
        )
    pool = _example_pool(data, pool_size)
    if in_subprocess:
        return _find_in_subprocess(
            model,
            pool,
            dict(
                start=start,
                max_batch_size=max_batch_size,
                steps=steps,
                memory_fraction=memory_fraction,
                memory_limit_bytes=memory_limit_bytes,
                multiple_of=multiple_of,
                max_trials=max_trials,
                target_global_batch_size=target_global_batch_size,
            ),
        )

    strategy = model.distribute_strategy
    replicas = int(strategy.num_replicas_in_sync)
    device = _memory_device(strategy)
    notes: list[str] = []
    memory_source: str | None = "allocator"
    if not _has_allocator_stats(device):
        memory_source = None
        if memory_limit_bytes is not None:
            raise ValueError(
                "Invalid value for argument `memory_limit_bytes`. Received: "
                f"memory_limit_bytes={memory_limit_bytes} while TensorFlow keeps no allocator "
                f"statistics for {device} in this process, so a peak-memory limit cannot be "
                "enforced. Expected None here; or pass in_subprocess=True (the trials then run "
                "with TensorFlow's BFC CPU allocator, which keeps them), or set "
                "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts."
            )
        notes.append(
            f"TensorFlow keeps no allocator statistics for {device} here, so peak memory was "
            "not measured and only out-of-memory errors stopped the search (set "
            "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts, or pass "
            "in_subprocess=True, to measure it)"
        )
    capacity = _device_capacity_bytes(device)
    budgets = [b for b in (memory_limit_bytes,) if b is not None]
    if capacity is not None:
        budgets.append(int(capacity * memory_fraction))
    budget = min(budgets) if budgets else None

    trials: list[BatchSizeTrial] = []
    ran_out = False
    with preserved(model, _make_batch(pool, 1, None)[0]):
        while True:
            nxt = _next_candidate(
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
            trials.append(
                _run_trial(
                    model,
                    pool,
                    nxt,
                    steps=steps,
                    device=device,
                    budget=budget,
                    replicas=replicas,
                )
            )
    stopped_by = _stopped_by(
        [(t.batch_size, t.fits) for t in trials],
        max_batch_size=max_batch_size,
        ran_out=ran_out,
    )
    return _result(
        trials,
        replicas,
        budget,
        device,
        target_global_batch_size,
        notes,
        memory_source=memory_source,
        stopped_by=stopped_by,
    )


def _result(
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
    fastest = _pick_fastest(trials)
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
        steps, per_replica = _accumulation_plan(target, fastest, replicas)
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


def _find_in_subprocess(model, pool, kwargs) -> BatchSizeResult:
    if int(model.distribute_strategy.num_replicas_in_sync) > 1:
        raise ValueError(
            "Invalid value for argument `in_subprocess`. Received: in_subprocess=True for a "
            "model under a distribution strategy. Expected in_subprocess=False there."
        )
    with tempfile.TemporaryDirectory(prefix="tfgpu-bs-") as tmp:
        tmpdir = Path(tmp)
        model.save(tmpdir / "model.keras")
        with open(tmpdir / "pool.pkl", "wb") as f:
            pickle.dump(pool, f)
        (tmpdir / "kwargs.json").write_text(json.dumps(kwargs))
        (tmpdir / "modules.json").write_text(json.dumps(_custom_modules(model)))
        code = f"from tfgpu.batch_size import _subprocess_main; _subprocess_main({str(tmpdir)!r})"
        env = {**os.environ}
        # A fresh TensorFlow: turn on the CPU allocator statistics the memory budget needs.
        env.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600
        )
        out = tmpdir / "result.json"
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(
                "The batch-size search in a subprocess failed (exit status "
                f"{proc.returncode}). Its last output:\n{proc.stderr[-2000:]}"
            )
        d = json.loads(out.read_text())
    nan = float("nan")
    trials = [
        BatchSizeTrial(
            **{
                **t,
                "step_time_s": nan if t["step_time_s"] is None else t["step_time_s"],
                "examples_per_second": nan
                if t["examples_per_second"] is None
                else t["examples_per_second"],
            }
        )
        for t in d["trials"]
    ]
    note = (
        "trials ran in a subprocess (in_subprocess=True): this process's device memory was "
        "not used by the search"
    )
    return _result(
        trials,
        d["num_replicas"],
        d["memory_budget_bytes"],
        d["device"],
        d["target_global_batch_size"],
        [note, *d["notes"]],
        in_subprocess=True,
        memory_source=d.get("memory_source"),
        stopped_by=d.get("stopped_by", "limit"),
    )


def _custom_modules(model) -> list[str]:
    """Modules defining the model's custom classes, imported in the subprocess first."""
    layers = [model, *model._flatten_layers(include_self=False)]
    names = {type(obj).__module__ for obj in layers}
    return sorted(n for n in names if n.split(".")[0] not in ("keras", "tf_keras", "__main__"))


def _subprocess_main(tmpdir: str) -> None:
    import importlib

    import keras

    path = Path(tmpdir)
    for name in json.loads((path / "modules.json").read_text()):
        importlib.import_module(name)
    model = keras.models.load_model(path / "model.keras")
    with open(path / "pool.pkl", "rb") as f:
        pool = pickle.load(f)
    kwargs = json.loads((path / "kwargs.json").read_text())
    result = find_batch_size(model, tuple(pool), **kwargs)
    (path / "result.json").write_text(json.dumps(result.to_dict()))
