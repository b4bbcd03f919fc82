"""A compiled model and its data, checked once: the front door of `diagnose`,
`find_batch_size` and `tune`.

`check_model_and_data(model, data, batch_size=...)` refuses, before any work and in the same
words whichever function was called, a model that is not a compiled `keras.Model` and data
none of them can train on; it returns a `ModelAndData`. The data is one of two kinds, a class
each (as Keras's data adapters): `DatasetData`, the user's `tf.data.Dataset` as it is, and
`ArrayData`, arrays `x`, `(x, y)` or `(x, y, sample_weight)` (NumPy arrays, tensors, or
dicts, lists and tuples of them) batched as `fit` batches them (32 by default). The kind is
decided once; what the callers need rides on what is returned: the batched dataset, the batch
size where it is known, whether the data came as arrays, the first batch, and the examples
the batch-size finder cuts batches of any size from.

What is refused, and how:

- `model` not a `keras.Model`: `TypeError`; not compiled: `ValueError` with the fix
  (`model.compile(...)`).
- `data` of another kind (a string, a generator, a `DistributedDataset`): `TypeError`.
- arrays of different lengths: `ValueError` naming each array and its length (not
  TensorFlow's "Dimensions 64 and 16 are not compatible"); no examples; more than three
  parts.
- inputs without labels for a model compiled with a loss (and Keras's own `train_step`).
- where batches are needed (`diagnose`, `tune`), a dataset of single examples; an empty
  dataset when its first batch (or the finder's examples) is read.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters.datasets import chain_state, source_batches
from tfgpu._internal.helpers.checks import check_int, invalid_type

__all__ = [
    "ArrayData",
    "DatasetData",
    "ModelAndData",
    "check_data",
    "check_model",
    "check_model_and_data",
]

# What `fit` batches arrays by when no `batch_size` is given.
DEFAULT_BATCH_SIZE = 32

DATA_EXPECTED = (
    "a `tf.data.Dataset`, or arrays `x`, `(x, y)` or `(x, y, sample_weight)` (NumPy arrays "
    "or tensors, or dicts, lists or tuples of them)"
)

# A received value is shown as its repr up to this many characters; beyond, by its type only
# (the repr of arrays or of a model would fill the screen).
_REPR_LIMIT = 80

_PARTS = ("x", "y", "sample_weight")

# Arrays named, with their lengths, in the message on different lengths.
_SHOWN_LENGTHS = 8


def _short_repr(value: Any) -> str | None:
    """The repr of `value`, or None when it is too long to show."""
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else None


def _type_error(name: str, value: Any, expected: str) -> TypeError:
    """`invalid_type`, or the same sentence without the repr when the repr is long."""
    if _short_repr(value) is not None:
        return invalid_type(name, value, expected)
    return TypeError(
        f"Invalid type for argument `{name}`. Received: {name} of type "
        f"{type(value).__name__}. Expected {expected}."
    )


# ----------------------------------------------------------------------------------------
# The model


def check_model(model: Any, *, from_factory: bool = False) -> keras.Model:
    """Checks that `model` is a compiled Keras model; returns it.

    Args:
        model: any, what the caller passed (or what the caller's model factory returned).
        from_factory: bool, whether `model` was returned by the user's function (`tune`
            takes one): the messages then say so. Defaults to False.

    Returns:
        `model`.

    Raises:
        TypeError: if `model` is not a `keras.Model`.
        ValueError: if it is not compiled (`model.compile(...)` was not called).

    Example:

    >>> check_model(model)  # compiled: returned as is
    """
    if not isinstance(model, keras.Model):
        expected = (
            "a function that returns a compiled `keras.Model`"
            if from_factory
            else "a compiled `keras.Model`"
        )
        raise _type_error("model", model, expected)
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        where = "the model the factory returned" if from_factory else "a model"
        fix = "in the factory, before returning it" if from_factory else "before passing it"
        shown = _short_repr(model)
        received = f"{where} that is not compiled" + ("" if shown is None else f" ({shown})")
        raise ValueError(
            f"Invalid value for argument `model`. Received: {received}. Expected a compiled "
            f"`keras.Model`: call `model.compile(optimizer=..., loss=...)` {fix}."
        )
    return model


# ----------------------------------------------------------------------------------------
# The two kinds of data


class DatasetData:
    """A `tf.data.Dataset` the user passed, used as it is.

    Args:
        dataset: tf.data.Dataset, the user's data (batches; the finder takes examples too).
    """

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
        unbatched from a batched dataset; reads the dataset.

        Raises:
            ValueError: if the dataset is empty.
        """
        batched, ambiguous = source_batches(self.dataset)
        ds = self.dataset.unbatch() if batched is not None or ambiguous else self.dataset
        try:
            element = next(iter(ds.take(limit).batch(limit)))
        except StopIteration:
            raise _empty("example") from None
        element = tf.nest.map_structure(lambda t: t.numpy(), element)
        return keras.utils.unpack_x_y_sample_weight(element)

    def check_batches(self, model: keras.Model) -> None:
        """Refuses a dataset of single examples where batches are needed, from its input
        chain (an unbatched source with no batch step after it) or, where the chain cannot
        tell, from the model's input rank; reads nothing.

        Raises:
            ValueError: naming the examples' shapes and the fix (`.batch(n)`).
        """
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
    """Arrays `x`, `(x, y)` or `(x, y, sample_weight)`, one entry per example, batched as `fit`
    batches them. Built by `check_data`, which has checked the lengths.

    Args:
        x, y, sample_weight: the parts (each an array, a tensor, or a dict, list or tuple of
            them; `y` and `sample_weight` may be None).
        num_examples: int, the common length.
        batch_size: int, examples per batch of `dataset`.
    """

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
        """The batches, `tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)`; built
        on first use (it copies the arrays into a tensor)."""
        return tf.data.Dataset.from_tensor_slices(self._element()).batch(self.batch_size)

    def spec(self) -> Any:
        """The structure of one batch, as `tf.TensorSpec`s of its shapes (the batch dimension
        unknown; the dtypes are not read)."""

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
        raise _type_error("data", data, DATA_EXPECTED)
    leaves = [
        leaf
        for name, part in zip((*_PARTS, *(f"data[{i}]" for i in range(3, len(parts)))), parts)
        if part is not None
        for leaf in _leaves(part, name)
    ]
    if (parts and parts[0] is None) or not all(hasattr(a, "shape") for _, a in leaves):
        raise _type_error("data", data, DATA_EXPECTED)
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

    Args:
        data: any, what the caller passed: a `tf.data.Dataset`, or arrays `x`, `(x, y)` or
            `(x, y, sample_weight)`.
        batch_size: int or None, examples per batch for arrays (ignored for a dataset, as
            `fit` does). Defaults to None: 32.

    Returns:
        A `DatasetData` or an `ArrayData`.

    Raises:
        TypeError: if `data` is neither a dataset nor arrays (a `DistributedDataset`
            included), or `batch_size` is not an int.
        ValueError: if arrays have different lengths or no examples, or `batch_size` < 1.

    Example:

    >>> check_data((x, y), batch_size=64).dataset  # batches of 64
    """
    size = check_int("batch_size", batch_size, allow_none=True, expected="a positive int or None")
    if isinstance(data, tf.data.Dataset):
        return DatasetData(data)
    if isinstance(data, tf.distribute.DistributedDataset):
        raise _type_error(
            "data",
            data,
            "a `tf.data.Dataset` of batches (pass the dataset before "
            "`strategy.experimental_distribute_dataset`, or build the pipeline without "
            "`distribute=True`)",
        )
    x, y, sample_weight, n = _check_arrays(data)
    return ArrayData(x, y, sample_weight, n, size or DEFAULT_BATCH_SIZE)


# ----------------------------------------------------------------------------------------
# Both together


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


@dataclasses.dataclass(frozen=True)
class ModelAndData:
    """A compiled model and its data, checked: what `check_model_and_data` returns.

    Args:
        model: keras.Model, compiled.
        data: `DatasetData` or `ArrayData`, the data's kind and its behaviour.
    """

    model: keras.Model
    data: DatasetData | ArrayData

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
        """(the first batch, its size); reads one batch.

        Raises:
            ValueError: if the dataset is empty.
        """
        try:
            batch = next(iter(self.dataset))
        except StopIteration:
            raise _empty() from None
        first = tf.nest.flatten(batch)[0]
        size = int(first.shape[0]) if first.shape.rank else None
        return batch, size

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)`, unbatched where the
        data is batched; reads them.

        Raises:
            ValueError: if the dataset is empty.
        """
        return self.data.examples(limit)


def check_model_and_data(
    model: Any,
    data: Any,
    *,
    batch_size: Any = None,
    examples_ok: bool = False,
    from_factory: bool = False,
) -> ModelAndData:
    """Checks a model and its data together, before any work; reads no data.

    The one check of `diagnose`, `find_batch_size` and `tune`: the same mistake gives the
    same message whichever was called.

    Args:
        model: any, the caller's `model` argument (or what its factory returned).
        data: any, the caller's `data` argument: a `tf.data.Dataset`, or arrays `x`,
            `(x, y)` or `(x, y, sample_weight)`.
        batch_size: int or None, examples per batch for arrays. Defaults to None: 32.
        examples_ok: bool, whether a dataset of single examples is valid (the batch-size
            finder cuts its own batches). Defaults to False: batches are needed.
        from_factory: bool, whether `model` was returned by the user's function. Defaults
            to False.

    Returns:
        A `ModelAndData`.

    Raises:
        TypeError: if `model` is not a `keras.Model`, or `data` is neither a dataset nor
            arrays.
        ValueError: if the model is not compiled, arrays have different lengths or no
            examples, the data has no labels while the loss needs them, or (without
            `examples_ok`) the dataset yields single examples.

    Example:

    >>> work = check_model_and_data(model, (x, y), batch_size=64)
    >>> work.dataset, work.batch_size, work.from_arrays
    (<_BatchDataset ...>, 64, True)
    """
    model = check_model(model, from_factory=from_factory)
    checked = check_data(data, batch_size=batch_size)
    if not examples_ok:
        checked.check_batches(model)
    _check_labels(model, checked)
    return ModelAndData(model, checked)
