"""`tfgpu.diagnose()`: what holds the GPU back, and which knob to turn. The guide (the
protocol, every finding and threshold with its source): docs/diagnosis.md; this package's
rooms: docs/architecture.md.
"""

from __future__ import annotations

from tfgpu.diagnosis._diagnose import diagnose
from tfgpu.diagnosis._facts import PROBE_STEPS_PER_EXECUTION as PROBE_STEPS_PER_EXECUTION
from tfgpu.diagnosis._result import Diagnosis, Finding

__all__ = ["Diagnosis", "Finding", "diagnose"]
