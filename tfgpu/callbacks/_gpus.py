"""The peak FLOP/s of the GPUs a model trains on, for `StepTimer`'s `mfu`.

Which GPU TensorFlow's `/GPU:0` is, and what NVML says about it, comes from
`tfgpu._internal.adapters.devices` (the one place that maps TensorFlow's GPUs to physical ones).
"""

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
    """Peak FLOP/s of the replicas `model` trains on, or None off the GPU or if unknown.

    Reads TensorFlow's first GPU (`/GPU:0`, after `CUDA_VISIBLE_DEVICES` and
    `tf.config.set_visible_devices`): its name and compute capability, the model's dtype
    policy (`tfgpu._internal.adapters.devices.peak_precision`), and multiplies by the strategy's replicas (one
    GPU each, assumed alike).
    """
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
