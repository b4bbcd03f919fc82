"""Keras 3 callbacks: `GPUMonitor`, `StepTimer` and `BackupAndRestore`."""

from tfgpu._backup import BackupAndRestore

__all__ = ["BackupAndRestore", "GPUMonitor", "StepTimer"]
