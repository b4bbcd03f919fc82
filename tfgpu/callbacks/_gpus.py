"""The peak FLOP/s of the GPUs a model trains on, for `StepTimer`'s `mfu`."""

from __future__ import annotations

from typing import Any

import keras

from tfgpu._internal.adapters import devices


def _trains_on_gpu() -> bool:
    """Whether TensorFlow places this process's ops on a GPU (after `fit` started it)."""
    try:
        import tensorflow as tf
    except ImportError:  # another Keras backend, without TensorFlow
        return False
    try:
        return bool(tf.config.list_logical_devices("GPU"))
    except (RuntimeError, tf.errors.OpError):  # a runtime that failed to start its devices
        return False


def auto_peak_flops(model: Any) -> float | None:
    """Peak FLOP/s of `/GPU:0` for the model's dtype policy times the strategy's replicas (one
    GPU each, assumed alike), or None off the GPU or if unknown (docs/metrics.md, `mfu`)."""
    if not _trains_on_gpu():
        return None
    from tfgpu.flops import peak_flops

    gpu = devices.gpu_record(0)
    if gpu is None or gpu.name is None:
        return None
    policy = getattr(getattr(model, "dtype_policy", None), "name", None)
    precision = devices.peak_precision(
        str(policy or keras.config.dtype_policy().name), gpu.compute_capability
    )
    peak = None if precision is None else peak_flops(gpu.name, precision)
    if peak is None:
        return None
    strategy = getattr(model, "distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    return peak * (replicas if isinstance(replicas, int) and replicas > 0 else 1)
