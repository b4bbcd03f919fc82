"""`tfgpu.tune()`: try each speed setting on your model and data, keep what measurably helps.

The pieces, one job each: `_tune` (the entry point, its argument checks and the search),
`_candidates` (pure: which candidates from which facts, the verdicts, the lines to change),
`_trial` (one setting's timed run and the numerics guard), `_result` (`TuneResult`, `Trial`,
the table, `apply`, `tune.json` and the waterfall plot `tune.png`), `_script` (`tfgpu tune
SCRIPT.py`: the settings that need a fresh process, in child processes).

The names load on first use (PEP 562), so `tfgpu tune` checks its arguments
(`_script.check_arguments`) without loading TensorFlow.
"""

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
