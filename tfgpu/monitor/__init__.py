"""GPU and host monitoring in a background thread, without TensorFlow or Keras.

`Sampler` reads NVML (`pynvml`, from `nvidia-ml-py`) and `psutil` at an interval; `record`
wraps it in a `with` block; `GPUMonitor` (in `tfgpu.callbacks`) drives it from Keras `fit`.
This package never imports TensorFlow or Keras, so it runs on any machine with an NVIDIA
driver, e.g. next to PyTorch.

```python
with tfgpu.monitor.record("runs/exp1", interval=0.2) as run:
    train()                      # any loop; run.mark(epoch=..., step=...) to label rows
print(run.aggregate())           # {'gpu0_util_pct_mean': ..., 'host_cpu_pct_mean': ...}
```

`METRICS` documents every recorded quantity (unit, NVML/psutil source, `nvidia-smi`
equivalent); `timeline_columns(n)` and `aggregate_keys(n)` give the exact column and log key
names for `n` GPUs; `artifact_name` the file names in a run directory.
"""

from __future__ import annotations

# The rooms, in reading order:
# - sampler.py: `Sampler` (the thread, the rows, the timeline) and `record`;
# - _arguments.py: the checks of their arguments (interval, gpus, log_dir);
# - _metrics.py: the table of every recorded quantity (`METRICS`, `timeline_columns`);
# - nvml.py: which GPUs exist and which this process uses (`inventory`, `visible_gpus`);
# - _gpu_reader.py: one NVML read of each GPU per sample (GPM, PCIe, energy, fallbacks);
# - host.py: the psutil reader (CPU, RSS, system memory);
# - _aggregates.py: the epoch aggregates (`aggregate_keys`), pure;
# - _run_files.py: what goes into the run directory (file names, run.json, the CSV);
# - _nvml_lib.py: importing, starting and stopping the NVML binding.
from tfgpu.monitor._metrics import METRICS, Metric
from tfgpu.monitor.sampler import (
    Sampler,
    aggregate_keys,
    artifact_name,
    record,
    timeline_columns,
)

__all__ = [
    "METRICS",
    "Metric",
    "Sampler",
    "aggregate_keys",
    "artifact_name",
    "record",
    "timeline_columns",
]
