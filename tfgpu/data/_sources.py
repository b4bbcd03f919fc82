"""What `pipeline()` was given: classifying the `data` argument and reading it.

`classify()` tells arrays (checked leaf by leaf, with equal lengths), a `tf.data.Dataset`,
TFRecord files (a pattern or a list of them) and TensorFlow Datasets names apart, before any
TensorFlow work; `check_compression()` reads the first bytes of the files against
`compression_type`; `batched_source_plan()` decides whether a dataset that is already batched
keeps its batches or is unbatched and batched again; `read_files()` interleaves TFRecord
files in parallel.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters.datasets import Batches, cardinality
from tfgpu._internal.helpers.checks import invalid_value

_LOG = logging.getLogger(__name__)
_TFDS_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(/[A-Za-z0-9_.+\-]+)?(:[0-9.*]+)?$")
_SOURCE_TYPES = (
    "a NumPy array, a tf.Tensor (ragged and sparse too), a tuple or dict of them (e.g. `(x, y)`), "
    "a `tf.data.Dataset`, "
    "a TFRecord file pattern (str or list of str), or a TensorFlow Datasets name such as 'mnist'"
)


@dataclasses.dataclass(frozen=True)
class Source:
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


def _classify_memory(source: Any) -> Source:
    """Checks a nested structure of arrays: supported leaves, a dimension to slice, equal lengths."""

    def to_leaf(path: str, value: Any) -> Any:
        if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
            return value
        if isinstance(value, list) and any(
            isinstance(v, (np.ndarray, tf.Tensor, tf.RaggedTensor)) for v in value
        ):
            raise TypeError(
                f"Invalid type for argument `data`. Received: a list of arrays at {path}. "
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
                        f"Invalid value for argument `data`. The list at {path} can be made "
                        f"neither into one array nor into a ragged tensor ({e}). Expected "
                        "examples of one type and nesting depth; pad them or pass a "
                        "`tf.data.Dataset`."
                    ) from None
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "O":
                odd = next((v for v in value.reshape(-1) if not isinstance(v, (str, bytes))), None)
                if odd is not None or value.size == 0:
                    raise TypeError(
                        f"Invalid type for argument `data`. Received: a NumPy array of Python "
                        f"objects at {path} (holding a {type(odd).__name__}). Expected arrays "
                        "of numbers, bools or strings; convert it with `.astype(...)` first."
                    )
            elif value.dtype.kind not in "biufcSU":
                raise TypeError(
                    f"Invalid type for argument `data`. Received: a NumPy array of dtype "
                    f"{value.dtype} at {path}. Expected arrays of numbers, bools or strings."
                )
            return value
        raise TypeError(
            f"Invalid type for argument `data`. Received: a {type(value).__name__} at {path}. "
            f"Expected {_SOURCE_TYPES}."
        )

    def walk(path: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            if not value:
                raise ValueError(
                    f"Invalid value for argument `data`. Received: an empty dict at {path}. "
                    "Expected at least one array."
                )
            keys = list(value)
            if not all(isinstance(k, str) for k in keys):
                raise TypeError(
                    f"Invalid type for argument `data`. Received: a dict at {path} with keys "
                    f"{keys!r}. Expected str keys (feature names)."
                )
            return {k: walk(f"{path}[{k!r}]", v) for k, v in value.items()}
        if isinstance(value, tuple):
            if not value:
                raise ValueError(
                    f"Invalid value for argument `data`. Received: an empty tuple at {path}. "
                    "Expected at least one array."
                )
            items = tuple(walk(f"{path}[{i}]", v) for i, v in enumerate(value))
            return type(value)(*items) if hasattr(value, "_fields") else items
        return to_leaf(path, value)

    structure = walk("data", source)
    lengths: dict[str, int | None] = {}
    for path, leaf in flatten_with_paths("data", structure):
        lengths[path] = _leaf_length(leaf)
    scalars = [p for p, n in lengths.items() if n is None]
    if scalars:
        raise ValueError(
            f"Invalid value for argument `data`. Received: a scalar (no first dimension) at "
            f"{', '.join(scalars)}. Expected arrays whose first dimension indexes the examples."
        )
    distinct = set(lengths.values())
    if len(distinct) > 1:
        shown = ", ".join(f"{p}: {n}" for p, n in lengths.items())
        raise ValueError(
            "Invalid value for argument `data`. The arrays have different lengths "
            f"(first dimensions): {shown}. Expected every array to hold the same number of "
            "examples."
        )
    (n,) = distinct
    if n == 0:
        raise ValueError(
            "Invalid value for argument `data`. Received: arrays with 0 examples. "
            "Expected at least one example."
        )
    return Source("memory", structure, num_examples=n)


def flatten_with_paths(path: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in flatten_with_paths(f"{path}[{k!r}]", v)]
    if isinstance(value, tuple):
        return [item for i, v in enumerate(value) for item in flatten_with_paths(f"{path}[{i}]", v)]
    return [(path, value)]


def _expand_patterns(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        files.extend(sorted(glob.glob(os.path.expanduser(pattern))))
    return [f for f in dict.fromkeys(files) if os.path.isfile(f)]


def classify(source: Any) -> Source:
    """Tells what kind of source this is, or raises `TypeError`/`ValueError`. No TF work."""
    if isinstance(source, tf.data.Dataset):
        if cardinality(source) == 0:
            raise ValueError(
                "Invalid value for argument `data`. Received: a `tf.data.Dataset` with 0 "
                "elements (cardinality 0). Expected at least one example."
            )
        return Source("dataset", source)
    if isinstance(source, (str, bytes, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if not text.strip():
            raise invalid_value(
                "data", source, "a TFRecord file pattern or a TensorFlow Datasets name"
            )
        if os.path.isdir(os.path.expanduser(text)):
            raise ValueError(
                f"Invalid value for argument `data`. Received: data={text!r}, which is a "
                "directory. Expected TFRecord files or a glob pattern, e.g. "
                f"{os.path.join(text, '*.tfrecord')!r}; for a folder of images, use "
                "`keras.utils.image_dataset_from_directory(..., batch_size=None)` and pass "
                "its dataset."
            )
        files = _expand_patterns([text])
        if files:
            return Source("files", files)
        if _TFDS_NAME.match(text) and not os.path.splitext(text)[1]:
            return Source("tfds", text)
        raise FileNotFoundError(
            f"Invalid value for argument `data`. Received: data={text!r}, a file pattern "
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
                "Invalid value for argument `data`. These file patterns match no files: "
                f"{missing}. Expected existing TFRecord files or glob patterns."
            )
        return Source("files", files)
    if isinstance(
        source,
        (np.ndarray, np.generic, tf.Tensor, tf.RaggedTensor, tf.SparseTensor, tuple, Mapping, list),
    ):
        return _classify_memory(source)
    raise TypeError(
        f"Invalid type for argument `data`. Received: data of type "
        f"{type(source).__module__}.{type(source).__qualname__}. Expected {_SOURCE_TYPES}. "
        "For a Python generator, wrap it first with `tf.data.Dataset.from_generator`."
    )


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


def check_compression(files: list[str], compression_type: str) -> None:
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
            f"Invalid value for argument `data`. Cannot read {path!r} ({e.strerror}). "
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


def batched_source_plan(
    batches: Batches,
    *,
    requested: int | None,
    batch_size: int | None,
    per_replica_batch_size: int | None,
    per_example: list[str],
    drop_remainder: bool | None,
    num_replicas: int,
) -> tuple[bool, int | None]:
    """Whether to keep a batched source's batches; returns (keep, batch_size for `decide`).

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
                f"Invalid value for argument `data`. Received: a dataset already batched in "
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
