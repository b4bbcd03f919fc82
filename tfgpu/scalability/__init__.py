"""`tfgpu.scaling()`: does the second GPU help? The same model on 1, 2, 4, ... replicas, weak
and strong, each step split into compute, all-reduce and input, the reason named, more
replicas and machines predicted. The guide is docs/scaling.md.
"""

from __future__ import annotations

from tfgpu.scalability._result import ScalingResult
from tfgpu.scalability._scaling import scaling

__all__ = ["ScalingResult", "scaling"]
