"""The measuring core's front door (`open_workload`): a compiled model, or a function that
builds one, and its data, checked once in the same words (docs/diagnosis.md, "The model and
the data: one check"); the data's kind is a class decided once, as Keras's data adapters."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters.datasets import Batches, chain_state, read_first, source_batches
from tfgpu._internal.adapters.model_state import build
from tfgpu._internal.helpers.checks import (
    check_int,
    check_validation_split,
    invalid_type,
    invalid_value,
    short_repr,
)
from tfgpu._internal.helpers.warn import one_line
from tfgpu._internal.measure.facts import batch_facts, pipeline_facts

# What `fit` batches arrays by when no `batch_size` is given.
DEFAULT_BATCH_SIZE = 32

DATA_EXPECTED = (
    "a `tf.data.Dataset`, or arrays `x`, `(x, y)` or `(x, y, sample_weight)` (NumPy arrays "
    "or tensors, or dicts, lists or tuples of them)"
)

_PARTS = ("x", "y", "sample_weight")

# Arrays named, with their lengths, in the message on different lengths.
_SHOWN_LENGTHS = 8


def check_model(model: Any, *, from_factory: bool = False, argument: str = "model") -> keras.Model:
    """Returns `model` if it is a compiled Keras model: else TypeError, or ValueError with the
    fix, naming `argument`; `from_factory`: the messages say it came from the user's function."""
    if not isinstance(model, keras.Model):
        returns = "a function that returns " if from_factory else ""
        raise invalid_type(argument, model, returns + "a compiled `keras.Model`")
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        where = "the model the factory returned" if from_factory else "a model"
        fix = "in the factory, before returning it" if from_factory else "before passing it"
        shown = short_repr(model)
        raise invalid_value(
            argument,
            model,
            f"a compiled `keras.Model`: call `model.compile(optimizer=..., loss=...)` {fix}",
            received=f"{where} that is not compiled" + ("" if shown is None else f" ({shown})"),
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

    def facts(self) -> dict[str, Any]:
        """Its batches' and its pipeline's facts, from its input chain and graph."""
        return {**batch_facts(self.dataset), **pipeline_facts(self.dataset)}

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)`, unbatched; ValueError
        if it is empty, TimeoutError if it yields nothing for `READ_TIMEOUT_S`."""
        batched, ambiguous = source_batches(self.dataset)
        ds = self.dataset.unbatch() if batched is not None or ambiguous else self.dataset
        read = read_first(ds.take(limit).batch(limit), 1)
        if not read:
            raise _empty("example")
        element = tf.nest.map_structure(lambda t: t.numpy(), read[0])
        return keras.utils.unpack_x_y_sample_weight(element)

    def check_batches(self, model: keras.Model) -> None:
        """Refuses a dataset of single examples (from its input chain, else from the model's
        input rank) with a ValueError naming the fix; reads nothing."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(self.spec())
        shapes = [getattr(t, "shape", None) for t in tf.nest.flatten(x)]
        ranks = [None if s is None else s.rank for s in shapes]
        inputs = tf.nest.flatten(getattr(model, "inputs", None) or [])
        example_ranks = [len(t.shape) - 1 for t in inputs]  # one example per model input
        by_rank = bool(example_ranks) and ranks == example_ranks
        state = chain_state(self.dataset)[0]
        shown = [tuple(s) if s is not None and s.rank is not None else s for s in shapes]
        if by_rank and state == "batched" and 0 not in ranks:  # batches of the wrong rank
            model_shapes = [tuple(t.shape) for t in inputs]
            raise invalid_value(
                "data",
                None,
                "batches whose inputs have the rank of the model's inputs (shape "
                f"{model_shapes[0] if len(model_shapes) == 1 else model_shapes})",
                received="batches whose inputs have one dimension fewer (shape "
                f"{shown[0] if len(shown) == 1 else shown})",
            )
        if 0 in ranks or state == "examples" or by_rank:
            raise invalid_value(
                "data",
                None,
                "batches, as `fit` takes them: `dataset.batch(32)`, or "
                "`tfgpu.data.pipeline(..., batch_size=32)`",
                received="a dataset of single examples (inputs of shape "
                f"{shown[0] if len(shown) == 1 else shown})",
            )


def _split_at(n: int, validation_split: float) -> int:
    """The examples kept for training of `n` with the last `validation_split` held out, as
    `fit` splits them; ValueError when a side would be empty."""
    train = math.floor(n * (1.0 - validation_split))
    if not 0 < train < n:
        raise invalid_value(
            "validation_split",
            validation_split,
            "a split that leaves at least one example on each side: pass a validation_split "
            f"between {1 / n:.3g} and {1 - 1 / n:.3g}, or more data"
            if n > 1
            else "more data",
            received=f"validation_split={validation_split} of {n} examples gives {train} for "
            f"training and {n - train} for validation",
        )
    return train


def _rows(part: Any, start: int, stop: int | None) -> Any:
    """Examples `start` to `stop` of every array of `part` (a structure of arrays)."""
    return tf.nest.map_structure(lambda a: a[start:stop], part)


class ArrayData:
    """Arrays `x`, `(x, y)` or `(x, y, sample_weight)`, batched as `fit` batches them: the last
    `validation_split` of the examples held out (`validation`, as `fit` holds them out), the
    rest reshuffled every epoch by Keras's own array adapter."""

    from_arrays = True

    def __init__(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        num_examples: int,
        batch_size: int,
        validation_split: float | None = None,
    ):
        self.validation: tuple[Any, ...] | None = None  # `fit`'s `validation_data`
        if validation_split:
            train = _split_at(num_examples, validation_split)
            parts = [p for p in (x, y, sample_weight) if p is not None]
            self.validation = tuple(_rows(p, train, None) for p in parts)
            x, y, sample_weight = (
                None if p is None else _rows(p, 0, train) for p in (x, y, sample_weight)
            )
            num_examples = train
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.num_examples, self.batch_size = num_examples, batch_size

    def arrays(self) -> Any:
        """The training arrays as `fit` takes them: `x`, `(x, y)` or `(x, y, sample_weight)`."""
        if self.sample_weight is not None:
            return (self.x, self.y, self.sample_weight)
        return self.x if self.y is None else (self.x, self.y)

    @functools.cached_property
    def dataset(self) -> tf.data.Dataset:
        """The batches `fit` makes of the arrays (reshuffled every epoch), built on first use;
        where Keras keeps its adapter elsewhere, the same from a shuffle buffer."""
        from tfgpu._internal.adapters.keras_internals import array_batches

        n, size = self.num_examples, self.batch_size
        ds = array_batches(self.x, self.y, self.sample_weight, size)
        if ds is None:
            ds = tf.data.Dataset.from_tensor_slices(self.arrays())
            ds = ds.shuffle(n, reshuffle_each_iteration=True).batch(size).prefetch(2)
        return ds.apply(tf.data.experimental.assert_cardinality(-(-n // size)))

    def facts(self) -> dict[str, Any]:
        """Its batches' facts (known: made here) and its pipeline's, Keras's array adapter's
        (a parallel gather per batch, prefetched; nothing read from its graph, which holds
        the arrays)."""
        batches = Batches(self.batch_size, False, self.num_examples)  # as Workload.batches
        pipeline = {
            "pipeline": None, "made_by_pipeline": False, "service": False,
            "python_input": False, "prefetch": True, "parallel_map": True,
            "sequential_map": False, "cache": None, "map_after_cache": False,
            "private_threadpool_size": None,
        }  # fmt: skip
        return {**batch_facts(self.dataset, batches), **pipeline}

    def spec(self) -> Any:
        """The structure of one batch, as `tf.TensorSpec`s of its shapes (dtypes not read)."""

        def leaf_spec(a: Any) -> Any:
            return None if a is None else tf.TensorSpec((None, *tuple(a.shape)[1:]))

        return tf.nest.map_structure(leaf_spec, self.arrays())

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)` (None where absent)."""

        def cut(a: Any) -> Any:
            return None if a is None else np.asarray(a)[:limit]

        parts = (self.x, self.y, self.sample_weight)
        return tuple(None if p is None else tf.nest.map_structure(cut, p) for p in parts)  # type: ignore[return-value]

    def check_batches(self, model: keras.Model) -> None:
        """Nothing to refuse: arrays are batched here."""


def _empty(what: str = "batch") -> ValueError:
    return invalid_value("data", None, f"at least one {what}", received="an empty dataset")


def leaf_length(leaf: Any) -> int | None:
    """Examples along an array's first dimension (a ragged tensor's rows); None: a scalar."""
    shape = getattr(leaf, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    if shape[0] is None:  # a RaggedTensor's rows are always known
        return int(leaf.nrows()) if isinstance(leaf, tf.RaggedTensor) else None
    return int(shape[0])


def flatten_with_paths(path: str, value: Any) -> list[tuple[str, Any]]:
    """(path, leaf) of a nested structure: `x`, `x[0]`, `x['image']`."""
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in flatten_with_paths(f"{path}[{k!r}]", v)]
    if isinstance(value, tuple):
        return [item for i, v in enumerate(value) for item in flatten_with_paths(f"{path}[{i}]", v)]
    return [(path, value)]


def _array(path: str, value: Any, expected: str) -> Any:
    """One leaf: a tensor as it is, a list or NumPy scalar made an array (or, ragged, a
    ragged tensor), an array of numbers, bools or strings; else the TypeError."""
    if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
        return value
    if isinstance(value, list) and any(
        isinstance(v, (np.ndarray, tf.Tensor, tf.RaggedTensor)) for v in value
    ):
        expected = (
            "a tuple of arrays (e.g. `(x, y)`, one array per feature), or one array "
            "(np.stack the list first)"
        )
        raise invalid_type("data", value, expected, received=f"a list of arrays at {path}")
    if isinstance(value, (list, np.generic)) or (
        hasattr(value, "__array__") and not isinstance(value, np.ndarray)
    ):
        try:
            value = np.asarray(value)
        except ValueError:  # ragged Python lists: a RaggedTensor, one row per example
            try:
                return tf.ragged.constant(value)
            except (ValueError, TypeError) as e:
                raise invalid_value(
                    "data",
                    value,
                    "examples of one type and nesting depth; pad them or pass a `tf.data.Dataset`",
                    received=f"a list at {path} that can be made neither into one array nor "
                    f"into a ragged tensor ({e})",
                ) from None
    if not isinstance(value, np.ndarray):
        raise invalid_type("data", value, expected, received=f"a {type(value).__name__} at {path}")
    if value.dtype.kind == "O":
        odd = next((v for v in value.reshape(-1) if not isinstance(v, (str, bytes))), None)
        if odd is not None or value.size == 0:
            received = f"a NumPy array of Python objects at {path} (holding a {type(odd).__name__})"
            expected = "arrays of numbers, bools or strings; convert it with `.astype(...)` first"
            raise invalid_type("data", value, expected, received=received)
    elif value.dtype.kind not in "biufcSU":
        received = f"a NumPy array of dtype {value.dtype} at {path}"
        raise invalid_type("data", value, "arrays of numbers, bools or strings", received=received)
    return value


def checked_structure(path: str, value: Any, expected: str = DATA_EXPECTED) -> Any:
    """A nested structure of arrays (tuples and dicts of them) with each leaf checked by
    `_array`; `expected`: what a leaf of another type is told is expected."""
    if isinstance(value, (Mapping, tuple)) and not value:
        kind = "dict" if isinstance(value, Mapping) else "tuple"
        raise invalid_value(
            "data", value, "at least one array", received=f"an empty {kind} at {path}"
        )
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            received = f"a dict at {path} with keys {list(value)!r}"
            raise invalid_type("data", value, "str keys (feature names)", received=received)
        return {k: checked_structure(f"{path}[{k!r}]", v, expected) for k, v in value.items()}
    if isinstance(value, tuple):
        items = tuple(checked_structure(f"{path}[{i}]", v, expected) for i, v in enumerate(value))
        return type(value)(*items) if hasattr(value, "_fields") else items
    return _array(path, value, expected)


def check_arrays(parts: dict[str, Any], expected: str = DATA_EXPECTED) -> tuple[list[Any], int]:
    """The one array check of tfgpu (`pipeline`'s arrays and the measuring tools'): each
    named part (`{"data": data}`, or `{"x": x, "y": y}`) made a checked structure, and their
    number of examples, the same along every array's first dimension; ValueError naming each
    array that does not line up, TypeError for what no array can be made of."""
    checked = [checked_structure(name, value, expected) for name, value in parts.items()]
    lengths = [
        (path, leaf_length(leaf))
        for name, part in zip(parts, checked)
        for path, leaf in flatten_with_paths(name, part)
    ]
    scalars = [path for path, n in lengths if n is None]
    if scalars:
        received = f"a scalar (no first dimension) at {', '.join(scalars)}"
        expected = "arrays whose first dimension indexes the examples"
        raise invalid_value("data", None, expected, received=received)
    distinct = sorted({n for _, n in lengths if n is not None})
    if len(distinct) > 1:
        each = ", ".join(f"{path} has {n}" for path, n in lengths[:_SHOWN_LENGTHS])
        if len(lengths) > _SHOWN_LENGTHS:
            each += f", ... ({len(lengths)} arrays)"
        received = f"arrays of different lengths ({', '.join(map(str, distinct))} examples): {each}"
        raise invalid_value(
            "data", None, "every array with one entry per example", received=received
        )
    if distinct[0] == 0:
        raise invalid_value("data", None, "at least one example", received="arrays of 0 examples")
    return checked, distinct[0]


def _arrays_only(value: Any) -> bool:
    """Whether `value` is an array (anything with a shape), or a dict, list or tuple of them."""
    if isinstance(value, (Mapping, list, tuple)):
        items = value.values() if isinstance(value, Mapping) else value
        return bool(items) and all(_arrays_only(v) for v in items)
    return hasattr(value, "shape")


def _fit_arrays(data: Any) -> tuple[Any, Any, Any, int]:
    """(x, y, sample_weight, examples) of array data as `fit` takes it (a list as a tuple)."""
    parts = tuple(data) if isinstance(data, (list, tuple)) else (data,)
    if not parts or parts[0] is None or not all(p is None or _arrays_only(p) for p in parts):
        raise invalid_type("data", data, DATA_EXPECTED)
    if len(parts) > 3:
        received = f"a {type(data).__name__} of {len(parts)} parts"
        raise invalid_value(
            "data", data, "`x`, `(x, y)` or `(x, y, sample_weight)`", received=received
        )
    named = {name: part for name, part in zip(_PARTS, parts) if part is not None}
    checked, n = check_arrays(named)
    by_name = dict(zip(named, checked))
    return by_name["x"], by_name.get("y"), by_name.get("sample_weight"), n


def check_data(
    data: Any, *, batch_size: Any = None, validation_split: Any = None
) -> DatasetData | ArrayData:
    """Decides the kind of `data` once and checks it, before any work; reads nothing.
    `batch_size` (None: 32) batches arrays and is ignored for a dataset, as `fit` does;
    `validation_split` holds out the last share of arrays, and is refused for a dataset, as
    `fit` refuses it."""
    size = check_int("batch_size", batch_size, allow_none=True, expected="a positive int or None")
    split = check_validation_split(validation_split)
    if isinstance(data, tf.data.Dataset):
        if split is not None:
            raise invalid_value(
                "validation_split",
                validation_split,
                "None with a dataset (`fit` takes `validation_split` only for arrays): split "
                "the dataset yourself, or pass arrays",
                received=f"validation_split={validation_split!r} with a tf.data.Dataset",
            )
        return DatasetData(data)
    if isinstance(data, tf.distribute.DistributedDataset):
        raise invalid_type(
            "data",
            data,
            "a `tf.data.Dataset` of batches (pass the dataset before "
            "`strategy.experimental_distribute_dataset`, or build the pipeline without "
            "`distribute=True`)",
        )
    x, y, sample_weight, n = _fit_arrays(data)
    return ArrayData(x, y, sample_weight, n, size or DEFAULT_BATCH_SIZE, split)


def _check_labels(model: keras.Model, data: DatasetData | ArrayData) -> None:
    """Refuses inputs without labels for a model whose loss needs them (Keras's own
    `train_step`), from the data's structure: nothing is read."""
    _, y, _ = keras.utils.unpack_x_y_sample_weight(data.spec())
    custom_step = type(model).train_step is not keras.Model.train_step
    if y is None and getattr(model, "loss", None) is not None and not custom_step:
        expected = (
            "`(x, y)` or `(x, y, sample_weight)` (the model is trained as `fit` would train it)"
        )
        received = f"inputs without labels while the model was compiled with loss={model.loss!r}"
        raise invalid_value("data", None, expected, received=received)


MODEL_EXPECTED = (
    "a compiled `keras.Model`, or a function without arguments that builds and compiles one"
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A compiled model and its data, checked; `factory`: the function that built it, if given."""

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

    @property
    def batches(self) -> Batches | None:
        """What is known of the batches without reading the input chain: those of arrays
        (batched here); None for a dataset."""
        data = self.data
        if isinstance(data, ArrayData):
            return Batches(data.batch_size, False, data.num_examples)
        return None

    @property
    def fit_data(self) -> Any:
        """The training data as `fit` takes it: the arrays (less what `validation_split` held
        out), or the dataset."""
        return self.data.arrays() if isinstance(self.data, ArrayData) else self.data.dataset

    @property
    def validation(self) -> tuple[Any, ...] | None:
        """The arrays `validation_split` held out, as `fit(validation_data=)` takes them."""
        return getattr(self.data, "validation", None)

    def first_batch(self) -> tuple[Any, int | None]:
        """(the first batch, its size); reads one batch; ValueError if the dataset is empty,
        TimeoutError if it yields nothing for `READ_TIMEOUT_S`."""
        read = read_first(self.dataset, 1)
        if not read:
            raise _empty()
        first = tf.nest.flatten(read[0])[0]
        return read[0], (int(first.shape[0]) if first.shape.rank else None)

    def examples(self, limit: int) -> tuple[Any, Any, Any]:
        """The first `limit` examples as NumPy `(x, y, sample_weight)`; reads them."""
        return self.data.examples(limit)


# TensorFlow's error for a strategy scope opened inside another strategy's scope.
_MIXED_STRATEGIES = "Mixing different tf.distribute.Strategy objects"


def call_factory(
    factory: Callable[[], Any],
    strategy: Any = None,
    policy: str | None = None,
    *,
    argument: str = "model",
) -> Any:
    """The factory's model, built inside `strategy`'s scope (None: the current one) under the
    precision `policy` (None: the global one), the global policy put back. A factory that
    opens a strategy of its own is a ValueError naming `argument`; anything else the factory
    raises comes through as it is (the user's own exception)."""
    saved = keras.mixed_precision.global_policy()
    try:
        if policy is not None:
            keras.mixed_precision.set_global_policy(policy)
        with (strategy or tf.distribute.get_strategy()).scope():
            return factory()
    except RuntimeError as e:
        if not str(e).startswith(_MIXED_STRATEGIES):
            raise  # the factory's own error, as it is
        raise invalid_value(
            argument,
            factory,
            "a function that builds its model inside the strategy scope it is called in (open "
            f"no strategy scope inside it); it raised {one_line(e)}",
        ) from e
    finally:
        keras.mixed_precision.set_global_policy(saved)


SAME_MODEL = "the factory returned the same model object"


class SameModel(ValueError):
    """The factory returned the model it had returned before: nothing new was built (under the
    policy or the strategy asked). `tune` marks the candidate untried; `scaling` refuses."""


def _shapes(model: keras.Model) -> list[tuple[str, tuple[int, ...]]]:
    """(path without the model's name, shape) of each weight: `dense/kernel`, (8, 16)."""
    return [(w.path.split("/", 1)[-1], tuple(w.shape)) for w in model.weights]


def _differs(first: keras.Model, again: keras.Model) -> str:
    """How the weights of `again` differ from those of `first` in number or shapes, first
    difference first ("" when they do not)."""
    a, b = _shapes(first), _shapes(again)
    if [s for _, s in a] == [s for _, s in b]:
        return ""
    counts = [sum(int(np.prod(shape)) for _, shape in w) for w in (a, b)]
    parameters = f"{counts[0]:,} parameters, then {counts[1]:,}"
    changed = next(((i, p, x, y) for i, ((p, x), (_, y)) in enumerate(zip(a, b)) if x != y), None)
    if changed is None:
        return f"{len(a)} weights, then {len(b)}; {parameters}"
    i, path, x, y = changed
    return f"weight {i + 1} of {len(a)} (`{path}`): {x}, then {y}; {parameters}"


def build_again(
    factory: Callable[[], Any],
    first: keras.Model,
    x: Any,
    *,
    strategy: Any = None,
    policy: str | None = None,
    argument: str = "model",
) -> Any:
    """The factory's model once more (`call_factory`), built on one batch's inputs `x`, and
    checked against `first`, the model it returned before: `SameModel` if it is that object;
    a ValueError naming `argument` if its weights differ in number or shapes (the front ends
    would compare different models)."""
    model = call_factory(factory, strategy, policy, argument=argument)
    if model is first:
        raise SameModel(
            str(
                invalid_value(
                    argument,
                    factory,
                    "a function that builds and returns a new model at each call (e.g. "
                    "`def build(): model = keras.Sequential(...); model.compile(...); return "
                    "model`), not one that returns a model built before",
                    received=f"a function that returned the same model object twice "
                    f"({SAME_MODEL}: nothing was built under "
                    f"{'the policy' if policy is not None else 'the strategy'} asked)",
                )
            )
        )
    if not isinstance(model, keras.Model):
        return model  # the caller's check names it
    build(first, x)
    build(model, x)
    differs = _differs(first, model)
    if differs:
        raise invalid_value(
            argument,
            factory,
            "a function that builds the same model at each call (the measurements compare "
            "one model in several settings)",
            received=f"a function that built different models ({differs})",
        )
    return model


def open_workload(
    model: Any,
    data: Any,
    *,
    batch_size: Any = None,
    validation_split: Any = None,
    examples_ok: bool = False,
    factory_only: bool = False,
    strategy: Any = None,
    argument: str = "model",
) -> Workload:
    """Checks a model (or a function that builds one, called last, in `strategy`'s scope,
    the global policy put back) and its data together, before any work; reads no data.
    `examples_ok`: single examples are valid (the batch-size finder cuts its own batches);
    `factory_only`: a built model is refused (`scaling` builds one per strategy); `argument`:
    the front end's name for the model argument."""
    if factory_only and (isinstance(model, keras.Model) or not callable(model)):
        raise invalid_type(
            argument,
            model,
            "a function without arguments that builds and compiles the model (a model built "
            "already cannot be built again under each strategy: pass the function that "
            "builds it)",
        )
    if not isinstance(model, keras.Model) and not callable(model):
        raise invalid_type(argument, model, MODEL_EXPECTED)
    checked = check_data(data, batch_size=batch_size, validation_split=validation_split)
    factory = None if isinstance(model, keras.Model) else model
    built = model if factory is None else call_factory(factory, strategy, argument=argument)
    built = check_model(built, from_factory=factory is not None, argument=argument)
    if not examples_ok:
        checked.check_batches(built)
    _check_labels(built, checked)
    return Workload(built, checked, factory)
