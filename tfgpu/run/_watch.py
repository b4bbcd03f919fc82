"""What `tfgpu run` adds to each `fit` of the script: `GPUMonitor` and `StepTimer` into the
fit's own directory, run on a copy of Keras's logs so that the script's `History`, progress bar
and callbacks see exactly what they see under `python SCRIPT.py` (docs/diagnosis.md, "Zero
changes: `tfgpu run SCRIPT.py`")."""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from pathlib import Path
from typing import Any

import keras

from tfgpu._internal.adapters import keras_internals
from tfgpu._internal.adapters.script import FitCall, Place
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.processes import raise_if_signalled, signals_received
from tfgpu._internal.helpers.warn import one_line

keras_internals.FORWARDING_MODULES.add(__name__)

# Keras's hooks that take `logs` last, handed on with a copy of it.
_HOOKS = (
    "on_train_begin", "on_train_end", "on_epoch_begin", "on_train_batch_begin",
    "on_train_batch_end", "on_test_begin", "on_test_end", "on_test_batch_begin",
    "on_test_batch_end", "on_predict_begin", "on_predict_end", "on_predict_batch_begin",
    "on_predict_batch_end",
)  # fmt: skip


class Quiet(keras.callbacks.Callback):
    """`inner` run with a copy of Keras's `logs`: what it logs stays out of the script's
    History, progress bar and callbacks; each epoch's copy is kept in `epochs`."""

    def __init__(self, inner: keras.callbacks.Callback):
        super().__init__()
        self.inner = inner
        self.async_safe = bool(getattr(inner, "async_safe", False))
        self.epochs: list[dict[str, Any]] = []

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        self.inner.set_model(model)

    def set_params(self, params: Any) -> None:
        super().set_params(params)
        self.inner.set_params(params)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        copy = dict(logs or {})
        self.inner.on_epoch_end(epoch, copy)
        self.epochs.append(copy)


def _forward(hook: str) -> Any:
    before = 0 if hook.endswith(("_train_begin", "_train_end", "_test_begin", "_test_end",
                                 "_predict_begin", "_predict_end")) else 1  # fmt: skip

    def method(self: Quiet, *args: Any, logs: Any = None) -> None:
        if len(args) > before:  # logs given by position
            args, logs = args[:before], args[before]
        getattr(self.inner, hook)(*args, logs=None if logs is None else dict(logs))

    method.__name__ = hook
    return method


for _hook in _HOOKS:
    setattr(Quiet, _hook, _forward(_hook))


class EndOnSignal(keras.callbacks.Callback):
    """Ends the `fit` at its next batch (or as it ends) once Ctrl-C, SIGTERM or SIGHUP came
    (`signals_exit`): the handler's exception can be swallowed where it is raised (a Python
    call made from TensorFlow's C++), and the script would train on for its every epoch. A
    batch-begin hook: Keras calls it without logs, so it never makes Keras wait for a step."""

    def __init__(self) -> None:
        super().__init__()
        self.since = signals_received()  # one the script caught before this fit is its own

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        raise_if_signalled(self.since)

    on_test_batch_begin = on_predict_batch_begin = on_train_batch_begin

    def on_train_end(self, logs: Any = None) -> None:  # swallowed in the last batch
        raise_if_signalled(self.since)


@dataclasses.dataclass
class FitRecord:
    """One `fit` of the script as `tfgpu run` saw it: where it was called, its directory,
    how long it ran and how it ended, and what the callbacks logged per epoch."""

    index: int
    place: Place | None
    log_dir: Path
    call: FitCall | None = None  # the model and the data, for the diagnosis at the end
    seconds: float = 0.0
    ended: str = ""  # "" when it returned, else what it raised
    added: list[Quiet] = dataclasses.field(default_factory=list)
    own: list[str] = dataclasses.field(default_factory=list)  # the script's own tfgpu callbacks
    notes: list[str] = dataclasses.field(default_factory=list)

    def epochs(self) -> list[dict[str, Any]]:
        """Each finished epoch's logs, as the added callbacks saw them (merged)."""
        count = max((len(q.epochs) for q in self.added), default=0)
        merged: list[dict[str, Any]] = [{} for _ in range(count)]
        for q in self.added:
            for i, logs in enumerate(q.epochs):
                merged[i].update(logs)
        return merged

    def figure(self, key: str) -> float:
        """The median over the finished epochs of `key` (NaN: not logged)."""
        values = [float(e[key]) for e in self.epochs() if isinstance(e.get(key), (int, float))]
        finite = [v for v in values if math.isfinite(v)]
        return stats.median(finite) if finite else math.nan


def watched_fit(call: FitCall, record: FitRecord) -> Any:
    """Runs the script's `fit` with `GPUMonitor` and `StepTimer` into `record.log_dir` (those
    the script passes already are not added twice), filling `record`; returns what `fit`
    returns. The script's list of callbacks is left as it is; what `fit` raises propagates,
    the record complete by then."""
    from tfgpu.callbacks import GPUMonitor, StepTimer

    given = call.arguments["callbacks"]
    if given is not None and not isinstance(given, (list, tuple)):
        record.notes.append(f"the script passes a {type(given).__name__}: nothing added")
        return call.run()
    theirs = list(given or [])
    for kind in (GPUMonitor, StepTimer):
        mine = [c for c in theirs if isinstance(c, kind)]
        if mine:
            where = getattr(mine[0], "log_dir", None)
            record.own.append(f"{kind.__name__} (the script's own, log_dir={where})")
            continue
        try:
            record.added.append(Quiet(kind(log_dir=record.log_dir)))
        except (OSError, ValueError, RuntimeError) as e:  # monitoring never stops training
            record.notes.append(f"{kind.__name__} not added: {one_line(e)}")
            warnings.warn(f"tfgpu run: {kind.__name__} not added: {one_line(e)}", stacklevel=2)
    start = time.monotonic()
    try:
        return call.run(callbacks=[*theirs, *record.added, EndOnSignal()])
    except BaseException as e:
        record.ended = one_line(e)
        raise
    finally:
        record.seconds = time.monotonic() - start
        keras_internals.check_fit_watches()  # the records closed now (fit may have raised)
