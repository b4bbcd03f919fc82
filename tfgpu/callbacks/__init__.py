"""Keras 3 callbacks, one per file; every key they log: `docs/metrics.md`."""

from __future__ import annotations

from tfgpu.callbacks.gpu_monitor import GPUMonitor
from tfgpu.callbacks.step_timer import StepTimer

__all__ = ["BackupAndRestore", "GPUMonitor", "StepTimer"]  # BackupAndRestore: loaded on first use


def __getattr__(name: str):
    if name == "BackupAndRestore":
        from tfgpu.callbacks.backup_and_restore import BackupAndRestore

        return BackupAndRestore
    raise AttributeError(f"module 'tfgpu.callbacks' has no attribute {name!r}")
