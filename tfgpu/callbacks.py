"""Keras 3 callbacks: `GPUMonitor`, `StepTimer` and `BackupAndRestore`."""

from __future__ import annotations

__all__ = ["BackupAndRestore", "GPUMonitor", "StepTimer"]


def __getattr__(name: str):
    # BackupAndRestore lives with the distributed-training code; loaded on first use.
    if name == "BackupAndRestore":
        from tfgpu._backup import BackupAndRestore

        return BackupAndRestore
    raise AttributeError(f"module 'tfgpu.callbacks' has no attribute {name!r}")
