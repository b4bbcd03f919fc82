"""A compiled model and its data, checked once, in the same words: the one front door of the
measuring front ends (`open_workload`; what is refused: docs/diagnosis.md, "The model and the
data: one check"). The model may come as a function that builds it, called once every other
argument is checked. The data's kind is a class, decided once, as Keras's data adapters:
`DatasetData` (the user's dataset as it is) or `ArrayData` (arrays batched as `fit` does).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters.datasets import chain_state, read_first, source_batches
from tfgpu._internal.helpers.checks import check_int, invalid_type, invalid_value, short_repr
from tfgpu._internal.helpers.warn import one_line

# What `fit` batches arrays by when no `batch_size` is given.
DEFAULT_BATCH_SIZE = 32

DATA_EXPECTED = (
    "a `tf.data.Dataset`, or arrays `x`, `(x, y)` or `(x, y, sample_weight)` (NumPy arrays "
    "or tensors, or dicts, lists or tuples of them)"
)

_PARTS = ("x", "y", "sample_weight")

# Arrays named, with their lengths, in the message on different lengths.
_SHOWN_LENGTHS = 8


def check_model(model: Any, *, from_factory: bool = False) -> keras.Model:
    """Returns `model` if it is a compiled Keras model: else TypeError, or ValueError with the
    fix; `from_factory`: the messages say it came from the user's function."""
    if not isinstance(model, keras.Model):
        expected = (
            "a function that returns a compiled `keras.Model`"
            if from_factory
            else "a compiled `keras.Model`"
        )
        raise invalid_type("model", model, expected)
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        where = "the model the factory returned" if from_factory else "a model"
        fix = "in the factory, before returning it" if from_factory else "before passing it"
        shown = short_repr(model)
        received = f"{where} that is not compiled" + ("" if shown is None else f" ({shown})")
        raise ValueError(
            f"Invalid value for argument `model`. Received: {received}. Expected a compiled "
            f"`keras.Model`: call `model.compile(optimizer=..., loss=...)` {fix}."
        )
    return model


class DatasetData:
    """A `tf.data.Dataset` the user passed, used as it is (batches; the finder takes examples)."""

    from_arrays = False

    def __init__(self, dataset: tf.data.Dataset):
        self.dataset = dataset

    @functools.cached_property
    def batch_size(self) -> int | None:
        """Examples per batch (the global batch), where the input chain says; else None."""
        batches, _ = source_batches(self.dataset)
        return None if batches is None else batches.batch_size

    def spec(self) -> Any:
        """The element spec: what one element (a batch, or an example) is made of."""
        return self.dataset.element_spec

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)` (None where absent),
        unbatched from a batched dataset; ValueError if it is empty, TimeoutError if it yields
        nothing for `READ_TIMEOUT_S`."""
        batched, ambiguous = source_batches(self.dataset)
        ds = self.dataset.unbatch() if batched is not None or ambiguous else self.dataset
        read = read_first(ds.take(limit).batch(limit), 1)
        if not read:
            raise _empty("example")
        element = read[0]
        element = tf.nest.map_structure(lambda t: t.numpy(), element)
        return keras.utils.unpack_x_y_sample_weight(element)

    def check_batches(self, model: keras.Model) -> None:
        """Refuses a dataset of single examples (from its input chain, else from the model's
        input rank) with a ValueError naming the fix; reads nothing."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(self.spec())
        shapes = [getattr(t, "shape", None) for t in tf.nest.flatten(x)]
        ranks = [None if s is None else s.rank for s in shapes]
        inputs = tf.nest.flatten(getattr(model, "inputs", None) or [])
        expected = [len(t.shape) for t in inputs]
        if (
            0 in ranks
            or chain_state(self.dataset)[0] == "examples"
            or (
                expected
                and len(expected) == len(ranks)
                and all(r is not None and r == e - 1 for r, e in zip(ranks, expected))
            )
        ):
            shown = [tuple(s) if s is not None and s.rank is not None else s for s in shapes]
            raise ValueError(
                "Invalid value for argument `data`. Received: a dataset of single examples "
                f"(inputs of shape {shown[0] if len(shown) == 1 else shown}). Expected "
                "batches, as `fit` takes them: `dataset.batch(32)`, or "
                "`tfgpu.data.pipeline(..., batch_size=32)`."
            )


class ArrayData:
    """Arrays `x`, `(x, y)` or `(x, y, sample_weight)` (each an array, a tensor, or a dict, list
    or tuple of them), batched as `fit` batches them; built by `check_data`."""

    from_arrays = True

    def __init__(self, x: Any, y: Any, sample_weight: Any, num_examples: int, batch_size: int):
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.num_examples = num_examples
        self.batch_size = batch_size

    def _element(self) -> Any:
        """One example's structure: `x`, `(x, y)` or `(x, y, sample_weight)`."""
        if self.sample_weight is not None:
            return (self.x, self.y, self.sample_weight)
        return self.x if self.y is None else (self.x, self.y)

    @functools.cached_property
    def dataset(self) -> tf.data.Dataset:
        """The batches, built on first use (it copies the arrays into a tensor)."""
        return tf.data.Dataset.from_tensor_slices(self._element()).batch(self.batch_size)

    def spec(self) -> Any:
        """The structure of one batch, as `tf.TensorSpec`s of its shapes (dtypes not read)."""

        def leaf_spec(a: Any) -> Any:
            return None if a is None else tf.TensorSpec((None, *tuple(a.shape)[1:]))

        return tf.nest.map_structure(leaf_spec, self._element())

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)` (None where absent)."""

        def cut(a: Any) -> Any:
            return None if a is None else np.asarray(a)[:limit]

        parts = (self.x, self.y, self.sample_weight)
        return tuple(None if p is None else tf.nest.map_structure(cut, p) for p in parts)  # type: ignore[return-value]

    def check_batches(self, model: keras.Model) -> None:
        """Nothing to refuse: arrays are batched here."""


def _empty(what: str = "batch") -> ValueError:
    return ValueError(
        "Invalid value for argument `data`. Received: an empty dataset. Expected at least "
        f"one {what}."
    )


def _leaves(part: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, leaf) of a part of the arrays, in `tf.nest`'s order: `x`, `x[0]`, `x['image']`."""
    if isinstance(part, dict):
        for key in sorted(part):
            yield from _leaves(part[key], f"{path}[{key!r}]")
    elif isinstance(part, (list, tuple)):
        for i, item in enumerate(part):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, part


def _check_arrays(data: Any) -> tuple[Any, Any, Any, int]:
    """(x, y, sample_weight, number of examples) of array data; TypeError when `data` is not
    array data at all, ValueError when its parts do not line up."""
    parts: tuple[Any, ...]
    if isinstance(data, (list, tuple)):
        parts = tuple(data)
    elif isinstance(data, dict) or hasattr(data, "shape"):
        parts = (data,)
    else:
        raise invalid_type("data", data, DATA_EXPECTED)
    leaves = [
        leaf
        for name, part in zip((*_PARTS, *(f"data[{i}]" for i in range(3, len(parts)))), parts)
        if part is not None
        for leaf in _leaves(part, name)
    ]
    if (parts and parts[0] is None) or not all(hasattr(a, "shape") for _, a in leaves):
        raise invalid_type("data", data, DATA_EXPECTED)
    if not parts or len(parts) > 3:
        raise ValueError(
            "Invalid value for argument `data`. Received: a "
            f"{type(data).__name__} of {len(parts)} part{'s' if len(parts) != 1 else ''}. "
            "Expected `x`, `(x, y)` or `(x, y, sample_weight)`."
        )
    scalars = [path for path, a in leaves if len(tuple(a.shape)) == 0]
    if scalars:
        raise ValueError(
            "Invalid value for argument `data`. Received: a scalar as "
            f"{', '.join(scalars)}. Expected arrays with one entry per example along their "
            "first axis."
        )
    lengths = [(path, int(a.shape[0])) for path, a in leaves]
    distinct = sorted({n for _, n in lengths})
    if len(distinct) > 1:
        each = ", ".join(f"{path} has {n}" for path, n in lengths[:_SHOWN_LENGTHS])
        if len(lengths) > _SHOWN_LENGTHS:
            each += f", ... ({len(lengths)} arrays)"
        raise ValueError(
            "Invalid value for argument `data`. Received: arrays of different lengths "
            f"({', '.join(map(str, distinct))} examples): {each}. Expected x, y (and "
            "sample_weight) with one entry per example each."
        )
    if distinct[0] == 0:
        raise ValueError(
            "Invalid value for argument `data`. Received: arrays of 0 examples. Expected at "
            "least one example."
        )
    padded = (*parts, None, None)
    return padded[0], padded[1], padded[2], distinct[0]


def check_data(data: Any, *, batch_size: Any = None) -> DatasetData | ArrayData:
    """Decides the kind of `data` once and checks it, before any work; reads nothing.
    `batch_size` (None: 32) batches arrays and is ignored for a dataset, as `fit` does.

    Example:

    >>> check_data((x, y), batch_size=64).dataset  # batches of 64
    """
    size = check_int("batch_size", batch_size, allow_none=True, expected="a positive int or None")
    if isinstance(data, tf.data.Dataset):
        return DatasetData(data)
    if isinstance(data, tf.distribute.DistributedDataset):
        raise invalid_type(
            "data",
            data,
            "a `tf.data.Dataset` of batches (pass the dataset before "
            "`strategy.experimental_distribute_dataset`, or build the pipeline without "
            "`distribute=True`)",
        )
    x, y, sample_weight, n = _check_arrays(data)
    return ArrayData(x, y, sample_weight, n, size or DEFAULT_BATCH_SIZE)


def _check_labels(model: keras.Model, data: DatasetData | ArrayData) -> None:
    """Refuses inputs without labels for a model whose loss needs them (Keras's own
    `train_step`), from the data's structure: nothing is read."""
    _, y, _ = keras.utils.unpack_x_y_sample_weight(data.spec())
    custom_step = type(model).train_step is not keras.Model.train_step
    if y is None and getattr(model, "loss", None) is not None and not custom_step:
        raise ValueError(
            "Invalid value for argument `data`. Received: inputs without labels while the "
            f"model was compiled with loss={model.loss!r}. Expected `(x, y)` or "
            "`(x, y, sample_weight)` (the model is trained as `fit` would train it)."
        )


MODEL_EXPECTED = (
    "a compiled `keras.Model`, or a function without arguments that builds and compiles one"
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A compiled model and its data (`DatasetData` or `ArrayData`), checked; `factory`: the
    function that built the model, when one was given."""

    model: keras.Model
    data: DatasetData | ArrayData
    factory: Callable[[], Any] | None = None

    @property
    def dataset(self) -> tf.data.Dataset:
        """The batches `fit` trains on: the user's dataset, or the arrays batched."""
        return self.data.dataset

    @property
    def batch_size(self) -> int | None:
        """Examples per batch (global, all replicas together), where known; else None."""
        return self.data.batch_size

    @property
    def from_arrays(self) -> bool:
        """Whether the data came as arrays (batched here) rather than a dataset."""
        return self.data.from_arrays

    def first_batch(self) -> tuple[Any, int | None]:
        """(the first batch, its size); reads one batch; ValueError if the dataset is empty,
        TimeoutError if it yields nothing for `READ_TIMEOUT_S`."""
        read = read_first(self.dataset, 1)
        if not read:
            raise _empty()
        batch = read[0]
        first = tf.nest.flatten(batch)[0]
        size = int(first.shape[0]) if first.shape.rank else None
        return batch, size

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)`; reads them."""
        return self.data.examples(limit)


def call_factory(
    factory: Callable[[], Any], strategy: Any = None, policy: str | None = None
) -> Any:
    """The factory's model, built inside `strategy`'s scope (None: the current one) under the
    precision `policy` (None: the global one), the global policy put back; a factory that
    opens a strategy of its own is a ValueError naming `model`."""
    saved = keras.mixed_precision.global_policy()
    try:
        if policy is not None:
            keras.mixed_precision.set_global_policy(policy)
        with (strategy or tf.distribute.get_strategy()).scope():
            return factory()
    except RuntimeError as e:  # TensorFlow's "Mixing different tf.distribute.Strategy objects"
        if "tf.distribute.Strategy" not in str(e):
            raise  # the factory's own error, as it is
        raise invalid_value(
            "model",
            factory,
            "a function that builds its model inside the strategy scope it is called in (open "
            f"no strategy scope inside it); it raised {one_line(e)}",
        ) from e
    finally:
        keras.mixed_precision.set_global_policy(saved)


def open_workload(
    model: Any,
    data: Any,
    *,
    batch_size: Any = None,
    examples_ok: bool = False,
    factory_only: bool = False,
    strategy: Any = None,
) -> Workload:
    """Checks a model (or a function that builds one) and its data together, before any
    work; reads no data. The function is called once, after the model's type and the data's
    kind are checked. `examples_ok`: a dataset of single examples is valid (the batch-size
    finder cuts its own batches); `factory_only`: a built model is refused (`scaling` builds
    one per strategy); `strategy`: the scope the function is called in. The global precision
    policy is put back after the function ran.

    Example:

    >>> work = open_workload(model, (x, y), batch_size=64)
    >>> work.dataset, work.batch_size, work.from_arrays
    (<_BatchDataset ...>, 64, True)
    """
    if factory_only and (isinstance(model, keras.Model) or not callable(model)):
        raise invalid_type(
            "model",
            model,
            "a function without arguments that builds and compiles the model (a model built "
            "already cannot be built again under each strategy: pass the function that "
            "builds it)",
        )
    if not isinstance(model, keras.Model) and not callable(model):
        raise invalid_type("model", model, MODEL_EXPECTED)
    checked = check_data(data, batch_size=batch_size)
    factory = None if isinstance(model, keras.Model) else model
    built = model if factory is None else call_factory(factory, strategy)
    built = check_model(built, from_factory=factory is not None)
    if not examples_ok:
        checked.check_batches(built)
    _check_labels(built, checked)
    return Workload(built, checked, factory)
