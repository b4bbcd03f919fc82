"""`tfgpu.tune()`: try each speed setting, keep what measurably helps (docs/tuning.md). The
names load on first use (PEP 562): `tfgpu tune` checks its arguments without TensorFlow."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfgpu.tuning._result import Trial, TuneResult
    from tfgpu.tuning._tune import tune

__all__ = ["Trial", "TuneResult", "tune"]

_WHERE = {"Trial": "_result", "TuneResult": "_result", "tune": "_tune"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
