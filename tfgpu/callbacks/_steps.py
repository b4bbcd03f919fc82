"""How many training steps an epoch really ran, for `GPUMonitor` and `StepTimer`.

Keras tells the batch hooks `begin + steps_per_execution - 1` as the last step of an
execution even when the data runs out sooner (4 batches under `steps_per_execution=16`:
"16/4" in the progress bar). With a known epoch length (`params["steps"]`) the true last
step is the smaller of the two; with an unknown one (a dataset of unknown cardinality) only
the optimizer's step counter can tell, read once at each epoch's begin and end.
"""

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
    """The model optimizer's step counter (`optimizer.iterations`), or None if unusable.

    None without an optimizer, under gradient accumulation (Keras then counts one iteration
    per accumulated update, not per step) or when the value cannot be read. Reading it waits
    for the steps already queued: call it at epoch boundaries only, never per batch. Steps a
    `LossScaleOptimizer` skips (non-finite gradients) are not counted.
    """
    try:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            return None
        for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
            if opt is not None and getattr(opt, "gradient_accumulation_steps", None):
                return None
        import keras

        value = keras.ops.convert_to_numpy(optimizer.iterations)
        return int(value)
    except Exception:  # a side figure: an optimizer we cannot read counts nothing
        return None


def steps_between(begin: int | None, end: int | None) -> int | None:
    """Steps the optimizer counted from `begin` to `end`, or None when either is unknown."""
    if begin is None or end is None or end < begin:
        return None
    return end - begin


def true_last_steps(counted: list[int], true_total: int | None) -> int | None:
    """Pure: the real number of steps of an epoch's last execution, when it ran fewer.

    Args:
        counted: list of int, the steps of each execution of the epoch, in order, as the
            batch hooks tell them (every execution full but maybe the last).
        true_total: int or None, the steps the epoch really ran (the optimizer's count).

    Returns:
        The last execution's true steps, when `true_total` makes it at least 1 and fewer than
        counted; otherwise None (nothing to correct, or a count that does not fit).

    Example:

    >>> true_last_steps([16], 4)  # 4 batches under steps_per_execution=16
    4
    """
    if true_total is None or not counted:
        return None
    last = true_total - sum(counted[:-1])
    return last if 1 <= last < counted[-1] else None
