"""`tfgpu.scaling()`: does the second GPU help? The guide is docs/scaling.md."""

from __future__ import annotations

from tfgpu.scalability._result import ScalingResult
from tfgpu.scalability._scaling import scaling

__all__ = ["ScalingResult", "scaling"]
