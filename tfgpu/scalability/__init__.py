"""`tfgpu.scaling()`: does the second GPU help? The same model on 1, 2, 4, ... replicas, weak
and strong, each step split into compute, all-reduce and input, the reason named, more
replicas and machines predicted.

The guide is docs/scaling.md. The names load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfgpu.scalability._result import ScalingResult
    from tfgpu.scalability._scaling import scaling

__all__ = ["ScalingResult", "scaling"]

_WHERE = {"ScalingResult": "_result", "scaling": "_scaling"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
