"""Input pipelines that keep the GPU fed: build them, load TFDS data for them, measure them.

The GPU is only as fast as the data that reaches it. `pipeline()` builds a `tf.data.Dataset`
with the steps in the order that keeps an accelerator busy:

```
read (files: interleaved in parallel, shuffled by file)
  -> map_fn          per-example decode/preprocess, parallel, AUTOTUNE  (deterministic work)
  -> cache           memory or file; after the deterministic work, before any randomness
  -> shuffle         buffer sized from the data and the RAM budget; reshuffled every epoch
  -> [repeat]        only when asked (Keras `fit` iterates a finite dataset once per epoch)
  -> augment_fn      per-example random augmentation, parallel, AUTOTUNE  (new every epoch)
  -> batch           global batch; drop_remainder=True by default under a strategy
  -> batch_augment_fn  optional vectorized per-batch augmentation
  -> prefetch        AUTOTUNE, last
```

`load_tfds()` reads a TensorFlow Datasets dataset with fast reading options and fails within
seconds, with a hint, when the data is not on disk. `benchmark()` measures a pipeline alone.

The decisions (shuffle buffer, whether and where to cache, drop_remainder, sharding policy,
thread pool) are made by the pure function `_decide()` from facts about the source and the
machine; `pipeline()` applies them.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import inspect
import logging
import math
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias, overload

import numpy as np
import tensorflow as tf

from tfgpu._checks import (
    check_bool,
    check_dir,
    check_int,
    check_number,
    conflicting,
    invalid_type,
    invalid_value,
    is_int,
    is_number,
)
from tfgpu._datasets import Batches, cardinality, mark_pipeline, source_batches
from tfgpu._lazy import import_optional

__all__ = ["PipelineBenchmark", "benchmark", "load_tfds", "pipeline"]

_LOG = logging.getLogger("tfgpu")
# What `pipeline()` returns for each side: a dataset of batches, or its distributed form.
_Pipeline: TypeAlias = tf.data.Dataset | tf.distribute.DistributedDataset

_AUTOTUNE = tf.data.AUTOTUNE
_MIB = 1024 * 1024
# Shuffle buffer when nothing else limits it: large enough to mix well, small enough to fill fast.
_MAX_SHUFFLE_BUFFER = 10_000
# The shuffle buffer may take at most this fraction of the RAM budget.
_SHUFFLE_RAM_FRACTION = 0.1
# Fraction of the available host memory used as the default RAM budget.
_DEFAULT_RAM_FRACTION = 0.5
# Seed used for shuffles that must agree across workers (DATA sharding) when none is given.
_SHARED_SEED = 0
_TFDS_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(/[A-Za-z0-9_.+\-]+)?(:[0-9.*]+)?$")
_SOURCE_TYPES = (
    "a NumPy array, a tf.Tensor (ragged and sparse too), a tuple or dict of them (e.g. `(x, y)`), "
    "a `tf.data.Dataset`, "
    "a TFRecord file pattern (str or list of str), or a TensorFlow Datasets name such as 'mnist'"
)


# --------------------------------------------------------------------------------------------
# Argument checks (all run before any work)
# --------------------------------------------------------------------------------------------

_POSITIVE = "a positive integer"
# Upper bounds that keep every count inside TensorFlow's int64 (with room for products).
_MAX_COUNT = 2**62
_MAX_SEED = 2**63 - 1
_SEED = f"an int in [0, {_MAX_SEED}] or None"
# The largest RAM budget TensorFlow's int64 byte count can hold, in MiB.
_MAX_RAM_BUDGET_MIB = float(2**63 // _MIB - 1)


@dataclasses.dataclass(frozen=True)
class _Source:
    """What `pipeline()` was given, classified. Pure data."""

    kind: str  # "memory" | "dataset" | "files" | "tfds"
    value: Any  # memory: the nested structure (leaves np/tf); dataset: the Dataset;
    # files: list of file paths; tfds: the name
    num_examples: int | None = None  # memory only


def _leaf_length(leaf: Any) -> int | None:
    shape = getattr(leaf, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    if shape[0] is None:  # a RaggedTensor's rows are always known
        return int(leaf.nrows()) if isinstance(leaf, tf.RaggedTensor) else None
    return int(shape[0])


def _classify_memory(source: Any) -> _Source:
    """Checks a nested structure of arrays: supported leaves, a dimension to slice, equal lengths."""

    def to_leaf(path: str, value: Any) -> Any:
        if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
            return value
        if isinstance(value, list) and any(
            isinstance(v, (np.ndarray, tf.Tensor, tf.RaggedTensor)) for v in value
        ):
            raise TypeError(
                f"Invalid type for argument `source`. Received: a list of arrays at {path}. "
                "Expected a tuple of arrays (e.g. `(x, y)`, one array per feature), or one "
                "array (np.stack the list first)."
            )
        if isinstance(value, (list, np.generic)):
            try:
                value = np.asarray(value)
            except ValueError:  # ragged Python lists: a RaggedTensor, one row per example
                try:
                    return tf.ragged.constant(value)
                except (ValueError, TypeError) as e:
                    raise ValueError(
                        f"Invalid value for argument `source`. The list at {path} can be made "
                        f"neither into one array nor into a ragged tensor ({e}). Expected "
                        "examples of one type and nesting depth; pad them or pass a "
                        "`tf.data.Dataset`."
                    ) from None
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "O":
                odd = next((v for v in value.reshape(-1) if not isinstance(v, (str, bytes))), None)
                if odd is not None or value.size == 0:
                    raise TypeError(
                        f"Invalid type for argument `source`. Received: a NumPy array of Python "
                        f"objects at {path} (holding a {type(odd).__name__}). Expected arrays "
                        "of numbers, bools or strings; convert it with `.astype(...)` first."
                    )
            elif value.dtype.kind not in "biufcSU":
                raise TypeError(
                    f"Invalid type for argument `source`. Received: a NumPy array of dtype "
                    f"{value.dtype} at {path}. Expected arrays of numbers, bools or strings."
                )
            return value
        raise TypeError(
            f"Invalid type for argument `source`. Received: a {type(value).__name__} at {path}. "
            f"Expected {_SOURCE_TYPES}."
        )

    def walk(path: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            if not value:
                raise ValueError(
                    f"Invalid value for argument `source`. Received: an empty dict at {path}. "
                    "Expected at least one array."
                )
            keys = list(value)
            if not all(isinstance(k, str) for k in keys):
                raise TypeError(
                    f"Invalid type for argument `source`. Received: a dict at {path} with keys "
                    f"{keys!r}. Expected str keys (feature names)."
                )
            return {k: walk(f"{path}[{k!r}]", v) for k, v in value.items()}
        if isinstance(value, tuple):
            if not value:
                raise ValueError(
                    f"Invalid value for argument `source`. Received: an empty tuple at {path}. "
                    "Expected at least one array."
                )
            items = tuple(walk(f"{path}[{i}]", v) for i, v in enumerate(value))
            return type(value)(*items) if hasattr(value, "_fields") else items
        return to_leaf(path, value)

    structure = walk("source", source)
    lengths: dict[str, int | None] = {}
    for path, leaf in _flatten_with_paths("source", structure):
        lengths[path] = _leaf_length(leaf)
    scalars = [p for p, n in lengths.items() if n is None]
    if scalars:
        raise ValueError(
            f"Invalid value for argument `source`. Received: a scalar (no first dimension) at "
            f"{', '.join(scalars)}. Expected arrays whose first dimension indexes the examples."
        )
    distinct = set(lengths.values())
    if len(distinct) > 1:
        shown = ", ".join(f"{p}: {n}" for p, n in lengths.items())
        raise ValueError(
            "Invalid value for argument `source`. The arrays have different lengths "
            f"(first dimensions): {shown}. Expected every array to hold the same number of "
            "examples."
        )
    (n,) = distinct
    if n == 0:
        raise ValueError(
            "Invalid value for argument `source`. Received: arrays with 0 examples. "
            "Expected at least one example."
        )
    return _Source("memory", structure, num_examples=n)


def _flatten_with_paths(path: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in _flatten_with_paths(f"{path}[{k!r}]", v)]
    if isinstance(value, tuple):
        return [
            item for i, v in enumerate(value) for item in _flatten_with_paths(f"{path}[{i}]", v)
        ]
    return [(path, value)]


def _expand_patterns(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        files.extend(sorted(glob.glob(os.path.expanduser(pattern))))
    return [f for f in dict.fromkeys(files) if os.path.isfile(f)]


def _classify_source(source: Any) -> _Source:
    """Tells what kind of source this is, or raises `TypeError`/`ValueError`. No TF work."""
    if isinstance(source, tf.data.Dataset):
        if cardinality(source) == 0:
            raise ValueError(
                "Invalid value for argument `source`. Received: a `tf.data.Dataset` with 0 "
                "elements (cardinality 0). Expected at least one example."
            )
        return _Source("dataset", source)
    if isinstance(source, (str, bytes, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if not text.strip():
            raise invalid_value(
                "source", source, "a TFRecord file pattern or a TensorFlow Datasets name"
            )
        if os.path.isdir(os.path.expanduser(text)):
            raise ValueError(
                f"Invalid value for argument `source`. Received: source={text!r}, which is a "
                "directory. Expected TFRecord files or a glob pattern, e.g. "
                f"{os.path.join(text, '*.tfrecord')!r}; for a folder of images, use "
                "`keras.utils.image_dataset_from_directory(..., batch_size=None)` and pass "
                "its dataset."
            )
        files = _expand_patterns([text])
        if files:
            return _Source("files", files)
        if _TFDS_NAME.match(text) and not os.path.splitext(text)[1]:
            return _Source("tfds", text)
        raise FileNotFoundError(
            f"Invalid value for argument `source`. Received: source={text!r}, a file pattern "
            f"that matches no files (looked in {os.path.abspath(os.path.dirname(text) or '.')}). "
            "Expected an existing TFRecord file or glob pattern such as 'data/train-*.tfrecord'."
        )
    if (
        isinstance(source, list)
        and source
        and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        patterns = [os.fspath(s) for s in source]
        files = _expand_patterns(patterns)
        missing = [p for p in patterns if not _expand_patterns([p])]
        if missing:
            raise FileNotFoundError(
                "Invalid value for argument `source`. These file patterns match no files: "
                f"{missing}. Expected existing TFRecord files or glob patterns."
            )
        return _Source("files", files)
    if isinstance(
        source,
        (np.ndarray, np.generic, tf.Tensor, tf.RaggedTensor, tf.SparseTensor, tuple, Mapping, list),
    ):
        return _classify_memory(source)
    raise TypeError(
        f"Invalid type for argument `source`. Received: source of type "
        f"{type(source).__module__}.{type(source).__qualname__}. Expected {_SOURCE_TYPES}. "
        "For a Python generator, wrap it first with `tf.data.Dataset.from_generator`."
    )


def _check_tfds_name(name: str, data_dir: str | os.PathLike | None, arg: str = "name") -> None:
    """Raises `ValueError` for a name that no registered builder and nothing on disk knows."""
    tfds = import_optional("tensorflow_datasets")
    base = name.split(":")[0].split("/")[0]
    known = tfds.list_builders(with_community_datasets=False)
    if base in known:
        return
    root = os.fspath(data_dir) if data_dir is not None else _tfds_default_dir()
    if os.path.isdir(os.path.join(root, base)):  # prepared elsewhere, copied here
        return
    close = difflib.get_close_matches(base, known, n=3)
    hint = f" Did you mean: {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"Invalid value for argument `{arg}`. Received: {arg}={name!r}, which is neither a "
        f"TensorFlow Datasets builder nor a dataset prepared in {root}.{hint} Expected one of "
        "`tfds.list_builders()` or a file pattern that matches files."
    )


def _tfds_default_dir() -> str:
    tfds = import_optional("tensorflow_datasets")
    try:
        return os.fspath(tfds.core.constants.data_dir())
    except Exception:  # older/newer layouts
        return os.path.expanduser(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))


def _check_cache(cache: Any) -> tuple[Any, str | None]:
    """Checks `cache`; returns it (a file prefix user-expanded) and the prefix's directory."""
    expected = "'auto', True or 'memory' (in memory), a file path prefix (on disk), or False"
    if cache is None or isinstance(cache, bool) or cache in ("auto", "memory"):
        return cache, None
    if not isinstance(cache, (str, os.PathLike)) or isinstance(os.fspath(cache), bytes):
        raise invalid_type("cache", cache, expected)
    text = os.fspath(cache)
    if not text.strip():
        raise invalid_value("cache", cache, expected)
    prefix = os.path.expanduser(text)
    if prefix.endswith(os.sep) or os.path.isdir(prefix):
        raise ValueError(
            f"Invalid value for argument `cache`. Received: cache={text!r}, which is a "
            "directory. Expected a file path prefix inside a directory, e.g. "
            f"{os.path.join(prefix, 'train-cache')!r} (TensorFlow writes PREFIX.index and "
            "PREFIX.data-*)."
        )
    directory = os.path.dirname(os.path.abspath(prefix))
    for parent in (directory, *(str(p) for p in Path(directory).parents)):
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise ValueError(
                f"Invalid value for argument `cache`. Received: cache={text!r}, which is under "
                f"the file {parent!r}. Expected a path prefix in a directory."
            )
    if not os.path.isdir(directory):
        raise ValueError(
            f"Invalid value for argument `cache`. Received: cache={text!r}, but the "
            f"directory {directory} does not exist. Expected a path prefix in an existing "
            "directory."
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(
            f"Invalid value for argument `cache`. Received: cache={text!r}, but the "
            f"directory {directory} is not writable. Expected a path prefix in a directory "
            "this process can write to."
        )
    return prefix, directory


def _compression_of(head: bytes) -> str:
    """ "GZIP", "ZLIB" or "" (none): what the first bytes of a file decompress as."""
    import zlib

    for kind, wbits in (("GZIP", 16 + zlib.MAX_WBITS), ("ZLIB", zlib.MAX_WBITS)):
        try:
            zlib.decompressobj(wbits).decompress(head, 1)
        except zlib.error:
            continue
        return kind
    return ""


def _check_compression(files: list[str], compression_type: str) -> None:
    """Raises ValueError when the first file's bytes contradict `compression_type`.

    Reading a GZIP file as plain TFRecords (or the reverse) fails only when iterated, with a
    `DataLossError` that names neither the file nor the argument.
    """
    path = files[0]
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise ValueError(
            f"Invalid value for argument `source`. Cannot read {path!r} ({e.strerror}). "
            "Expected readable TFRecord files."
        ) from None
    if not head:
        return  # an empty file holds no records, in any compression
    found = _compression_of(head)
    if found == compression_type or (found == "ZLIB" and compression_type == ""):
        return  # a plain TFRecord that happens to parse as zlib is left to TensorFlow
    shown = {"GZIP": "GZIP-compressed", "ZLIB": "ZLIB-compressed", "": "not compressed"}
    raise ValueError(
        f"Invalid value for argument `compression_type`. Received: "
        f"compression_type={compression_type or None!r}, but {path!r} is {shown[found]}. "
        f"Expected the files' compression: pass compression_type={found or None!r}."
    )


def _batched_source_plan(
    batches: Batches,
    *,
    requested: int | None,
    batch_size: int | None,
    per_replica_batch_size: int | None,
    per_example: list[str],
    drop_remainder: bool | None,
    num_replicas: int,
) -> tuple[bool, int | None]:
    """Whether to keep a batched source's batches; returns (keep, batch_size for `_decide`).

    Kept when they already are what was asked for: no batch size given or the same one, no
    per-example work (`map_fn`, `augment_fn`, `shuffle_buffer`), and no `drop_remainder=True`
    that partial batches would break. Else the source is unbatched and batched again.
    """
    size = batches.batch_size
    full = batches.drop_remainder is True
    keep = (
        (requested is None or requested == size)
        and not per_example
        and not (drop_remainder and not full)
    )
    shown = "of unknown size" if size is None else f"of {size}"
    if keep:
        if size is not None and size % num_replicas:
            raise ValueError(
                f"Invalid value for argument `source`. Received: a dataset already batched in "
                f"batches of {size}, which do not split evenly over the strategy's "
                f"{num_replicas} replicas. Expected batches that are a multiple of "
                f"{num_replicas}: pass batch_size={max(1, size // num_replicas) * num_replicas} "
                "to rebatch it."
            )
        _LOG.info(
            "tfgpu.data.pipeline: the dataset passed in is already batched (batches %s); its "
            "batches are kept as they are (order, shuffling and the last partial batch are "
            "its own). Pass batch_size to rebatch it.",
            shown,
        )
        return True, size
    if requested is None:
        if size is None:
            raise ValueError(
                "Invalid arguments `batch_size` and `per_replica_batch_size`. Received: "
                f"batch_size=None, per_replica_batch_size=None with {', '.join(per_example)} "
                "for a dataset that is already batched in batches of unknown size. Expected a "
                "`batch_size`: the source is unbatched and batched again at that size."
            )
        batch_size = size
    reason = (
        f"batch_size {requested} asked for"
        if requested is not None and requested != size
        else f"per-example work ({', '.join(per_example)})"
        if per_example
        else "drop_remainder=True"
    )
    examples = (
        f"{batches.num_examples} examples" if batches.num_examples is not None else "its examples"
    )
    _LOG.info(
        "tfgpu.data.pipeline: the dataset passed in is already batched (batches %s); it is "
        "unbatched and %s are batched again (%s).",
        shown,
        examples,
        reason,
    )
    return False, batch_size if per_replica_batch_size is None else None


def _call_text(name: str, spec: Any) -> tuple[int, str]:
    """How tf.data calls a function on elements of `spec`: (positional arguments, a picture)."""
    if type(spec) is tuple:  # tf.data unpacks plain tuples only (not namedtuples, not dicts)
        names = ", ".join(f"c{i}" for i in range(len(spec)))
        return len(spec), f"{name}({names}), one argument per component of the tuple"
    what = "dict" if isinstance(spec, Mapping) else "element"
    return 1, f"{name}({what}), with the whole {what} as one argument"


def _check_arity(name: str, fn: Callable, spec: Any, what: str) -> None:
    """Raises TypeError when `fn` cannot take the arguments tf.data will call it with.

    Callables whose signature Python cannot read (some builtins, C extensions) are let
    through; Keras layers and `tf.function`s have readable ones.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    count, call = _call_text(name, spec)
    try:
        signature.bind(*range(count))
    except TypeError as e:
        label = getattr(fn, "__name__", None) or type(fn).__name__
        raise TypeError(
            f"Invalid type for argument `{name}`. Received: {name}={label}{signature}, which "
            f"cannot be called with {count} positional argument(s) ({e}). tf.data calls it "
            f"on {what} as {call}; the element is {spec}. Expected a function of {count} "
            "argument(s)" + (" (e.g. `lambda x, y: ...`)" if count == 2 else "") + "."
        ) from None


def _map(ds: tf.data.Dataset, name: str, fn: Callable, deterministic: bool | None) -> Any:
    """`ds.map(fn)` in parallel; an error while tracing `fn` says which argument it was.

    A function that returns nothing (None, or an empty tuple/dict: a missing `return`) is
    refused with a `TypeError` naming the argument, instead of tf.data's "Length for attr
    'output_types' of 0".
    """
    what = "batch" if name.startswith("batch_") else "example"
    empty: list[Any] = []  # what `fn` returned when it returned nothing

    def checked(*args: Any) -> Any:
        out = fn(*args)
        if out is None or not tf.nest.flatten(out):
            empty.append(out)
            return tf.constant(0)  # a placeholder so tracing ends; refused below
        return out

    try:
        mapped = ds.map(checked, num_parallel_calls=_AUTOTUNE, deterministic=deterministic)
    except Exception as e:
        e.add_note(f"tfgpu.data.pipeline: raised while tracing `{name}` on {ds.element_spec}.")
        raise
    if empty:
        raise TypeError(
            f"Invalid type for argument `{name}`. Received: {name}={_label(fn)}, which "
            f"returned {empty[0]!r} on the {what} {ds.element_spec}. Expected a function that "
            f"returns the new {what} (e.g. `return x, y`): is a `return` missing?"
        )
    return mapped


# --------------------------------------------------------------------------------------------
# Validation split and map_fn output checks
# --------------------------------------------------------------------------------------------

# Hash buckets for the split of TFRecord files: a record is validation when its bucket is below
# `validation_split * _SPLIT_BUCKETS`; Fingerprint64 of the serialized bytes, so the split is the
# same every epoch, in every file order and on every worker.
_SPLIT_BUCKETS = 1 << 20
_VALIDATION_SPLIT = "a float in (0, 1), e.g. 0.1, or None"


def _check_validation_split(value: Any) -> float | None:
    """Checks `validation_split`: None, or a finite number strictly between 0 and 1."""
    if value is None:
        return None
    if not is_number(value):
        raise invalid_type("validation_split", value, _VALIDATION_SPLIT)
    # A NumPy float as the user wrote it: np.float32(0.2) is 0.2, not 0.20000000298.
    number = float(str(value)) if isinstance(value, np.floating) else float(value)
    if not math.isfinite(number) or not 0.0 < number < 1.0:
        raise invalid_value("validation_split", value, _VALIDATION_SPLIT)
    return number


def _split_counts(n: int, validation_split: float) -> tuple[int, int]:
    """(train, validation) examples: the last `validation_split` of `n`, as Keras `fit` takes it."""
    split_at = math.floor(n * (1.0 - validation_split))
    return split_at, n - split_at


def _check_split_counts(
    n: int,
    validation_split: float,
    global_batch: int | None,
    drop_remainder: bool,
    validation_drop_remainder: bool,
) -> tuple[int, int]:
    """Raises ValueError when a side of the split has no example, or no full batch to keep.

    `drop_remainder` is the training side's, `validation_drop_remainder` the validation
    side's (True only when the user passed `drop_remainder=True`).
    """
    train, validation = _split_counts(n, validation_split)
    shown = (
        f"validation_split={validation_split} of {n} examples gives {train} for training "
        f"and {validation} for validation"
    )
    if not train or not validation:
        raise ValueError(
            f"Invalid value for argument `validation_split`. Received: {shown}. Expected a "
            "split that leaves at least one example on each side: pass a validation_split "
            f"between {1 / n:.3g} and {1 - 1 / n:.3g}, or more data."
        )
    if global_batch:
        short = [
            f"{side} ({count} examples)"
            for side, count, drops in (
                ("training", train, drop_remainder),
                ("validation", validation, validation_drop_remainder),
            )
            if drops and count < global_batch
        ]
        if short:
            raise ValueError(
                f"Invalid value for argument `validation_split`. Received: {shown}, but "
                f"drop_remainder=True drops partial batches of the global batch of "
                f"{global_batch}, so {' and '.join(short)} would yield no batch at all. "
                "Expected each side to hold at least one global batch: pass another "
                "validation_split, a smaller batch size, drop_remainder=False, or more data."
            )
    return train, validation


def _reshuffles(ds: tf.data.Dataset) -> bool:
    """Whether a step in `ds`'s input chain reshuffles every iteration (a Keras loader's shuffle)."""
    stack, seen = [ds], 0
    while stack and seen < 10_000:
        step = stack.pop()
        seen += 1
        if "shuffle" in type(step).__name__.lower() and bool(
            getattr(step, "_reshuffle_each_iteration", False)
        ):
            return True
        try:
            stack.extend(step._inputs())
        except Exception:  # a dataset class without the private accessor: nothing more known
            continue
    return False


def _refuse_dataset_split(reason: str, validation_split: float) -> ValueError:
    return ValueError(
        f"Invalid value for argument `validation_split`. Received: validation_split="
        f"{validation_split} for a `tf.data.Dataset` {reason}. Expected a dataset whose "
        "examples come in the same order every pass, and a known number of them. Split with "
        "the loader instead, e.g. `train_ds, val_ds = keras.utils.image_dataset_from_directory("
        f'..., validation_split={validation_split}, subset="both", seed=1337)` and a '
        "`tfgpu.data.pipeline(...)` for each (validation with shuffle=False); or load it with "
        "shuffle=False, if its order is already mixed (a class-folder loader lists files class "
        "by class, so its last examples would all be of the last class)."
    )


def _in_validation(threshold: int) -> Callable:
    """A `filter` predicate on serialized records: True for the validation share."""

    def predicate(record: tf.Tensor) -> tf.Tensor:
        return tf.strings.to_hash_bucket_fast(record, _SPLIT_BUCKETS) < threshold

    return predicate


def _tfds_slices(split: str, num_examples: int, validation_split: float) -> tuple[str, str]:
    """TFDS split strings for (train, validation): the last `validation_split` by count."""
    train, _ = _split_counts(num_examples, validation_split)
    return f"{split}[:{train}]", f"{split}[{train}:]"


def _label(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _on_a_batch(fn: Callable, spec: Any) -> dict[str, Any] | None:
    """What `fn` returns when traced on a batch of 3 examples: {path: spec}, or None.

    Functions written for one example (decode_jpeg, parse_single_example) fail to trace on a
    vector of records (None); a function written for batches (`TextVectorization` after
    `expand_dims`) returns leaves whose first dimension follows the batch (3 or unknown).
    """

    def batched(s: Any) -> Any:
        if isinstance(s, tf.TensorSpec):
            return tf.TensorSpec([3, *s.shape], s.dtype)
        return s

    args = tf.nest.map_structure(batched, spec)
    args = args if type(args) is tuple else (args,)
    try:
        function = tf.function(lambda *a: fn(*a), autograph=False)
        outputs = function.get_concrete_function(*args).structured_outputs
    except Exception:
        return None
    specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t, outputs
    )
    return dict(_flatten_with_paths("element", specs))


def _unknown_size(spec: Any) -> bool:
    return isinstance(spec, tf.TensorSpec) and (
        spec.shape.rank is None or any(d is None for d in spec.shape.as_list())
    )


def _check_map_output(map_fn: Callable, spec_in: Any, spec_out: Any) -> bool:
    """Raises for a map_fn that returns batches of one; warns for shapes a batch cannot stack.

    Returns whether the batches must be ragged: `map_fn` gets the rows of a ragged feature as
    dense tensors, and what it returns for them is batched ragged again, as without it.
    """
    leaves_in = tf.nest.flatten(spec_in)
    out = _flatten_with_paths("element", spec_out)
    pairs: list[tuple[Any, str, Any]] = []
    try:
        tf.nest.assert_same_structure(spec_in, spec_out, check_types=False)
        pairs = [(a, p, b) for a, (p, b) in zip(leaves_in, out, strict=True)]
    except (TypeError, ValueError):
        if len(leaves_in) == 1:
            pairs = [(leaves_in[0], p, b) for p, b in out]
    suspects = [
        (p, a, b)
        for a, p, b in pairs
        if isinstance(a, tf.TensorSpec)
        and a.shape.rank == 0
        and isinstance(b, tf.TensorSpec)
        and b.shape.rank is not None
        and b.shape.rank >= 2
        and b.shape[0] in (1, None)
    ]
    if suspects:  # a batch of one, unless the function fails on a batch or keeps the 1
        probe = _on_a_batch(map_fn, spec_in) or {}
        suspects = [
            (p, a, b)
            for p, a, b in suspects
            if isinstance(probe.get(p), tf.TensorSpec)
            and probe[p].shape.rank
            and probe[p].shape[0] != 1
        ]
    if suspects:
        path, a, b = suspects[0]
        shape = tuple(b.shape.as_list())
        raise ValueError(
            f"Invalid value for argument `map_fn`. Received: map_fn={_label(map_fn)}, which "
            f"turns one example's {path} of shape {tuple(a.shape.as_list())} into shape "
            f"{shape}: a batch of one, not one example, so batches would be "
            f"(batch, {', '.join(str(d) for d in shape)}). `map_fn` runs on one example at a "
            "time. Expected a per-example function; pass a function written for batches (such "
            "as `TextVectorization` after `tf.expand_dims(text, -1)`) as `batch_map_fn=` "
            "instead, which runs on whole batches after batching."
        )
    ragged = {p for a, p, b in pairs if isinstance(a, tf.RaggedTensorSpec) and _unknown_size(b)}
    variable = [
        f"{p} {tuple(b.shape.as_list()) if b.shape.rank is not None else '(unknown rank)'}"
        for p, b in out
        if _unknown_size(b) and p not in ragged
    ]
    if variable:
        warnings.warn(
            f"tfgpu.data.pipeline: `map_fn` ({_label(map_fn)}) returns examples of unknown size "
            f"at {', '.join(variable)}; a batch fails at run time when examples differ in "
            "size. Give them a fixed size in map_fn (`TextVectorization(..., "
            "output_sequence_length=N)`, `tf.image.resize`), return a `tf.RaggedTensor`, or "
            "vectorize whole batches with `batch_map_fn=`.",
            stacklevel=3,
        )
    return bool(ragged)


# --------------------------------------------------------------------------------------------
# Pure decisions
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What is known about the data and the machine when the plan is made."""

    kind: str
    num_examples: int | None  # None: unknown; -1: infinite
    element_bytes: int | None  # bytes of one example after map_fn, None when not static
    num_files: int | None
    has_map_fn: bool
    map_fn_random_ops: tuple[str, ...]
    num_replicas: int
    num_workers: int
    has_gpu: bool
    cpu_count: int
    ram_budget_bytes: int
    free_disk_bytes: int | None  # at the cache path, when caching to a file
    batched: bool = False  # the source's batches are kept: num_examples counts batches
    # A dataset passed in, split by position (take/skip): every worker must read all of it.
    split_by_position: bool = False


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How the pipeline will be built. Produced by `_decide`, applied by `_apply`."""

    global_batch_size: int
    drop_remainder: bool
    shuffle_buffer: int | None  # None: no shuffle
    shuffle_seed: int | None
    cache: str | None  # None, "memory", or a file path
    cache_bytes: int | None
    deterministic: bool
    shard_policy: str  # name of tf.data.experimental.AutoShardPolicy member
    private_threadpool_size: int
    notes: tuple[str, ...] = ()


def _human(nbytes: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", _MIB), ("KiB", 1024)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"


def _decide(
    facts: _Facts,
    *,
    batch_size: int | None,
    per_replica_batch_size: int | None,
    cache: Any,
    shuffle: bool,
    shuffle_buffer: int | None,
    drop_remainder: bool | None,
    deterministic: bool | None,
    seed: int | None,
    has_strategy: bool,
    private_threadpool_size: int | None,
    repeat: bool = False,
) -> _Plan:
    """Turns facts about the data and machine plus the user's wishes into a `_Plan`. Pure.

    Raises:
        ValueError: if the cache cannot fit (RAM budget, free disk), would never complete
            (infinite source), or the global batch does not split evenly over the replicas.
    """
    notes: list[str] = []
    # Batch: global = per replica x replicas.
    if per_replica_batch_size is not None:
        global_batch = per_replica_batch_size * facts.num_replicas
        arg, value = "per_replica_batch_size", per_replica_batch_size
    else:
        global_batch = int(batch_size or 0)  # 0: a kept source's batches of unknown size
        arg, value = "batch_size", global_batch
        if has_strategy and global_batch % facts.num_replicas and not facts.batched:
            raise ValueError(
                f"Invalid value for argument `batch_size`. Received: batch_size={global_batch}, "
                f"which does not split evenly over the strategy's {facts.num_replicas} replicas. "
                f"Expected a multiple of {facts.num_replicas}, e.g. "
                f"batch_size={max(1, global_batch // facts.num_replicas) * facts.num_replicas}, "
                "or pass `per_replica_batch_size` instead."
            )
    if facts.num_examples == 0:
        raise ValueError(
            "Invalid value for argument `source`. Received: a source with 0 "
            f"{'batches' if facts.batched else 'examples'}. Expected at least one example."
        )
    if drop_remainder is None:
        drop_remainder = has_strategy
    finite = facts.num_examples is None or facts.num_examples >= 0
    n = facts.num_examples
    if (
        drop_remainder
        and not repeat
        and not facts.batched
        and n is not None
        and 0 < n < global_batch
    ):
        split = (
            f" ({global_batch // facts.num_replicas} per replica x {facts.num_replicas} replicas)"
            if has_strategy
            else ""
        )
        raise ValueError(
            f"Invalid value for argument `{arg}`. Received: {arg}={value}, a global batch of "
            f"{global_batch}{split}, but the source has only {n} examples and "
            "drop_remainder=True drops the partial batch, so the pipeline would yield no batch "
            f"at all. Expected a global batch of at most {n}: pass a smaller `{arg}`, "
            "drop_remainder=False, or more data."
        )

    # Sharding: DATA for in-memory data (every worker reads all, keeps its share), FILE for
    # file sources with at least one file per worker. Unknown (user's dataset): AUTO.
    if facts.kind == "memory":
        shard_policy = "DATA"
    elif facts.kind in ("files", "tfds"):
        if facts.num_files is not None and facts.num_files >= facts.num_workers:
            shard_policy = "FILE"
        else:
            shard_policy = "DATA"
            if facts.num_workers > 1:
                notes.append(
                    f"{facts.num_files} file(s) for {facts.num_workers} workers: sharding by "
                    "example (DATA), each worker reads every file"
                )
    elif facts.split_by_position:
        # take/skip count examples of the whole dataset: under FILE sharding (what AUTO
        # becomes for a file-reading dataset) each worker would apply them to its own files.
        shard_policy = "DATA"
    else:
        shard_policy = "AUTO"
    data_sharded = facts.num_workers > 1 and shard_policy in ("DATA", "AUTO")

    # Determinism: DATA sharding keeps every k-th element, so all workers must see the same
    # order: a deterministic pipeline and the same shuffle seed. Unshuffled data keeps its
    # order (predictions must line up with labels), and a seed asks for a reproducible run.
    if deterministic is None:
        deterministic = data_sharded or not shuffle or seed is not None
    if data_sharded and seed is None and shuffle:
        seed = _SHARED_SEED
        notes.append(f"shuffle seeded with {_SHARED_SEED} so every worker shards the same order")

    # Cache: after map_fn (deterministic work), before shuffle/augment (random work).
    cache_plan: str | None = None
    cache_bytes = None
    if facts.element_bytes is not None and facts.num_examples is not None and finite:
        cache_bytes = facts.element_bytes * facts.num_examples
    if cache is None or cache is False:
        cache_plan = None
    elif cache == "auto":
        if facts.map_fn_random_ops:
            notes.append(
                "not cached: map_fn contains random ops "
                f"({', '.join(facts.map_fn_random_ops)}); move them to augment_fn"
            )
        elif not finite:
            notes.append("not cached: the source is infinite")
        elif facts.kind in ("memory", "dataset") and not facts.has_map_fn:
            pass  # already in memory / may hold the user's own randomness: nothing to gain
        elif cache_bytes is None:
            notes.append("not cached: the cache size cannot be estimated (dynamic shapes)")
        elif cache_bytes > facts.ram_budget_bytes:
            notes.append(
                f"not cached: {_human(cache_bytes)} exceeds the RAM budget "
                f"{_human(facts.ram_budget_bytes)}"
            )
        else:
            cache_plan = "memory"
    else:
        target = "memory" if cache is True or cache == "memory" else os.fspath(cache)
        if not finite:
            raise ValueError(
                f"Invalid value for argument `cache`. Received: cache={cache!r} for an infinite "
                "source: the cache would never complete. Expected cache=False, or a finite "
                "source (repeat with `repeat=True`, which comes after the cache)."
            )
        if target == "memory" and cache_bytes is not None and cache_bytes > facts.ram_budget_bytes:
            raise ValueError(
                f"Invalid value for argument `cache`. Received: cache={cache!r}, but the cache "
                f"would take about {_human(cache_bytes)} ({facts.num_examples} examples x "
                f"{_human(facts.element_bytes or 0)}), more than the RAM budget of "
                f"{_human(facts.ram_budget_bytes)}. Expected a cache that fits: pass a file path "
                "(cache='/fast/disk/cache'), raise `ram_budget_mib`, or cache smaller decoded "
                "examples (e.g. resize in map_fn)."
            )
        if (
            target != "memory"
            and cache_bytes is not None
            and facts.free_disk_bytes is not None
            and cache_bytes > facts.free_disk_bytes
        ):
            raise ValueError(
                f"Invalid value for argument `cache`. Received: cache={cache!r}, but the cache "
                f"would take about {_human(cache_bytes)} and only "
                f"{_human(facts.free_disk_bytes)} is free there. Expected a path on a disk "
                "with enough free space."
            )
        if facts.map_fn_random_ops:
            notes.append(
                "cache after a map_fn with random ops "
                f"({', '.join(facts.map_fn_random_ops)}) repeats them every epoch"
            )
        cache_plan = target

    # Shuffle buffer: the whole dataset when small, else capped by count and by RAM.
    buffer: int | None = None
    if shuffle and not facts.batched:  # a kept source's order and shuffling are its own
        if shuffle_buffer is not None:
            buffer = shuffle_buffer
        else:
            buffer = _MAX_SHUFFLE_BUFFER
            if facts.num_examples is not None and facts.num_examples > 0:
                buffer = min(buffer, facts.num_examples)
            if facts.element_bytes:
                by_ram = int(facts.ram_budget_bytes * _SHUFFLE_RAM_FRACTION // facts.element_bytes)
                buffer = max(min(buffer, by_ram), min(buffer, global_batch), 1)

    # tf.data's own thread pool on GPU hosts, so input threads do not queue behind the
    # runtime's inter-op work that launches GPU kernels.
    if private_threadpool_size is None:
        private_threadpool_size = facts.cpu_count if facts.has_gpu else 0

    return _Plan(
        global_batch_size=global_batch,
        drop_remainder=bool(drop_remainder),
        shuffle_buffer=buffer,
        shuffle_seed=seed,
        cache=cache_plan,
        cache_bytes=cache_bytes,
        deterministic=bool(deterministic),
        shard_policy=shard_policy,
        private_threadpool_size=private_threadpool_size,
        notes=tuple(notes),
    )


# Validation examples of unknown size (dynamic shapes) cached in memory by `cache="auto"`
# when at most this many: a few hundred MiB even for decoded images.
_SMALL_VALIDATION = 2_000


def _validation_plan(
    plan: _Plan,
    facts: _Facts,
    *,
    cache: Any,
    drop_remainder: bool | None,
    num_examples: int | None,
    element_bytes: int | None,
) -> _Plan:
    """The validation side's plan from the training side's. Pure.

    No shuffle, deterministic; partial batches kept unless the user passed
    `drop_remainder=True` (Keras evaluates a partial batch correctly under a strategy, and
    dropping it would leave validation examples out). The same cache (a file cache at
    `<prefix>-validation`); where the training side has none and `cache="auto"`, the
    validation examples are cached in memory when their estimated size fits the RAM budget
    (or, size unknown, they are at most `_SMALL_VALIDATION`), so later passes do not read the
    source again (for a dataset passed in, `skip` would run its steps on every training
    example). Not when `map_fn` has random ops, nor for arrays without `map_fn` (already in
    memory).
    """
    val_cache = plan.cache if plan.cache in (None, "memory") else f"{plan.cache}-validation"
    if (
        val_cache is None
        and cache == "auto"
        and not facts.map_fn_random_ops
        and not (facts.kind == "memory" and not facts.has_map_fn)
        and num_examples is not None
    ):
        size = element_bytes * num_examples if element_bytes is not None else None
        if (size is not None and size <= facts.ram_budget_bytes) or (
            size is None and num_examples <= _SMALL_VALIDATION
        ):
            val_cache = "memory"
    return dataclasses.replace(
        plan,
        shuffle_buffer=None,
        deterministic=True,
        drop_remainder=drop_remainder is True,
        cache=val_cache,
        cache_bytes=None,
    )


# --------------------------------------------------------------------------------------------
# Facts (thin, read-only)
# --------------------------------------------------------------------------------------------


def _element_bytes(spec: Any) -> int | None:
    total = 0
    for s in tf.nest.flatten(spec):
        if (
            not isinstance(s, tf.TensorSpec)
            or not s.shape.is_fully_defined()
            or s.dtype in (tf.string, tf.variant, tf.resource)
        ):
            return None
        total += s.shape.num_elements() * s.dtype.size
    return total


def _random_ops(fn: Callable, spec: Any) -> tuple[str, ...]:
    """Op types with "Random" in their name that `fn` would run on one example (traced only)."""
    args = spec if isinstance(spec, tuple) else (spec,)
    try:
        graph_def = tf.function(lambda *a: fn(*a)).get_concrete_function(*args).graph.as_graph_def()
    except Exception:  # a function we cannot trace alone; tf.data will report real errors
        return ()
    ops = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        ops.update(node.op for node in function.node_def)
    return tuple(sorted(op for op in ops if "Random" in op))


def _ram_budget_bytes(ram_budget_mib: float | None) -> int:
    if ram_budget_mib is not None:
        return int(ram_budget_mib * _MIB)
    try:
        import psutil

        available = psutil.virtual_memory().available
    except ImportError:  # pragma: no cover - psutil is a dependency
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(available * _DEFAULT_RAM_FRACTION)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def _num_workers(strategy: Any) -> int:
    if strategy is None:
        return 1
    n = getattr(strategy.extended, "_num_workers", None)
    if n is not None and is_int(n) and n > 0:
        return int(n)
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None:
        try:
            spec = resolver.cluster_spec()
            return max(
                1, sum(spec.num_tasks(job) for job in ("worker", "chief") if job in spec.jobs)
            )
        except Exception:
            return 1
    return 1


# --------------------------------------------------------------------------------------------
# pipeline()
# --------------------------------------------------------------------------------------------


@overload
def pipeline(
    source: Any,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    strategy: tf.distribute.Strategy | None = None,
    map_fn: Callable | None = None,
    augment_fn: Callable | None = None,
    batch_map_fn: Callable | None = None,
    batch_augment_fn: Callable | None = None,
    validation_split: None = None,
    cache: bool | str | os.PathLike = "auto",
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    drop_remainder: bool | None = None,
    deterministic: bool | None = None,
    repeat: bool = False,
    distribute: bool = False,
    seed: int | None = None,
    ram_budget_mib: float | None = None,
    private_threadpool_size: int | None = None,
    split: str | None = None,
    data_dir: str | os.PathLike | None = None,
    compression_type: str | None = None,
) -> _Pipeline: ...


@overload
def pipeline(
    source: Any,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    strategy: tf.distribute.Strategy | None = None,
    map_fn: Callable | None = None,
    augment_fn: Callable | None = None,
    batch_map_fn: Callable | None = None,
    batch_augment_fn: Callable | None = None,
    validation_split: float = ...,
    cache: bool | str | os.PathLike = "auto",
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    drop_remainder: bool | None = None,
    deterministic: bool | None = None,
    repeat: bool = False,
    distribute: bool = False,
    seed: int | None = None,
    ram_budget_mib: float | None = None,
    private_threadpool_size: int | None = None,
    split: str | None = None,
    data_dir: str | os.PathLike | None = None,
    compression_type: str | None = None,
) -> tuple[_Pipeline, _Pipeline]: ...


def pipeline(
    source: Any,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    strategy: tf.distribute.Strategy | None = None,
    map_fn: Callable | None = None,
    augment_fn: Callable | None = None,
    batch_map_fn: Callable | None = None,
    batch_augment_fn: Callable | None = None,
    validation_split: float | None = None,
    cache: bool | str | os.PathLike = "auto",
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    drop_remainder: bool | None = None,
    deterministic: bool | None = None,
    repeat: bool = False,
    distribute: bool = False,
    seed: int | None = None,
    ram_budget_mib: float | None = None,
    private_threadpool_size: int | None = None,
    split: str | None = None,
    data_dir: str | os.PathLike | None = None,
    compression_type: str | None = None,
) -> Any:
    """Builds an input pipeline that keeps the GPU fed, with the steps in the right order.

    Order: read (files interleaved in parallel and shuffled by file) -> `map_fn` (parallel,
    AUTOTUNE) -> cache -> shuffle (reshuffled each epoch) -> [repeat] -> `augment_fn`
    (parallel) -> batch -> `batch_map_fn` -> `batch_augment_fn` -> prefetch (AUTOTUNE).
    Caching sits after the deterministic work and before the random work, so decoding runs
    once and augmentation is new every epoch.

    With `validation_split`, the validation examples are split off before any shuffle and go
    through the same `map_fn`, cache, batch and `batch_map_fn`, but no augmentation, shuffle
    or repeat, always in the same order: `train, val = pipeline(..., validation_split=0.1)`,
    then `model.fit(train, validation_data=val)`. The validation side keeps its last partial
    batch (even under a strategy) unless `drop_remainder=True` is passed, and with
    `cache="auto"` it is cached in memory when it fits, so later passes do not read the source.

    `tf.data.Options` are set deliberately: autotune on with `ram_budget_mib`, map
    parallelization, map and filter fusion, parallel batch, a private thread pool on GPU hosts,
    and the auto-shard policy for the source (DATA for in-memory data, FILE for files when
    there is at least one file per worker, AUTO for a dataset passed in, DATA for a dataset
    passed in with `validation_split`, whose split counts the whole dataset).

    For Keras `fit`, leave `repeat=False`: the dataset is finite, `fit` iterates it once per
    epoch (reshuffled each time) and needs no `steps_per_epoch`; Keras distributes it over the
    strategy itself. For a custom training loop, pass `distribute=True` to get
    `strategy.experimental_distribute_dataset(...)`.

    Args:
        source: the data. A NumPy array or tf.Tensor, or a tuple/dict of them (e.g. `(x, y)`)
            whose first dimensions are equal (ragged and string data too); a
            `tf.data.Dataset` of examples, or of batches (a Keras loader's,
            `.batch(n).prefetch(...)`: kept when no other batch size is asked for, else
            unbatched and batched again, never batched twice); a TFRecord file pattern or list
            of patterns (parse records with `map_fn`); or a TensorFlow Datasets name such as
            `"mnist"` (read with `load_tfds`, supervised `(input, label)` pairs when the
            dataset defines them).
        batch_size: int, the global batch size (all replicas together), as Keras `fit` uses
            it. Give exactly one of `batch_size` and `per_replica_batch_size`, or neither for
            a dataset that is already batched (its batches are kept). Defaults to None.
        per_replica_batch_size: int, the batch size per replica; the global batch is this times
            `strategy.num_replicas_in_sync` (1 without a strategy). Defaults to None.
        strategy: `tf.distribute.Strategy` the model trains under, or None. Sets the replica
            count, the sharding, and `drop_remainder=True` by default. Defaults to None.
        map_fn: callable, per-example decode/preprocess (parse a record, decode an image,
            resize, normalize). Must be deterministic: it runs before the cache. It is called
            as `map_fn(*example)` when an example is a tuple (`map_fn(x, y)` for `(x, y)`
            arrays or supervised TFDS pairs), and as `map_fn(example)` when it is a dict
            (TFDS feature dicts) or a single tensor (an array, a serialized TFRecord); it
            returns the new example. Defaults to None.
        augment_fn: callable, per-example random augmentation; runs after the cache and the
            shuffle, so it differs every epoch. Called like `map_fn`, on what `map_fn`
            returned: `augment_fn(*example)` for a tuple, `augment_fn(example)` for a dict or
            a single tensor. Defaults to None.
        batch_map_fn: callable, deterministic vectorized preprocessing of a whole batch,
            right after batching (e.g. a `TextVectorization` layer on a batch of strings: a
            function written for batches belongs here, not in `map_fn`). Called like
            `batch_augment_fn`, before it; applied to the validation batches too. Defaults to
            None.
        batch_augment_fn: callable, vectorized augmentation of a whole batch, after batching.
            Called like `map_fn`, on a batch: `batch_augment_fn(*batch)` when examples are
            tuples (`batch_augment_fn(x_batch, y_batch)`), `batch_augment_fn(batch)` when they
            are dicts or single tensors. Defaults to None.
        validation_split: float in (0, 1), the fraction of the examples held out for
            validation; `pipeline` then returns `(train, validation)`. Arrays: the last
            fraction, as Keras `fit(validation_split=)` takes it (`floor(n * (1 - split))`
            examples train). A dataset passed in: its last fraction, when its size is known
            and its order is the same every pass (the training pipeline is then
            deterministic too, and both sides are sharded by example across workers; for a
            Keras loader use its own `validation_split=...,
            subset="both"`: with `shuffle=False` it lists files class by class, so the last
            fraction would be the last class). TFRecord files: the records whose
            hash falls in the fraction (about that share, the same in every epoch, file order
            and worker). A TFDS name: the split sliced by counts (`split` must not be sliced
            already). Defaults to None: no split, one dataset is returned.
        cache: `"auto"`, True/`"memory"`, a file path, or False. `"auto"` caches the output of
            `map_fn` (or of reading files/TFDS) in memory when its estimated size fits the RAM
            budget, the source is finite and `map_fn` has no random ops. True/`"memory"`
            always caches in memory and raises if the estimate exceeds the budget; a path
            caches to files at that prefix (checked against free disk space); a cache is only
            complete after one full pass. Defaults to `"auto"`.
        shuffle: bool, whether to shuffle (examples and, for files, file order). Defaults to
            True.
        shuffle_buffer: int, shuffle buffer size in examples. Defaults to None: the whole
            dataset up to 10,000 examples, and at most 10% of the RAM budget.
        drop_remainder: bool, drop the last partial batch so every batch has a static shape
            (needed by XLA/`jit_compile` and for even splits over replicas). Defaults to None:
            True under a strategy, else False; the validation side of `validation_split`
            drops it only when True is passed (Keras evaluates partial batches under a
            strategy, and no validation example is left out).
        deterministic: bool, keep element order fixed through parallel maps and interleaves
            (reproducible, possibly slower). Defaults to None: True when `shuffle=False`
            (the order is the data's), when a `seed` is given (a reproducible run, needed for
            exact resume with `tfgpu.callbacks.BackupAndRestore`), or when several workers
            shard in-memory data by example (they must agree on the order); else False, the
            fastest.
        repeat: bool, repeat indefinitely (after the shuffle, so each pass is reshuffled and
            batches run across epoch boundaries). For custom loops; not needed for `fit`.
            Defaults to False.
        distribute: bool, return `strategy.experimental_distribute_dataset(dataset)` for a
            custom training loop. Needs `strategy`. Defaults to False.
        seed: int, seed for the file and example shuffles. Defaults to None (a fixed seed is
            used when several workers shard in-memory data, so they agree).
        ram_budget_mib: float, RAM tf.data may use: autotune's buffer budget, the limit for
            the cache, and 10% of it for the shuffle buffer. Defaults to None: half of the
            available host memory.
        private_threadpool_size: int, size of a thread pool used only by this pipeline; 0
            shares TensorFlow's pool. Defaults to None: the CPU count on hosts with a GPU
            visible to TensorFlow, else 0.
        split: str, TFDS split (TFDS sources only), e.g. `"train"` or `"train[:90%]"`.
            Defaults to None (`"train"`).
        data_dir: path, TFDS data directory (TFDS sources only). Defaults to None (TFDS's
            default, `~/tensorflow_datasets` or `$TFDS_DATA_DIR`).
        compression_type: str, `"GZIP"` or `"ZLIB"` for compressed TFRecord files (file
            sources only). Defaults to None.

    Returns:
        A `tf.data.Dataset` of batches, or a `tf.distribute.DistributedDataset` when
        `distribute=True`. With `validation_split`, a tuple `(train, validation)` of two of
        them (both distributed with `distribute=True`); the validation one is finite even
        with `repeat=True`.

    Raises:
        TypeError: for an argument of the wrong type (a float batch size, a str seed, a
            strategy class instead of an instance), a source of unsupported type, a
            non-callable function argument, or a function that cannot take the arguments
            tf.data calls it with (the message shows its signature and the element), a
            function that returns nothing (None: a missing `return`), or a
            `validation_split` that is not a number.
        ValueError: for a value out of range (a batch size < 1, a NaN or infinite RAM budget,
            a negative seed), mismatched array lengths (naming each), an empty source, fewer
            examples than one global batch with `drop_remainder=True`, an unknown dataset
            name, conflicting arguments, a cache path under a file or in a missing directory,
            files whose compression contradicts `compression_type`, or a cache that would not
            fit the RAM budget; a `validation_split` of 0, 1, NaN or out of range, one that
            leaves a side with no example (or no full batch with `drop_remainder=True`), or
            one for a dataset of unknown size or reshuffled every pass, or with a sliced TFDS
            `split`; a `map_fn` that returns a batch of one (a function written for batches:
            pass it as `batch_map_fn`). All raised before any data is read.
        FileNotFoundError: for a file pattern that matches no files, or a TFDS dataset that is
            not prepared in `data_dir`.

    Example:

    ```python
    def decode(jpeg, label):
        image = tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (160, 160))
        return image, label

    def augment(image, label):
        image = tf.image.random_crop(image, (128, 128, 3))
        return tf.image.random_flip_left_right(image), label

    strategy = tfgpu.strategy()
    train = tfgpu.data.pipeline(
        (jpegs, labels), per_replica_batch_size=64, strategy=strategy,
        map_fn=decode, augment_fn=augment)
    model.fit(train, epochs=10)
    ```
    """
    # ---- checks, before any work
    if batch_size is not None and per_replica_batch_size is not None:
        raise conflicting(
            f"batch_size={batch_size!r}",
            f"per_replica_batch_size={per_replica_batch_size!r}",
            "Pass exactly one of them: the global batch size, or the batch size per replica.",
        )
    batch_size = check_int(
        "batch_size", batch_size, maximum=_MAX_COUNT, allow_none=True, expected=_POSITIVE
    )
    per_replica_batch_size = check_int(
        "per_replica_batch_size",
        per_replica_batch_size,
        maximum=_MAX_COUNT,
        allow_none=True,
        expected=_POSITIVE,
    )
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        hint = " (call it: pass an instance)" if isinstance(strategy, type) else ""
        raise TypeError(
            f"Invalid type for argument `strategy`. Received: strategy={strategy!r} of type "
            f"{type(strategy).__name__}{hint}. Expected a `tf.distribute.Strategy` (e.g. from "
            "`tfgpu.strategy()`) or None."
        )
    for name, fn in (
        ("map_fn", map_fn),
        ("augment_fn", augment_fn),
        ("batch_map_fn", batch_map_fn),
        ("batch_augment_fn", batch_augment_fn),
    ):
        if fn is not None and not callable(fn):
            what = "one batch" if name.startswith("batch_") else "one example"
            raise invalid_type(name, fn, f"a callable (a function of {what}) or None")
    for name, flag in (("shuffle", shuffle), ("repeat", repeat), ("distribute", distribute)):
        check_bool(name, flag)
    check_bool("drop_remainder", drop_remainder, allow_none=True)
    check_bool("deterministic", deterministic, allow_none=True)
    shuffle_buffer = check_int(
        "shuffle_buffer", shuffle_buffer, maximum=_MAX_COUNT, allow_none=True, expected=_POSITIVE
    )
    if shuffle_buffer is not None and not shuffle:
        raise conflicting(
            "shuffle=False",
            f"shuffle_buffer={shuffle_buffer}",
            "Pass shuffle=True with a buffer, or no buffer without shuffling.",
        )
    cache, cache_dir = _check_cache(cache)
    if distribute and strategy is None:
        raise conflicting(
            "distribute=True",
            "strategy=None",
            "Pass the `strategy` to distribute the dataset with.",
        )
    seed = check_int("seed", seed, minimum=0, maximum=_MAX_SEED, allow_none=True, expected=_SEED)
    ram_budget_mib = check_number(
        "ram_budget_mib",
        ram_budget_mib,
        minimum=0,
        maximum=_MAX_RAM_BUDGET_MIB,
        exclusive_minimum=True,
        allow_none=True,
        expected=f"a finite number of MiB > 0 and <= {_MAX_RAM_BUDGET_MIB:.0f}, or None",
    )
    private_threadpool_size = check_int(
        "private_threadpool_size",
        private_threadpool_size,
        minimum=0,
        maximum=2**31 - 1,
        allow_none=True,
        expected="an integer >= 0 (0 shares TensorFlow's thread pool) or None",
    )
    if compression_type is not None and not isinstance(compression_type, str):
        raise invalid_type("compression_type", compression_type, "one of: None, 'GZIP', 'ZLIB'")
    if compression_type not in (None, "", "GZIP", "ZLIB"):
        raise invalid_value("compression_type", compression_type, "one of: None, 'GZIP', 'ZLIB'")
    if split is not None and (not isinstance(split, str) or not split.strip()):
        raise invalid_type("split", split, "a str such as 'train' or 'train[:90%]', or None")
    data_dir = check_dir("data_dir", data_dir, allow_none=True)
    validation_split = _check_validation_split(validation_split)

    src = _classify_source(source)
    if src.kind != "tfds" and (split is not None or data_dir is not None):
        raise ValueError(
            f"Invalid arguments `split`/`data_dir`. Received: split={split!r}, "
            f"data_dir={data_dir!r} for a {src.kind} source. Expected them only with a "
            "TensorFlow Datasets name as `source`."
        )
    if src.kind != "files" and compression_type:
        raise ValueError(
            f"Invalid argument `compression_type`. Received: compression_type="
            f"{compression_type!r} for a {src.kind} source. Expected it only for TFRecord files."
        )
    if src.kind == "files":
        _check_compression(src.value, compression_type or "")
    if src.kind == "tfds":
        _check_tfds_name(src.value, data_dir, arg="source")
    if validation_split is not None and src.kind == "tfds" and split and re.search(r"[\[+]", split):
        raise conflicting(
            f"split={split!r}",
            f"validation_split={validation_split}",
            "Pass an unsliced split (e.g. split='train') with validation_split, or build two "
            "pipelines from sliced splits (split='train[:90%]' and split='train[90%:]', the "
            "second with shuffle=False).",
        )
    if validation_split is not None and src.kind == "dataset" and _reshuffles(src.value):
        raise _refuse_dataset_split(
            "that reshuffles its examples every pass (a `shuffle` step with "
            "reshuffle_each_iteration=True, as Keras loaders do by default), so training and "
            "validation examples would swap every epoch",
            validation_split,
        )
    if validation_split is not None and src.kind == "dataset":
        # The split takes the dataset's last examples, so the steps before it (the loader's
        # own parallel maps) must keep their order: tf.data options reach the whole chain.
        if deterministic is False:
            raise conflicting(
                "deterministic=False",
                f"validation_split={validation_split} for a `tf.data.Dataset`",
                "The split takes the dataset's last examples, which must come in the same "
                "order every pass: leave deterministic=None (the pipeline is then "
                "deterministic).",
            )
        deterministic = True

    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    num_workers = _num_workers(strategy)

    # A dataset passed in may already be batched (Keras loaders, `.batch(n).prefetch(1)`):
    # keep its batches when they already are what was asked for, else unbatch it and batch
    # again at the requested size; never batch batches.
    batched_source: Batches | None = None
    keep_batches = False
    if src.kind == "dataset":
        batched_source, ambiguous = source_batches(src.value)
        if ambiguous:
            warnings.warn(
                "tfgpu.data.pipeline: cannot tell whether the dataset passed in yields examples "
                f"or batches (its chain ends in a step that makes new elements, and every "
                f"component has an unknown first dimension: {src.value.element_spec}). It is "
                "treated as examples and batched; if its elements are batches, unbatch them "
                "first (`.unbatch()`), or build it without batching.",
                stacklevel=2,
            )
    requested = (
        batch_size
        if batch_size is not None
        else None
        if per_replica_batch_size is None
        else per_replica_batch_size * num_replicas
    )
    if batched_source is None and requested is None:
        raise ValueError(
            "Invalid arguments `batch_size` and `per_replica_batch_size`. Received: "
            "batch_size=None, per_replica_batch_size=None. Expected exactly one of them: the "
            "global batch size, or the batch size per replica (both may be None only for a "
            "dataset that is already batched, whose batches are then kept)."
        )
    if batched_source is not None:
        keep_batches, batch_size = _batched_source_plan(
            batched_source,
            requested=requested,
            batch_size=batch_size,
            per_replica_batch_size=per_replica_batch_size,
            per_example=[
                f"{n}=..." for n, f in (("map_fn", map_fn), ("augment_fn", augment_fn)) if f
            ]
            + ([f"shuffle_buffer={shuffle_buffer}"] if shuffle_buffer is not None else [])
            + ([f"validation_split={validation_split}"] if validation_split is not None else []),
            drop_remainder=drop_remainder,
            num_replicas=num_replicas if strategy is not None else 1,
        )

    # The validation split's counts, checked before any work where the count is known.
    drop = bool(drop_remainder) if drop_remainder is not None else strategy is not None
    global_batch = requested if requested is not None else batch_size
    split_counts: tuple[int, int] | None = None
    if validation_split is not None and src.kind in ("memory", "dataset"):
        if src.kind == "memory":
            total = src.num_examples
        elif batched_source is not None:
            total = batched_source.num_examples
        else:
            total = cardinality(src.value)
        if total is None:
            raise _refuse_dataset_split(
                "whose number of examples is unknown (e.g. after a `filter` or from a "
                "generator), so its last fraction cannot be taken",
                validation_split,
            )
        if total < 0:
            raise _refuse_dataset_split("that is infinite (repeated)", validation_split)
        split_counts = _check_split_counts(
            total, validation_split, global_batch, drop, drop_remainder is True
        )

    # ---- read, and split off the validation examples before any shuffle
    num_files: int | None = None
    val_ds: tf.data.Dataset | None = None
    if src.kind == "memory":
        ds = tf.data.Dataset.from_tensor_slices(src.value)
        if split_counts is not None:
            ds, val_ds = ds.take(split_counts[0]), ds.skip(split_counts[0])
    elif src.kind == "dataset":
        ds = src.value
        if batched_source is not None and not keep_batches:
            ds = ds.unbatch()
            if batched_source.num_examples is not None:  # unbatch forgets the count
                ds = ds.apply(tf.data.experimental.assert_cardinality(batched_source.num_examples))
            else:
                warnings.warn(
                    "tfgpu.data.pipeline: the number of examples in the batched dataset passed in "
                    "is unknown, so the rebatched pipeline's cardinality is unknown too (Keras "
                    "shows no step count in the first epoch). Pass the loader's examples "
                    "unbatched (e.g. `image_dataset_from_directory(..., batch_size=None)`) to "
                    "keep it.",
                    stacklevel=2,
                )
        if split_counts is not None:
            ds, val_ds = ds.take(split_counts[0]), ds.skip(split_counts[0])
    elif src.kind == "files":
        num_files = count = len(src.value)

        def read(shuffled: bool, ordered: bool | None) -> tf.data.Dataset:
            files = tf.data.Dataset.from_tensor_slices(src.value)
            if shuffled:
                files = files.shuffle(count, seed=seed, reshuffle_each_iteration=True)
            return files.interleave(
                lambda f: tf.data.TFRecordDataset(f, compression_type=compression_type or ""),
                cycle_length=min(count, max(_cpu_count(), 2)),
                num_parallel_calls=_AUTOTUNE,
                deterministic=ordered,
            )

        ds = read(shuffle, deterministic)
        if validation_split is not None:
            threshold = min(max(round(validation_split * _SPLIT_BUCKETS), 1), _SPLIT_BUCKETS - 1)
            in_validation = _in_validation(threshold)
            ds = ds.filter(lambda record: tf.logical_not(in_validation(record)))
            val_ds = read(False, True).filter(in_validation)
    else:
        tfds_split = split or "train"
        ds, info = _load_tfds(
            src.value,
            tfds_split,
            data_dir=data_dir,
            download=False,
            shuffle_files=shuffle,
            as_supervised=None,
            seed=seed,
            prefetch=False,
        )
        split_info = _split_info(info, tfds_split)
        num_files = getattr(split_info, "num_shards", None)
        if validation_split is not None:
            examples: Any = getattr(split_info, "num_examples", None)
            if not is_int(examples) or examples < 1:
                raise ValueError(
                    f"Invalid value for argument `validation_split`. Received: validation_split="
                    f"{validation_split}, but the number of examples in {src.value!r} split "
                    f"{tfds_split!r} is unknown. Expected a prepared split with a known size, "
                    f"or sliced splits in two pipelines (split='{tfds_split}[:90%]' and "
                    f"split='{tfds_split}[90%:]')."
                )
            split_counts = _check_split_counts(
                int(examples), validation_split, global_batch, drop, drop_remainder is True
            )
            train_split, val_split = _tfds_slices(tfds_split, int(examples), validation_split)
            ds, val_ds = (
                _load_tfds(
                    src.value,
                    part,
                    data_dir=data_dir,
                    download=False,
                    shuffle_files=shuffled,
                    as_supervised=None,
                    seed=seed if shuffled else None,
                    prefetch=False,
                )[0]
                for part, shuffled in ((train_split, shuffle), (val_split, False))
            )

    # ---- decode / preprocess
    random_ops: tuple[str, ...] = ()
    ragged = False
    if map_fn is not None:
        _check_arity("map_fn", map_fn, ds.element_spec, "an example")
        random_ops = _random_ops(map_fn, ds.element_spec)
        spec_in = ds.element_spec
        ds = _map(ds, "map_fn", map_fn, deterministic)
        ragged = _check_map_output(map_fn, spec_in, ds.element_spec)
        if val_ds is not None:
            val_ds = _map(val_ds, "map_fn", map_fn, True)

    facts = _Facts(
        kind=src.kind,
        num_examples=cardinality(ds),
        element_bytes=_element_bytes(ds.element_spec),
        num_files=num_files,
        has_map_fn=map_fn is not None,
        map_fn_random_ops=random_ops,
        num_replicas=num_replicas,
        num_workers=num_workers,
        has_gpu=bool(tf.config.list_physical_devices("GPU")),
        cpu_count=_cpu_count(),
        ram_budget_bytes=_ram_budget_bytes(ram_budget_mib),
        free_disk_bytes=shutil.disk_usage(cache_dir).free if cache_dir else None,
        batched=keep_batches,
        split_by_position=src.kind == "dataset" and validation_split is not None,
    )
    plan = _decide(
        facts,
        batch_size=batch_size,
        per_replica_batch_size=per_replica_batch_size,
        cache=cache,
        shuffle=shuffle,
        shuffle_buffer=shuffle_buffer,
        drop_remainder=drop_remainder,
        deterministic=deterministic,
        seed=seed,
        has_strategy=strategy is not None,
        private_threadpool_size=private_threadpool_size,
        repeat=repeat,
    )
    for note in plan.notes:
        if note.startswith("cache after") or note.startswith("not cached: map_fn"):
            warnings.warn(f"tfgpu.data.pipeline: {note}.", stacklevel=2)

    # ---- cache -> shuffle -> repeat -> augment -> batch -> batch map -> batch augment -> prefetch
    ds = _cached(ds, plan.cache)
    if plan.shuffle_buffer:
        ds = ds.shuffle(plan.shuffle_buffer, seed=plan.shuffle_seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    if augment_fn is not None:
        _check_arity("augment_fn", augment_fn, ds.element_spec, "an example after `map_fn`")
        ds = _map(ds, "augment_fn", augment_fn, plan.deterministic)

    def finish(ds: tf.data.Dataset, plan: _Plan, batch: bool, augment: Any) -> tf.data.Dataset:
        return _batched(
            ds,
            plan,
            batch=batch,
            ragged=ragged,
            batch_map_fn=batch_map_fn,
            batch_augment_fn=augment,
            ram_budget_bytes=facts.ram_budget_bytes,
            # A dataset passed in keeps its own sharding, unless it is split by position.
            keep_shard=src.kind == "dataset" and validation_split is None,
        )

    ds = finish(ds, plan, not keep_batches, batch_augment_fn)

    # The validation side: the same map_fn, batch_map_fn, batch, cache and sharding; no
    # augmentation, no shuffle, no repeat, and always in the same order.
    if val_ds is not None:
        val_plan = _validation_plan(
            plan,
            facts,
            cache=cache,
            drop_remainder=drop_remainder,
            num_examples=split_counts[1] if split_counts is not None else None,
            element_bytes=_element_bytes(val_ds.element_spec),
        )
        val_ds = _cached(val_ds, val_plan.cache)
        val_ds = finish(val_ds, val_plan, True, None)

    if distribute:
        train_out = strategy.experimental_distribute_dataset(ds)  # type: ignore[union-attr]
        if val_ds is None:
            return train_out
        return train_out, strategy.experimental_distribute_dataset(val_ds)  # type: ignore[union-attr]
    return ds if val_ds is None else (ds, val_ds)


def _cached(ds: tf.data.Dataset, cache: str | None) -> tf.data.Dataset:
    """`ds` cached as the plan says: not at all (None), in memory, or at a file prefix."""
    if cache == "memory":
        return ds.cache()
    if cache:
        _remove_interrupted_cache(cache)
        return ds.cache(cache)
    return ds


def _batched(
    ds: tf.data.Dataset,
    plan: _Plan,
    *,
    batch: bool,
    ragged: bool,
    batch_map_fn: Callable | None,
    batch_augment_fn: Callable | None,
    ram_budget_bytes: int,
    keep_shard: bool,
) -> tf.data.Dataset:
    """batch (`ragged`: a ragged batch) -> `batch_map_fn` -> `batch_augment_fn` -> prefetch ->
    options; the result is marked as built by `pipeline`."""
    if batch:
        # A plain batch, on purpose: tf.data fuses `map(augment_fn) -> batch` into one
        # MapAndBatchDataset that writes each augmented example straight into its batch. A
        # batch with `num_parallel_calls` is a ParallelBatchDataset, which that fusion skips:
        # one more stage and buffer per example cost 12-18% throughput on the image benchmark.
        # Where nothing fuses, the `parallel_batch` option (set in `_options`) still
        # parallelizes the copy.
        if ragged:  # rows of a ragged feature after map_fn: ragged again, as they came
            ds = ds.ragged_batch(plan.global_batch_size, drop_remainder=plan.drop_remainder)
        else:
            ds = ds.batch(plan.global_batch_size, drop_remainder=plan.drop_remainder)
    if batch_map_fn is not None:
        _check_arity("batch_map_fn", batch_map_fn, ds.element_spec, "a batch")
        ds = _map(ds, "batch_map_fn", batch_map_fn, plan.deterministic)
    if batch_augment_fn is not None:
        _check_arity("batch_augment_fn", batch_augment_fn, ds.element_spec, "a batch")
        ds = _map(ds, "batch_augment_fn", batch_augment_fn, plan.deterministic)
    ds = ds.prefetch(_AUTOTUNE)
    ds = ds.with_options(_options(plan, ram_budget_bytes, keep_shard=keep_shard))
    return mark_pipeline(ds)


# File cache prefixes this process has built pipelines on: their leftovers may belong to an
# iterator still alive here, so they are not removed.
_FILE_CACHES_IN_USE: set[str] = set()


def _interrupted_cache_files(prefix: str) -> list[str]:
    """Leftovers of a file cache whose first pass was killed; [] when the cache is complete.

    tf.data writes shard `<prefix>_<n>` guarded by `<prefix>_<n>.lockfile`, into files named
    `*.tempstate<random>`, and only at the end of a full pass merges them into
    `<prefix>.index` and `<prefix>.data-*`. A process killed before that (SIGKILL, OOM, node
    loss) leaves the lockfile behind, and the next run fails with `AlreadyExistsError`.
    """
    if os.path.exists(f"{prefix}.index"):
        return []
    directory, base = os.path.split(prefix)
    leftover = re.compile(
        rf"^{re.escape(base)}"
        r"(?:_\d+\.lockfile|(?:_\d+)?\.(?:index|data-\d+-of-\d+)\.tempstate\d*)$"
    )
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names if leftover.match(n))


def _remove_interrupted_cache(prefix: str) -> None:
    """Removes the lockfile and temporary files an interrupted cache write left, with a warning."""
    key = os.path.abspath(prefix)
    in_use = key in _FILE_CACHES_IN_USE
    _FILE_CACHES_IN_USE.add(key)
    stale = _interrupted_cache_files(prefix)
    if not stale or in_use:
        return
    failed = []
    for path in stale:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            failed.append(f"{path} ({e.strerror})")
    message = (
        f"tfgpu.data.pipeline: the file cache at {prefix!r} has no completed "
        f"{os.path.basename(prefix)}.index, so an earlier first pass was interrupted; removed "
        f"its leftovers: {', '.join(os.path.basename(p) for p in stale)}. The cache is written "
        "again on the next full pass."
    )
    if failed:
        message += f" Could not remove: {', '.join(failed)}."
    warnings.warn(message, stacklevel=3)


def _options(plan: _Plan, ram_budget_bytes: int, *, keep_shard: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.autotune.enabled = True
    options.autotune.ram_budget = int(ram_budget_bytes)
    options.deterministic = plan.deterministic
    opt = options.experimental_optimization
    opt.map_parallelization = True
    opt.map_fusion = True
    opt.filter_fusion = True
    opt.parallel_batch = True
    if plan.private_threadpool_size:
        options.threading.private_threadpool_size = plan.private_threadpool_size
    if not keep_shard:
        options.experimental_distribute.auto_shard_policy = getattr(
            tf.data.experimental.AutoShardPolicy, plan.shard_policy
        )
    return options


# --------------------------------------------------------------------------------------------
# load_tfds()
# --------------------------------------------------------------------------------------------


def _split_info(info: Any, split: str) -> Any:
    base = re.match(r"\s*([\w\-]+)", split)
    try:
        return info.splits[base.group(1)] if base else None
    except Exception:
        return None


def load_tfds(
    name: str,
    split: str = "train",
    *,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    shuffle_files: bool = True,
    as_supervised: bool | None = None,
    seed: int | None = None,
    with_info: bool = False,
) -> tf.data.Dataset | tuple[tf.data.Dataset, Any]:
    """Loads a TensorFlow Datasets dataset for training, with fast reading options.

    Reads files in parallel (interleave with AUTOTUNE parallel calls), shuffles the file order
    every epoch, decodes in parallel, and returns `(input, label)` pairs when the dataset
    defines them. It first checks that the data is prepared in `data_dir`; without
    `download=True` a dataset that is not there fails at once with a message naming the
    dataset, the directory, and how to get the data, instead of TFDS's minutes of network
    retries on an offline machine.

    Args:
        name: str, the TFDS name, optionally with config and version: `"mnist"`,
            `"cifar10:3.0.2"`, `"imagenet2012/subset"`.
        split: str, the split or split expression, e.g. `"train"`, `"test"`,
            `"train[:90%]"`. Defaults to `"train"`.
        data_dir: path, where prepared datasets live. Defaults to None: TFDS's default
            (`$TFDS_DATA_DIR` or `~/tensorflow_datasets`).
        download: bool, download and prepare the dataset if it is not in `data_dir` (needs
            internet). Defaults to False.
        shuffle_files: bool, shuffle the order of the dataset's files every epoch. Defaults to
            True.
        as_supervised: bool, return `(input, label)` tuples instead of feature dicts.
            Defaults to None: True when the dataset defines supervised keys.
        seed: int, seed for the file shuffle. Defaults to None.
        with_info: bool, also return the `tfds.core.DatasetInfo`. Defaults to False.

    Returns:
        A `tf.data.Dataset` of unbatched examples, or `(dataset, info)` when `with_info=True`.

    Raises:
        TypeError: for a `name`, `split`, flag or `seed` of the wrong type.
        ValueError: for a name that is not a TFDS dataset (with close matches), a split the
            dataset does not have, a negative seed, or a `data_dir` that is (under) a file.
        FileNotFoundError: when the dataset is not prepared in `data_dir` and
            `download=False`; the message says how to get it onto an offline machine.
        ImportError: when `tensorflow-datasets` is not installed (with the pip line).

    Example:

    ```python
    train = tfgpu.data.load_tfds("mnist", "train", data_dir="/data/tfds")
    train = tfgpu.data.pipeline(train, batch_size=256, map_fn=normalize)
    ```
    """
    check_bool("with_info", with_info)
    ds, info = _load_tfds(
        name,
        split,
        data_dir=data_dir,
        download=download,
        shuffle_files=shuffle_files,
        as_supervised=as_supervised,
        seed=seed,
        prefetch=True,
    )
    return (ds, info) if with_info else ds


def _load_tfds(
    name: Any,
    split: Any,
    *,
    data_dir: Any,
    download: bool,
    shuffle_files: bool,
    as_supervised: bool | None,
    seed: int | None,
    prefetch: bool,
) -> tuple[tf.data.Dataset, Any]:
    for arg, value, example in (
        ("name", name, "a non-empty str such as 'mnist'"),
        ("split", split, "a str such as 'train' or 'train[:90%]'"),
    ):
        if not isinstance(value, str):
            raise invalid_type(arg, value, example)
        if not value.strip():
            raise invalid_value(arg, value, example)
    for arg, flag in (("download", download), ("shuffle_files", shuffle_files)):
        check_bool(arg, flag)
    check_bool("as_supervised", as_supervised, allow_none=True)
    seed = check_int("seed", seed, minimum=0, maximum=_MAX_SEED, allow_none=True, expected=_SEED)
    data_dir = check_dir("data_dir", data_dir, allow_none=True)
    tfds = import_optional("tensorflow_datasets")
    _check_tfds_name(name, data_dir)
    kwargs = {"data_dir": os.fspath(data_dir)} if data_dir is not None else {}
    try:
        builder = tfds.builder(name, **kwargs)
    except Exception as e:
        raise ValueError(
            f"Invalid value for argument `name`. Received: name={name!r}; TensorFlow Datasets "
            f"cannot build it: {e}"
        ) from e
    root = os.fspath(data_dir) if data_dir is not None else _tfds_default_dir()
    if not builder.is_prepared():
        if not download:
            raise FileNotFoundError(
                f"TensorFlow Datasets dataset {name!r} is not prepared in {root} (looked for "
                f"{builder.data_dir}). To get it: on a machine with internet run "
                f"`tfds build {name.split(':')[0]} --data_dir {root}` (or call "
                f"`tfgpu.data.load_tfds({name!r}, download=True, data_dir=...)`), then copy that "
                "data_dir to this machine and pass it as `data_dir`."
            )
        builder.download_and_prepare()
    info = builder.info
    known = set(info.splits.keys())
    for part in split.split("+"):
        base = re.match(r"\s*([\w\-]+)", part)
        if base is None or base.group(1) not in known:
            raise ValueError(
                f"Invalid value for argument `split`. Received: split={split!r}. Expected a "
                f"split of {name!r}: one of {sorted(known)} (slicing such as 'train[:10%]' "
                "is allowed)."
            )
    if as_supervised is None:
        as_supervised = bool(info.supervised_keys)
    read_config = tfds.ReadConfig(
        shuffle_seed=seed,
        shuffle_reshuffle_each_iteration=True,
        interleave_cycle_length=_AUTOTUNE,
        num_parallel_calls_for_interleave_files=_AUTOTUNE,
        num_parallel_calls_for_decode=_AUTOTUNE,
        skip_prefetch=not prefetch,
    )
    ds = builder.as_dataset(
        split=split,
        shuffle_files=shuffle_files,
        as_supervised=as_supervised,
        read_config=read_config,
    )
    return ds, info


# --------------------------------------------------------------------------------------------
# benchmark()
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipelineBenchmark:
    """Throughput of an input pipeline measured alone (no model), after warm-up.

    Attributes:
        examples_per_second: float, examples delivered per second over the timed batches.
        batches_per_second: float, batches delivered per second over the timed batches.
        num_batches: int, batches timed (after warm-up).
        num_examples: int, examples in the timed batches.
        seconds: float, wall time of the timed batches.
        batch_size: int or None, the batch size when every timed batch had the same one,
            else None.
        warmup_batches: int, batches consumed before timing.
        warmup_seconds: float, wall time of the warm-up (pipeline start, buffers filling).
        epochs: int, how many times the dataset was restarted to provide the batches (a
            finite dataset shorter than warm-up plus timed batches is iterated again).
    """

    examples_per_second: float
    batches_per_second: float
    num_batches: int
    num_examples: int
    seconds: float
    batch_size: int | None
    warmup_batches: int = 0
    warmup_seconds: float = 0.0
    epochs: int = 1

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.examples_per_second:,.0f} examples/s, {self.batches_per_second:,.1f} "
            f"batches/s ({self.num_batches} batches of {self.batch_size or 'varying size'} in "
            f"{self.seconds:.2f} s after {self.warmup_batches} warm-up batches)"
        )


def _leaf_rows(leaf: Any) -> tf.Tensor:
    """Rows (first dimension) of one batch component as an int64 tensor; 1 for a scalar."""
    if isinstance(leaf, tf.RaggedTensor):
        return leaf.nrows(out_type=tf.int64)
    shape = leaf.dense_shape if isinstance(leaf, tf.SparseTensor) else tf.shape(leaf, tf.int64)
    return tf.concat([tf.cast(shape, tf.int64), tf.ones([1], tf.int64)], axis=0)[0]


def _batch_examples(batch: Any) -> tf.Tensor:
    """Examples in one batch: the first dimension of its first component, summed over replicas."""
    replicas = getattr(batch, "values", None)
    if isinstance(replicas, tuple) and replicas and not isinstance(batch, tuple):
        return tf.add_n([_batch_examples(v) for v in replicas])
    leaves = tf.nest.flatten(batch)
    if not leaves:
        return tf.constant(0, tf.int64)
    first = leaves[0]
    values = getattr(first, "values", None)  # PerReplica inside a structure
    if isinstance(values, tuple) and values:
        return tf.add_n([_leaf_rows(v) for v in values])
    return _leaf_rows(first)


def _consume(iterator: Any, n: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """Takes up to `n` batches from `iterator` inside TensorFlow (run as a `tf.function`).

    Returns (batches taken, examples, smallest batch, largest batch); fewer than `n` batches
    means the iterator is exhausted. Looping in the graph costs a few microseconds per batch
    where a Python `next()` costs tens to hundreds (more for distributed iterators), which
    would otherwise be measured instead of the pipeline.
    """

    def body(i, count, examples, low, high):
        optional = iterator.get_next_as_optional()

        def took():
            k = _batch_examples(optional.get_value())
            return i + 1, count + 1, examples + k, tf.minimum(low, k), tf.maximum(high, k)

        def exhausted():
            return n, count, examples, low, high

        return tf.cond(optional.has_value(), took, exhausted)

    zero = tf.constant(0, tf.int64)
    init = (zero, zero, zero, tf.constant(np.iinfo(np.int64).max, tf.int64), zero)
    _, count, examples, low, high = tf.while_loop(
        lambda i, *_: i < n, body, init, parallel_iterations=1
    )
    return count, examples, low, high


_CONSUMER: list[Callable] = []  # `_consume` as one tf.function, traced once per iterator type


def _consumer() -> Callable:
    if not _CONSUMER:
        _CONSUMER.append(tf.function(_consume, autograph=False))
    return _CONSUMER[0]


def benchmark(
    dataset: tf.data.Dataset | tf.distribute.DistributedDataset,
    *,
    num_batches: int = 50,
    warmup: int = 5,
) -> PipelineBenchmark:
    """Measures an input pipeline alone: examples/s and batches/s after warm-up.

    Consumes `warmup` batches untimed (pipeline start-up, buffers and autotuning), then times
    `num_batches` batches. A finite dataset shorter than that is started again (like the next
    epoch) until enough batches are seen. The batches are taken inside TensorFlow (a
    `tf.function` looping over the iterator), so the figure is the pipeline's own speed, not
    the cost of a Python `next()` per batch, which on a fast pipeline is larger than the
    pipeline's. This is what `tfgpu.diagnose()` uses to tell whether the input pipeline can
    feed the model.

    Args:
        dataset: `tf.data.Dataset` of batches (e.g. from `pipeline()`), or a distributed
            dataset from `distribute=True`.
        num_batches: int, batches to time. Defaults to 50.
        warmup: int, batches to consume before timing. Defaults to 5.

    Returns:
        A `PipelineBenchmark`.

    Raises:
        TypeError: if `dataset` is not a dataset, or `num_batches`/`warmup` is not an int.
        ValueError: if `num_batches` is < 1, `warmup` is negative, or the dataset yields no
            batches. An infinite dataset is fine: only `warmup + num_batches` are taken.

    Example:

    ```python
    result = tfgpu.data.benchmark(train, num_batches=100)
    print(result.examples_per_second)
    ```
    """
    if not isinstance(dataset, (tf.data.Dataset, tf.distribute.DistributedDataset)):
        raise TypeError(
            f"Invalid type for argument `dataset`. Received: dataset of type "
            f"{type(dataset).__name__}. Expected a `tf.data.Dataset` or a distributed dataset."
        )
    num_batches = check_int("num_batches", num_batches, maximum=_MAX_COUNT, expected=_POSITIVE)
    warmup = check_int("warmup", warmup, minimum=0, maximum=_MAX_COUNT, expected="an integer >= 0")
    if isinstance(dataset, tf.data.Dataset) and cardinality(dataset) == 0:
        raise ValueError(
            "Invalid value for argument `dataset`. Received: a dataset with 0 batches. "
            "Expected at least one batch (is drop_remainder dropping everything?)."
        )

    consume = _consumer()
    epochs = 1
    iterator = iter(dataset)
    fresh = True  # no batch taken from `iterator` yet

    def take(n: int) -> tuple[int, int, int]:
        """Takes `n` batches, restarting a finite dataset; returns (examples, smallest, largest)."""
        nonlocal iterator, fresh, epochs
        examples, low, high = 0, np.iinfo(np.int64).max, 0
        while n:
            count, k, lo, hi = (int(t) for t in consume(iterator, tf.constant(n, tf.int64)))
            if count:
                fresh = False
                examples, low, high = examples + k, min(low, lo), max(high, hi)
            n -= count
            if n:
                if fresh:
                    raise ValueError(
                        "Invalid value for argument `dataset`. Received: a dataset that yields "
                        "no batches. Expected at least one batch."
                    )
                epochs += 1
                iterator = iter(dataset)
                fresh = True
        return examples, low, high

    consume(iterator, tf.constant(0, tf.int64))  # trace now: neither warm-up nor timing
    start = time.perf_counter()
    take(int(warmup))
    warmup_seconds = time.perf_counter() - start

    start = time.perf_counter()
    examples, low, high = take(num_batches)
    seconds = max(time.perf_counter() - start, 1e-9)
    return PipelineBenchmark(
        examples_per_second=examples / seconds,
        batches_per_second=num_batches / seconds,
        num_batches=num_batches,
        num_examples=examples,
        seconds=seconds,
        batch_size=low if low == high else None,
        warmup_batches=int(warmup),
        warmup_seconds=warmup_seconds,
        epochs=epochs,
    )
