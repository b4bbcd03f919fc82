"""`tfgpu.tune()`: try each speed setting on your model and data, keep what measurably helps.

The pieces, one job each: `_tune` (the entry point, its argument checks and the search),
`_candidates` (pure: which candidates from which facts, the verdicts, the lines to change),
`_trial` (one setting's timed run and the numerics guard), `_result` (`TuneResult`, `Trial`,
the table, `apply`, `tune.json` and the waterfall plot `tune.png`).
"""

from tfgpu.tuning._result import Trial, TuneResult
from tfgpu.tuning._tune import tune

__all__ = ["Trial", "TuneResult", "tune"]
