"""Keras 3 callbacks, one per file; every key they log: `docs/metrics.md`."""

from __future__ import annotations

from tfgpu.callbacks.gpu_monitor import GPUMonitor
from tfgpu.callbacks.step_timer import StepTimer

__all__ = ["BackupAndRestore", "GPUMonitor", "StepTimer"]  # BackupAndRestore: lazy


def __getattr__(name: str):
    # BackupAndRestore (and the backup file code under it) is loaded on first use.
    if name == "BackupAndRestore":
        from tfgpu.callbacks.backup_and_restore import BackupAndRestore

        return BackupAndRestore
    raise AttributeError(f"module 'tfgpu.callbacks' has no attribute {name!r}")
