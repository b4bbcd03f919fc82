"""One trial of the batch-size search: a batch cut from the pool of examples, the device's
allocator statistics, the timed steps, and the decision every worker agrees on."""

from __future__ import annotations

import gc

import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters.devices import gpu_record, peak_memory, reset_peak_memory
from tfgpu._internal.measure import timing
from tfgpu.batch_size._result import BatchSizeTrial


def make_batch(pool, batch_size: int):
    """`(x, y, sample_weight)` of `batch_size` examples cut from the pool (repeated as needed)."""
    idx = np.arange(batch_size) % len(tf.nest.flatten(pool[0])[0])

    def cut(a):
        return tf.constant(a[idx])

    return tuple(None if p is None else tf.nest.map_structure(cut, p) for p in pool)


def memory_device(strategy) -> str:
    """The device whose memory the trials measure: the strategy's first, else `/GPU:0` or
    `/CPU:0`, e.g. "GPU:0"."""
    try:
        devices = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError):  # the default strategy has none
        devices = []
    if devices:
        return devices[0].split("device:")[-1].upper()
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def allocator_statistics(device: str) -> bool:
    """Whether TensorFlow keeps peak-memory statistics for `device`: they exist and rise when
    a tensor is made there. A CPU allocator without them may answer zeros
    (`TF_CPU_ALLOCATOR_USE_BFC=false`) instead of refusing: that is no statistics either."""
    if not reset_peak_memory(device):
        return False
    with tf.device(device):
        probe = tf.ones([1 << 16], tf.float32)  # 256 KiB, more than any allocator keeps inline
    peak = peak_memory(device)
    del probe
    return bool(peak)


def device_capacity_bytes(device: str) -> int | None:
    """Total memory of TensorFlow's `/GPU:k` (from NVML), or None (CPU, or NVML missing)."""
    if not device.startswith("GPU"):
        return None
    try:
        index = int(device.split(":")[1])
    except (IndexError, ValueError):  # not "GPU:k": fall back to OOM detection only
        return None
    gpu = gpu_record(index)  # never raises: None without such a GPU
    return None if gpu is None else gpu.memory_total_bytes


def _agree(strategy, fits: bool, seconds: float) -> tuple[bool, float]:
    """Under multi-worker training, all workers take the same decision for a trial."""
    if not getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)():
        return fits, seconds
    value = tf.constant([0.0 if fits else 1.0, seconds], tf.float32)
    per_replica = strategy.run(lambda: tf.identity(value))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
    n = strategy.num_replicas_in_sync
    return bool(total[0] == 0), float(total[1] / n)


def run_trial(model, pool, batch_size, *, steps, device, budget, replicas) -> BatchSizeTrial:
    """Trains `steps` steps on a batch of `batch_size` examples per replica (`train_on_batch`
    gives each replica the whole batch) and measures them; the decision is every worker's."""
    measured = reset_peak_memory(device)
    nan = float("nan")
    fits, reason, seconds = True, "ok", nan
    batch = None
    try:
        batch = make_batch(pool, batch_size)
        x, y, sw = batch
        # train_on_batch returns host values: each call ends when its step has run.
        seconds = timing.call_time(lambda: model.train_on_batch(x, y, sample_weight=sw), steps)
    except tf.errors.ResourceExhaustedError:
        fits, reason = False, "oom"
    except MemoryError:  # the host could not even hold the batch (an absurd size)
        fits, reason = False, "host_oom"
    finally:
        del batch
    # Zero after training steps is no measurement (an allocator that keeps no statistics).
    peak = (peak_memory(device) or None) if measured else None
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
        batch_size=global_batch,
        per_replica_batch_size=batch_size,
        fits=fits,
        reason=reason,
        peak_memory_bytes=peak,
        step_time_s=seconds,
        examples_per_s=global_batch / seconds if fits else nan,
    )
