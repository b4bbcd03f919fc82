"""Keras 3 callbacks: `GPUMonitor`, `StepTimer` and `BackupAndRestore`, one per file.

- `gpu_monitor.py`: `GPUMonitor`, device and host metrics sampled during `fit`;
- `step_timer.py`: `StepTimer`, step time, throughput and MFU;
- `backup_and_restore.py`: `BackupAndRestore`, exact resume after a kill (loaded on first
  use);
- `_gpus.py`: which GPUs they measure and their peak FLOP/s;
- `_steps.py`: how many steps an epoch really ran (Keras numbers an execution cut short by
  the end of the data as `steps_per_execution` steps).

`GPUMonitor` and `StepTimer` are backend-agnostic (`keras.callbacks.Callback`, no TensorFlow
op on the training path) and list the keys they log, a short set by default (`GPUMonitor`
summarizes across GPUs; `per_gpu_logs=True` adds every GPU's); `docs/metrics.md` is the one
table of all keys. Place them before callbacks that read `logs` (`CSVLogger`, `TensorBoard`,
`EarlyStopping`): Keras hands the same `logs` dict to the callbacks in list order.
"""

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
