"""GPU and host monitoring in a background thread, without TensorFlow or Keras.

`Sampler` reads NVML (`pynvml`, from `nvidia-ml-py`) and `psutil` at an interval; `record`
wraps it in a `with` block; `GPUMonitor` (in `tfgpu.callbacks`) drives it from Keras `fit`.
Without TensorFlow or Keras, it runs on any machine with an NVIDIA driver (next to PyTorch).

```python
with tfgpu.monitor.record("runs/exp1", interval=0.2) as run:
    train()                      # any loop; run.mark(epoch=..., step=...) to label rows
print(run.aggregate())           # {'gpu0_util_pct_mean': ..., 'host_cpu_pct_mean': ...}
```

`METRICS` documents every recorded quantity; `timeline_columns(n)` and `aggregate_keys(n)`
name the columns and keys for `n` GPUs, `artifact_name` a run directory's files (docs/metrics.md).
"""

from __future__ import annotations

# The rooms and their reading order: docs/architecture.md.
from tfgpu.monitor._aggregates import aggregate_keys
from tfgpu.monitor._metrics import METRICS, Metric, timeline_columns
from tfgpu.monitor._run_files import artifact_name
from tfgpu.monitor.sampler import Sampler, record

__all__ = [
    "METRICS",
    "Metric",
    "Sampler",
    "aggregate_keys",
    "artifact_name",
    "record",
    "timeline_columns",
]
