"""GPU and host monitoring in a background thread, without TensorFlow or Keras: `Sampler`,
`record`; `METRICS`, `timeline_columns`, `aggregate_keys` and `artifact_name` name what it
records. The guide: docs/metrics.md; the rooms: docs/architecture.md."""

from __future__ import annotations

from tfgpu.monitor._metrics import METRICS, Metric, aggregate_keys, timeline_columns
from tfgpu.monitor._run_files import artifact_name
from tfgpu.monitor.sampler import Sampler, record

__all__ = [
    "METRICS", "Metric", "Sampler", "aggregate_keys", "artifact_name", "record", "timeline_columns",
]  # fmt: skip
