"""What `pipeline()` was given: one adapter per kind of `data`, chosen once by `classify()`
(as Keras's data adapters), with its own checks, batches, count, reading and plan facts."""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters.cpu import usable_cores
from tfgpu._internal.adapters.datasets import (
    Batches,
    cardinality,
    dataset_inputs,
    reshuffles,
    source_batches,
)
from tfgpu._internal.helpers.checks import conflicting, invalid_type, invalid_value, is_int
from tfgpu._internal.helpers.warn import warn_at_user_code
from tfgpu._internal.measure.workload import check_arrays
from tfgpu.data._service import memory_source
from tfgpu.data._split import check_split_counts, refuse_dataset_split, validation_filter
from tfgpu.data._tfds import check_tfds_name, load_tfds_dataset, tfds_split_info

if TYPE_CHECKING:
    from tfgpu.data._arguments import Arguments
    from tfgpu.data._plan import Facts

_LOG = logging.getLogger(__name__)
_TFDS_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(/[A-Za-z0-9_.+\-]+)?(:[0-9.*]+)?$")
_SOURCE_TYPES = (
    "a NumPy array, a tf.Tensor (ragged and sparse too), a tuple or dict of them (e.g. `(x, y)`), "
    "a `tf.data.Dataset`, "
    "a TFRecord file pattern (str or list of str), or a TensorFlow Datasets name such as 'mnist'"
)


@dataclasses.dataclass(frozen=True)
class Batching:
    """How the source is batched, and the validation split's counts known before reading."""

    num_replicas: int
    batched_source: Batches | None  # what is known of a dataset passed in already batched
    keep_batches: bool  # its batches are kept as they are
    batch_size: int | None  # the global batch size `decide` gets (a kept source's own)
    global_batch: int | None  # the global batch asked for (or the kept source's)
    drop: bool  # whether the training side drops its last partial batch
    split_counts: tuple[int, int] | None  # (train, validation) when known before reading


@dataclasses.dataclass(frozen=True)
class Read:
    """The source read (then decoded by `map_fn`): both sides' examples, and what was learned."""

    ds: tf.data.Dataset
    val_ds: tf.data.Dataset | None = None
    num_files: int | None = None  # files (TFRecord) or shards (TFDS) read
    split_counts: tuple[int, int] | None = None  # (train, validation) examples, when known
    num_examples: int | None = None  # training examples, where tf.data cannot count them
    random_ops: tuple[str, ...] = ()  # random op types in map_fn (they defeat the cache)
    ragged: bool = False  # map_fn got rows of a ragged feature: batch them ragged again
    reshuffled: bool = False  # the dataset passed in reshuffles its examples every pass


class Source:
    """One kind of `data`; subclasses override what differs for their kind."""

    kind: ClassVar[str]
    takes: ClassVar[tuple[str, ...]] = ()  # the source-only arguments this kind accepts
    in_memory: ClassVar[bool] = False  # a cache gains nothing without `map_fn` (arrays)
    cache_unmapped: ClassVar[bool] = True  # cache="auto" caches it even without `map_fn`

    def __init__(self, value: Any) -> None:
        self.value = value

    def check(self, args: Arguments) -> None:
        """The checks that depend on the kind; may normalize `args` (run before any work)."""
        if "split" not in self.takes and (args.split is not None or args.data_dir is not None):
            raise ValueError(
                f"Invalid arguments `split`/`data_dir`. Received: split={args.split!r}, "
                f"data_dir={args.data_dir!r} for a {self.kind} source. Expected them only "
                "with a TensorFlow Datasets name as `data`."
            )
        if "compression_type" not in self.takes and args.compression_type:
            raise ValueError(
                f"Invalid argument `compression_type`. Received: compression_type="
                f"{args.compression_type!r} for a {self.kind} source. Expected it only for "
                "TFRecord files."
            )

    def batching(
        self, args: Arguments, requested: int | None, num_replicas: int
    ) -> tuple[Batches | None, bool, int | None]:
        """(the source's own batches, whether they are kept, the batch size for `decide`)."""
        return None, False, args.batch_size

    def count(self, batches: Batches | None, validation_split: float) -> int | None:
        """Examples known before reading, for `validation_split`; None: counted when read."""
        return None

    def read(self, args: Arguments, batching: Batching) -> Read:
        raise NotImplementedError

    @staticmethod
    def shard_policy(facts: Facts) -> str:
        """The auto-shard policy: every worker reads everything and keeps its share."""
        return "DATA"


class ArraySource(Source):
    """Arrays, tensors, and tuples or dicts of them; `value` is the checked structure."""

    kind = "memory"
    in_memory = True
    cache_unmapped = False

    def __init__(self, value: Any) -> None:
        (checked,), self.num_examples = check_arrays({"data": value}, _SOURCE_TYPES)
        super().__init__(checked)

    def count(self, batches: Batches | None, validation_split: float) -> int | None:
        return self.num_examples

    def read(self, args: Arguments, batching: Batching) -> Read:
        ds = tf.data.Dataset.from_tensor_slices(self.value)
        counts = batching.split_counts
        n = counts[0] if counts else self.num_examples
        if args.service is not None:
            # Chunks the dispatcher hands out one at a time, not one split per example.
            train = memory_source(self.value, n)
        else:
            train = ds.take(n) if counts else ds
        return Read(train, ds.skip(n) if counts else None, split_counts=counts, num_examples=n)


class DatasetSource(Source):
    """A `tf.data.Dataset` of examples, or of batches (a Keras loader's)."""

    kind = "dataset"
    cache_unmapped = False

    def __init__(self, value: tf.data.Dataset) -> None:
        if cardinality(value) == 0:
            raise invalid_value(
                "data",
                value,
                "at least one example",
                received="a `tf.data.Dataset` with 0 elements (cardinality 0)",
            )
        super().__init__(_count_unbatched(value))

    def check(self, args: Arguments) -> None:
        super().check(args)
        if args.validation_split is None:
            return
        if reshuffles(self.value):
            raise refuse_dataset_split(
                "that reshuffles its examples every pass (a `shuffle` step with "
                "reshuffle_each_iteration=True, as Keras loaders do by default), so training "
                "and validation examples would swap every epoch",
                args.validation_split,
            )
        unordered = unordered_step(self.value)
        if unordered:
            raise refuse_dataset_split(
                f"with a step that runs out of order ({unordered}), so which examples come "
                "last, and are held out, changes every pass. Remove that step's "
                "deterministic=False (tf.data's default keeps the order)",
                args.validation_split,
            )
        # The split takes the last examples: the pipeline's `deterministic=True` orders the
        # steps before it (not one built with `deterministic=False`, refused above).
        if args.deterministic is False:
            raise conflicting(
                "deterministic=False",
                f"validation_split={args.validation_split} for a `tf.data.Dataset`",
                "The split takes the dataset's last examples, which must come in the same "
                "order every pass: leave deterministic=None (the pipeline is then "
                "deterministic).",
            )
        args.deterministic = True

    def batching(
        self, args: Arguments, requested: int | None, num_replicas: int
    ) -> tuple[Batches | None, bool, int | None]:
        """Batches are kept when they are what was asked for (docs/data.md, "Datasets that are
        already batched"); else the source is unbatched and batched again."""
        batches, ambiguous = source_batches(self.value)
        if ambiguous:
            warn_at_user_code(
                "tfgpu.data.pipeline: cannot tell whether the dataset passed in yields examples "
                f"or batches (its chain ends in a step that makes new elements, and every "
                f"component has an unknown first dimension: {self.value.element_spec}). It is "
                "treated as examples and batched; if its elements are batches, unbatch them "
                "first (`.unbatch()`), or build it without batching."
            )
        if batches is None:
            return None, False, args.batch_size
        size = batches.batch_size
        per_example = [f"{n}=..." for n in ("map_fn", "augment_fn") if getattr(args, n)] + [
            f"{n}={getattr(args, n)}"
            for n in ("shuffle_buffer", "validation_split")
            if getattr(args, n) is not None
        ]
        shown = "of unknown size" if size is None else f"of {size}"
        if (
            (requested is None or requested == size)
            and not per_example
            and not (args.drop_remainder and batches.drop_remainder is not True)
        ):
            if size is not None and size % num_replicas:
                raise invalid_value(
                    "data",
                    self.value,
                    f"batches that are a multiple of {num_replicas}: pass batch_size="
                    f"{max(1, size // num_replicas) * num_replicas} to rebatch it",
                    received=f"a dataset already batched in batches of {size}, which do not "
                    f"split evenly over the strategy's {num_replicas} replicas",
                )
            _LOG.info(
                "tfgpu.data.pipeline: the dataset passed in is already batched (batches %s); "
                "its batches are kept as they are (order, shuffling and the last partial batch "
                "are its own). Pass batch_size to rebatch it.",
                shown,
            )
            return batches, True, size
        if requested is None and size is None:
            raise ValueError(
                "Invalid arguments `batch_size` and `per_replica_batch_size`. Received: "
                f"batch_size=None, per_replica_batch_size=None with {', '.join(per_example)} "
                "for a dataset that is already batched in batches of unknown size. Expected "
                "a `batch_size`: the source is unbatched and batched again at that size."
            )
        reason = (
            f"batch_size {requested} asked for"
            if requested is not None and requested != size
            else f"per-example work ({', '.join(per_example)})"
            if per_example
            else "drop_remainder=True"
        )
        known = batches.num_examples is not None
        _LOG.info(
            "tfgpu.data.pipeline: the dataset passed in is already batched (batches %s); it is "
            "unbatched and %s are batched again (%s).",
            shown,
            f"{batches.num_examples} examples" if known else "its examples",
            reason,
        )
        return batches, False, size if requested is None else args.batch_size

    def count(self, batches: Batches | None, validation_split: float) -> int | None:
        total = batches.num_examples if batches is not None else cardinality(self.value)
        if total is None:
            raise refuse_dataset_split(
                "whose number of examples is unknown (e.g. after a `filter` or from a "
                "generator), so its last fraction cannot be taken",
                validation_split,
            )
        if total < 0:
            raise refuse_dataset_split("that is infinite (repeated)", validation_split)
        return total

    def read(self, args: Arguments, batching: Batching) -> Read:
        ds, batches = self.value, batching.batched_source
        if batches is not None and not batching.keep_batches:
            ds = ds.unbatch()
            if batches.num_examples is not None:  # unbatch forgets the count
                ds = ds.apply(tf.data.experimental.assert_cardinality(batches.num_examples))
            else:
                warn_at_user_code(
                    "tfgpu.data.pipeline: the number of examples in the batched dataset passed "
                    "in is unknown, so the rebatched pipeline's cardinality is unknown too "
                    "(Keras shows no step count in the first epoch). Pass the loader's examples "
                    "unbatched (e.g. `image_dataset_from_directory(..., batch_size=None)`) to "
                    "keep it."
                )
        counts = batching.split_counts
        if counts is None:
            return Read(ds, reshuffled=reshuffles(self.value))
        return Read(ds.take(counts[0]), ds.skip(counts[0]), split_counts=counts)

    @staticmethod
    def shard_policy(facts: Facts) -> str:
        # As the user set it (AUTO), but DATA where take/skip count the whole dataset's examples
        # (under FILE each worker would split its own files; docs/data.md, "Sharding").
        return "DATA" if facts.split_by_position else "AUTO"


def unordered_step(ds: tf.data.Dataset) -> str:
    """A step of `ds`'s input chain (every input of a zip too) built with `deterministic=False`,
    as "ParallelMapDataset(deterministic=False)"; "" when none is. A parallel `map` or `batch`
    keeps the flag on its Python object, a parallel `interleave` only in its op (graph read)."""
    stack, seen = [ds], 0
    while stack and seen < 10_000:
        step = stack.pop()
        seen += 1
        name = type(step).__name__.strip("_")
        if getattr(step, "_deterministic", None) == "false":
            return f"{name}(deterministic=False)"
        if "interleave" in name.lower() and _graph_unordered(step):
            return f"{name}(deterministic=False)"
        stack.extend(dataset_inputs(step) or [])
    return ""


def _graph_unordered(ds: tf.data.Dataset) -> bool:
    """Whether an interleave op of `ds`'s graph (its functions' too) has deterministic="false"."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return any(
        "Interleave" in n.op and n.attr["deterministic"].s == b"false"
        for n in nodes
        if "deterministic" in n.attr
    )


# Steps that yield one element for each of their input's (class names, lowercase, no "_").
_ONE_FOR_ONE = (
    "mapdataset", "parallelmapdataset", "prefetchdataset", "optionsdataset", "shuffledataset",
    "cachedataset",
)  # fmt: skip


def _count_unbatched(ds: tf.data.Dataset) -> tf.data.Dataset:
    """`ds` with its cardinality restored where `unbatch` forgot it (`loader.unbatch()`): an
    `unbatch` of batches whose examples can be counted, then only one-for-one steps."""
    if cardinality(ds) is not None:
        return ds
    step, inputs = ds, dataset_inputs(ds)
    while inputs is not None and len(inputs) == 1:
        name = type(step).__name__.lower().replace("_", "")
        if name == "unbatchdataset":
            batches, _ = source_batches(inputs[0])
            if batches is None or batches.num_examples is None:
                return ds
            return ds.apply(tf.data.experimental.assert_cardinality(batches.num_examples))
        if name not in _ONE_FOR_ONE:
            return ds
        step, inputs = inputs[0], dataset_inputs(inputs[0])
    return ds


def shard_by_file(facts: Facts) -> str:
    """FILE with at least one file per worker (each reads whole files of its own), else DATA."""
    enough = facts.num_files is not None and facts.num_files >= facts.workers
    return "FILE" if enough else "DATA"


class RecordSource(Source):
    """TFRecord files (a pattern or a list of them); `value` is the list of files."""

    kind = "files"
    takes = ("compression_type",)
    shard_policy = staticmethod(shard_by_file)

    def check(self, args: Arguments) -> None:
        super().check(args)
        check_compression(self.value, args.compression_type or "")

    def read(self, args: Arguments, batching: Batching) -> Read:
        compression = args.compression_type or ""
        ds = read_files(self.value, args.shuffle, args.deterministic, args.seed, compression)
        if args.validation_split is None:
            return Read(ds, num_files=len(self.value))
        in_validation = validation_filter(args.validation_split)
        return Read(
            ds.filter(lambda record: tf.logical_not(in_validation(record))),
            read_files(self.value, False, True, None, compression).filter(in_validation),
            num_files=len(self.value),
        )


class TfdsSource(Source):
    """A TensorFlow Datasets name; read with `load_tfds`, sharded by file like TFRecords."""

    kind = "tfds"
    takes = ("split", "data_dir")
    shard_policy = staticmethod(shard_by_file)

    def check(self, args: Arguments) -> None:
        super().check(args)
        check_tfds_name(self.value, args.data_dir, arg="data")
        if args.validation_split is not None and args.split and re.search(r"[\[+]", args.split):
            raise conflicting(
                f"split={args.split!r}",
                f"validation_split={args.validation_split}",
                "Pass an unsliced split (e.g. split='train') with validation_split, or build "
                "two pipelines from sliced splits (split='train[:90%]' and "
                "split='train[90%:]', the second with shuffle=False).",
            )

    def read(self, args: Arguments, batching: Batching) -> Read:
        """The split read; with `validation_split`, sliced by counts (its size known here)."""
        name, validation_split, split = self.value, args.validation_split, args.split or "train"

        def load(part: str, shuffled: bool) -> tuple[tf.data.Dataset, Any]:
            return load_tfds_dataset(
                name,
                part,
                data_dir=args.data_dir,
                download=False,
                shuffle_files=shuffled,
                as_supervised=None,
                seed=args.seed if shuffled else None,
                prefetch=False,
            )

        ds, info = load(split, args.shuffle)
        split_info = tfds_split_info(info, split)
        num_files = getattr(split_info, "num_shards", None)
        if validation_split is None:
            return Read(ds, num_files=num_files)
        examples: Any = getattr(split_info, "num_examples", None)
        if not is_int(examples) or examples < 1:
            raise invalid_value(
                "validation_split",
                validation_split,
                "a prepared split with a known size, or sliced splits in two pipelines "
                f"(split='{split}[:90%]' and split='{split}[90%:]')",
                received=f"validation_split={validation_split}, but the number of examples in "
                f"{name!r} split {split!r} is unknown",
            )
        counts = check_split_counts(int(examples), args, batching.global_batch, batching.drop)
        train, val = f"{split}[:{counts[0]}]", f"{split}[{counts[0]}:]"  # the last examples
        return Read(load(train, args.shuffle)[0], load(val, False)[0], num_files, counts)


SOURCES: dict[str, type[Source]] = {
    s.kind: s for s in (ArraySource, DatasetSource, RecordSource, TfdsSource)
}


def classify(data: Any) -> Source:
    """The adapter for `data`, or raises `TypeError`/`ValueError`. No TensorFlow work."""
    if isinstance(data, tf.data.Dataset):
        return DatasetSource(data)
    if isinstance(data, (str, bytes, os.PathLike)):
        text = os.fsdecode(data)
        if not text.strip():
            raise invalid_value(
                "data", data, "a TFRecord file pattern or a TensorFlow Datasets name"
            )
        if os.path.isdir(os.path.expanduser(text)):
            raise invalid_value(
                "data",
                data,
                "TFRecord files or a glob pattern, e.g. "
                f"{os.path.join(text, '*.tfrecord')!r}; for a folder of images, use "
                "`keras.utils.image_dataset_from_directory(..., batch_size=None)` and pass "
                "its dataset",
                received=f"data={text!r}, which is a directory",
            )
        files = _expand_patterns([text])
        if files:
            return RecordSource(files)
        if _TFDS_NAME.match(text) and not os.path.splitext(text)[1]:
            return TfdsSource(text)
        raise _not_found(
            data,
            "an existing TFRecord file or glob pattern such as 'data/train-*.tfrecord'",
            f"data={text!r}, a file pattern that matches no files (looked in "
            f"{os.path.abspath(os.path.dirname(text) or '.')})",
        )
    if isinstance(data, list) and data and all(isinstance(s, (str, os.PathLike)) for s in data):
        patterns = [os.fspath(s) for s in data]
        missing = [p for p in patterns if not _expand_patterns([p])]
        if missing:
            raise _not_found(
                data,
                "existing TFRecord files or glob patterns",
                f"file patterns that match no files: {missing}",
            )
        return RecordSource(_expand_patterns(patterns))
    if isinstance(
        data,
        (np.ndarray, np.generic, tf.Tensor, tf.RaggedTensor, tf.SparseTensor, tuple, Mapping, list),
    ):
        return ArraySource(data)
    raise invalid_type(
        "data",
        data,
        f"{_SOURCE_TYPES}. For a Python generator, wrap it first with "
        "`tf.data.Dataset.from_generator`",
        received=f"data of type {type(data).__module__}.{type(data).__qualname__}",
    )


def _not_found(data: Any, expected: str, received: str) -> FileNotFoundError:
    """A missing file is a FileNotFoundError (docs/data.md), in the one phrasing."""
    return FileNotFoundError(str(invalid_value("data", data, expected, received=received)))


def _expand_patterns(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        files.extend(sorted(glob.glob(os.path.expanduser(pattern))))
    return [f for f in dict.fromkeys(files) if os.path.isfile(f)]


def check_compression(files: list[str], compression_type: str) -> None:
    """ValueError when the first file's bytes contradict `compression_type` (TensorFlow fails
    only when reading, with a `DataLossError` that names neither the file nor the argument)."""
    path = files[0]
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise invalid_value(
            "data",
            files,
            "readable TFRecord files",
            received=f"a file that cannot be read: {path!r} ({e.strerror})",
        ) from None
    if not head:
        return  # an empty file holds no records, in any compression
    found = ""  # what the first bytes decompress as
    for kind, wbits in (("GZIP", 16 + zlib.MAX_WBITS), ("ZLIB", zlib.MAX_WBITS)):
        try:
            zlib.decompressobj(wbits).decompress(head, 1)
        except zlib.error:
            continue
        found = kind
        break
    if found == compression_type or (found == "ZLIB" and compression_type == ""):
        return  # a plain TFRecord that happens to parse as zlib is left to TensorFlow
    shown = {"GZIP": "GZIP-compressed", "ZLIB": "ZLIB-compressed", "": "not compressed"}
    raise invalid_value(
        "compression_type",
        compression_type,
        f"the files' compression: pass compression_type={found or None!r}",
        received=f"compression_type={compression_type or None!r}, but {path!r} is {shown[found]}",
    )


def read_files(
    files: list[str], shuffled: bool, ordered: bool | None, seed: int | None, compression: str
) -> tf.data.Dataset:
    """TFRecord files interleaved in parallel; their order shuffled every pass if `shuffled`."""
    names = tf.data.Dataset.from_tensor_slices(files)
    if shuffled:
        names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    return names.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=min(len(files), max(usable_cores(), 2)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=ordered,
    )
