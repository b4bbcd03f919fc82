"""One trial of the batch-size search: the pool of examples batches are cut from, the device
whose memory is measured and its allocator statistics, the timed training steps, and the
decision every worker agrees on."""

from __future__ import annotations

import gc
import time

import numpy as np

from tfgpu._internal.adapters.datasets import source_batches
from tfgpu._internal.helpers.checks import invalid_type
from tfgpu.batch_size._result import BatchSizeTrial

# ----------------------------------------------------------------------------------------
# Data: a pool of examples from which batches of any size are cut


def _is_array_like(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def example_pool(data, pool_size: int):
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


def make_batch(pool, batch_size: int, device: str | None):
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


def memory_device(strategy) -> str:
    import tensorflow as tf

    try:
        devices = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError):  # the default strategy has none
        devices = []
    if devices:
        name = devices[0].split("device:")[-1]
        return name.upper()
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def device_capacity_bytes(device: str) -> int | None:
    """Total memory of the measured GPU, TensorFlow's `/GPU:k` (from NVML), or None (CPU,
    or NVML missing). `/GPU:k` follows `CUDA_VISIBLE_DEVICES` and `configure(gpus=...)`."""
    if not device.startswith("GPU"):
        return None
    from tfgpu._internal.adapters import devices

    try:
        index = int(device.split(":")[1])
    except (IndexError, ValueError):  # not "GPU:k": fall back to OOM detection only
        return None
    gpu = devices.gpu_record(index)  # never raises: None without such a GPU
    return None if gpu is None else gpu.memory_total_bytes


def _reset_peak(device: str) -> bool:
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(device)
        return True
    except (ValueError, tf.errors.OpError):
        return False


def has_allocator_stats(device: str) -> bool:
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


def run_trial(model, pool, batch_size, *, steps, device, budget, replicas) -> BatchSizeTrial:
    import tensorflow as tf

    measured = _reset_peak(device)
    nan = float("nan")
    fits, reason, seconds = True, "ok", nan
    batch = None
    try:
        batch = make_batch(pool, batch_size, None)
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
