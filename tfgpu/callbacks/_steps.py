"""How many steps an epoch really ran (why: docs/metrics.md, "Step timing")."""

from __future__ import annotations

import numbers
from typing import Any


def known_epoch_steps(params: Any) -> int | None:
    """The epoch length Keras was given (`params["steps"]`), or None when it is unknown."""
    steps = params.get("steps") if isinstance(params, dict) else None
    if isinstance(steps, numbers.Integral) and not isinstance(steps, bool) and int(steps) > 0:
        return int(steps)
    return None


def optimizer_steps(model: Any) -> int | None:
    """`optimizer.iterations`, or None without an optimizer, under gradient accumulation (it
    counts updates, not steps) or when unreadable. Reading it waits for the queued steps: call
    it at epoch boundaries only."""
    try:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            return None
        for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
            if opt is not None and getattr(opt, "gradient_accumulation_steps", None):
                return None
        import keras

        return int(keras.ops.convert_to_numpy(optimizer.iterations))
    except Exception:  # a side figure: an optimizer we cannot read counts nothing
        return None


def steps_between(begin: int | None, end: int | None) -> int | None:
    """Steps the optimizer counted from `begin` to `end`, or None when either is unknown."""
    return None if begin is None or end is None or end < begin else end - begin


def true_last_steps(counted: list[int], true_total: int | None) -> int | None:
    """The true steps of an epoch's last execution, from the steps the hooks `counted` for each
    execution and the steps the epoch really ran (`true_total`); None unless at least 1 and
    fewer than counted. `([16], 4)` (4 batches under `steps_per_execution=16`) gives 4."""
    if true_total is None or not counted:
        return None
    last = true_total - sum(counted[:-1])
    return last if 1 <= last < counted[-1] else None
