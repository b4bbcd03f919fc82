"""`tfgpu.diagnose()`: what holds the GPU back, and which knob to turn.

A short, bounded, measured run separates the input pipeline, the train step on a
device-resident batch and the two together, probes `steps_per_execution` and XLA, and reads
the dataset's graph, the model's precision and the GPU counters. The long story (the
protocol, every finding and threshold with its source) is in docs/diagnosis.md; the rooms
of this package are listed in docs/architecture.md.
"""

from __future__ import annotations

from tfgpu.diagnosis._diagnose import diagnose
from tfgpu.diagnosis._facts import PROBE_STEPS_PER_EXECUTION as PROBE_STEPS_PER_EXECUTION
from tfgpu.diagnosis._result import Diagnosis, Finding

__all__ = ["Diagnosis", "Finding", "diagnose"]
