"""`with preserved(model, x): ...`: a Keras model comes back as it went in (its variables, its
optimizers' and metrics'; its compile settings, train function, history and all-reduce), built
first so that the slots a first step makes are put back too."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from tfgpu._internal.adapters.all_reduce import kept
from tfgpu._internal.helpers.warn import one_line

# Put back as they were: the compile settings and what `fit` replaces.
_ATTRIBUTES = ("steps_per_execution", "jit_compile", "train_function", "history")


def build(model: Any, x: Any = None) -> None:
    """Builds `model` (on one batch's inputs `x` if unbuilt) and its optimizer, in its strategy."""
    with model.distribute_strategy.scope():
        if not model.built and x is not None:
            model(x, training=False)
        opt = getattr(model, "optimizer", None)
        if opt is not None and not getattr(opt, "built", True):
            opt.build(model.trainable_variables)


def _state_variables(model: Any) -> list[Any]:
    """Every variable of the model, its optimizer chain and its metrics, each once."""
    groups = [getattr(model, "variables", []), getattr(model, "metrics_variables", [])]
    opt = getattr(model, "optimizer", None)
    while opt is not None:
        groups.append(getattr(opt, "variables", []))
        opt = getattr(opt, "inner_optimizer", None)
    return list({id(v): v for group in groups for v in group}.values())


@contextlib.contextmanager
def preserved(model: Any, x: Any = None) -> Iterator[None]:
    """Runs the body, then puts the model's training state back (also on an exception),
    and its strategy's all-reduce; `x`, one batch's inputs, builds an unbuilt model."""
    build(model, x)
    values = [(v, np.array(v.numpy(), copy=True)) for v in _state_variables(model)]
    saved = {name: getattr(model, name, None) for name in _ATTRIBUTES}
    with kept(getattr(model, "distribute_strategy", None)):
        try:
            yield
        finally:
            for v, value in values:
                v.assign(value)
            known = {id(v) for v, _ in values}
            for m in getattr(model, "metrics", []):  # a metric with variables made since: reset
                if any(id(v) not in known for v in getattr(m, "variables", [])):
                    m.reset_state()
            # The compile settings and the train function made for them (None: fit makes one).
            for name in ("steps_per_execution", "jit_compile", "train_function"):
                setattr(model, name, saved[name])
            if saved["history"] is not None:
                model.history = saved["history"]
            model.stop_training = False


def clone_under(model: Any, strategy: Any) -> Any:
    """`model` built again inside `strategy`'s scope and compiled as it was (Keras's
    `clone_model` and the model's compile config); ValueError naming why where Keras cannot
    (a subclassed model without `get_config`, a loss or metric it cannot serialize)."""
    import keras

    try:
        with strategy.scope():
            clone = keras.models.clone_model(model)
            clone.compile_from_config(model.get_compile_config())
    except (TypeError, ValueError, NotImplementedError) as e:
        raise ValueError(f"Keras could not clone the model ({one_line(e, limit=160)})") from e
    return clone


def supports_xla(model: Any) -> bool:
    """Whether Keras accepts `jit_compile` flipped for this model (it refuses some models,
    warning and keeping the old value)."""
    current = model.jit_compile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model.jit_compile = not bool(current)
            return bool(model.jit_compile) != bool(current)
        finally:
            model.jit_compile = current


# Models `TuneResult.apply` set up, with the examples/s tune measured for them (a side
# table: nothing is written on the user's model).
_TUNED: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def note_tuned(model: Any, examples_per_s: float) -> None:
    """Records what `tune` measured for `model`'s settings, for `StepTimer` to compare."""
    _TUNED[model] = examples_per_s


def tuned_examples_per_s(model: Any) -> float | None:
    """What `tune` measured for `model`'s settings, or None where it was not tuned."""
    try:
        return _TUNED.get(model)
    except TypeError:  # not weak-referenceable: never tuned
        return None
