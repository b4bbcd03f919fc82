"""Reading each kind of source into a dataset of examples, and splitting off the validation
examples before any shuffle (arrays and datasets by position, TFRecords by hash, TFDS by
slicing the split)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.cpu import usable_cores
from tfgpu._internal.adapters.datasets import Batches
from tfgpu._internal.helpers.checks import is_int
from tfgpu.data._arguments import Arguments
from tfgpu.data._split import SPLIT_BUCKETS, check_split_counts, tfds_slices, validation_filter
from tfgpu.data._tfds import load_tfds_dataset, tfds_split_info


@dataclasses.dataclass(frozen=True)
class Read:
    """The source read: the training examples, the validation ones, and what was learned."""

    ds: tf.data.Dataset
    val_ds: tf.data.Dataset | None
    num_files: int | None  # files (TFRecord) or shards (TFDS) read; None for the others
    split_counts: tuple[int, int] | None  # (train, validation) examples, when known


def read(
    args: Arguments,
    *,
    batched_source: Batches | None,
    keep_batches: bool,
    split_counts: tuple[int, int] | None,
    global_batch: int | None,
    drop: bool,
) -> Read:
    """Reads `args.src` (in the order the plan needs) and splits off the validation examples.

    `split_counts` are the counts already checked for arrays and datasets; a TFDS split's are
    checked here, where its size is first known. Warnings point at the caller of `pipeline`.
    """
    src = args.src
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
                    stacklevel=3,
                )
        if split_counts is not None:
            ds, val_ds = ds.take(split_counts[0]), ds.skip(split_counts[0])
    elif src.kind == "files":
        num_files = len(src.value)
        ds = read_files(
            src.value,
            shuffled=args.shuffle,
            ordered=args.deterministic,
            seed=args.seed,
            compression_type=args.compression_type or "",
        )
        if args.validation_split is not None:
            threshold = min(max(round(args.validation_split * SPLIT_BUCKETS), 1), SPLIT_BUCKETS - 1)
            in_validation = validation_filter(threshold)
            ds = ds.filter(lambda record: tf.logical_not(in_validation(record)))
            val_ds = read_files(
                src.value,
                shuffled=False,
                ordered=True,
                seed=None,
                compression_type=args.compression_type or "",
            ).filter(in_validation)
    else:
        ds, val_ds, num_files, split_counts = _read_tfds(args, global_batch=global_batch, drop=drop)
    return Read(ds=ds, val_ds=val_ds, num_files=num_files, split_counts=split_counts)


def read_files(
    files: list[str],
    *,
    shuffled: bool,
    ordered: bool | None,
    seed: int | None,
    compression_type: str,
) -> tf.data.Dataset:
    """TFRecord files interleaved in parallel; their order shuffled every pass if `shuffled`."""
    count = len(files)
    names = tf.data.Dataset.from_tensor_slices(files)
    if shuffled:
        names = names.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    return names.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression_type),
        cycle_length=min(count, max(usable_cores(), 2)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=ordered,
    )


def _read_tfds(
    args: Arguments, *, global_batch: int | None, drop: bool
) -> tuple[tf.data.Dataset, tf.data.Dataset | None, int | None, tuple[int, int] | None]:
    """A TFDS split read without prefetch; with `validation_split`, sliced in two by counts."""
    name, validation_split = args.src.value, args.validation_split
    tfds_split = args.split or "train"
    ds, info = load_tfds_dataset(
        name,
        tfds_split,
        data_dir=args.data_dir,
        download=False,
        shuffle_files=args.shuffle,
        as_supervised=None,
        seed=args.seed,
        prefetch=False,
    )
    split_info = tfds_split_info(info, tfds_split)
    num_files = getattr(split_info, "num_shards", None)
    if validation_split is None:
        return ds, None, num_files, None
    examples: Any = getattr(split_info, "num_examples", None)
    if not is_int(examples) or examples < 1:
        raise ValueError(
            f"Invalid value for argument `validation_split`. Received: validation_split="
            f"{validation_split}, but the number of examples in {name!r} split "
            f"{tfds_split!r} is unknown. Expected a prepared split with a known size, "
            f"or sliced splits in two pipelines (split='{tfds_split}[:90%]' and "
            f"split='{tfds_split}[90%:]')."
        )
    split_counts = check_split_counts(
        int(examples), validation_split, global_batch, drop, args.drop_remainder is True
    )
    train_split, val_split = tfds_slices(tfds_split, int(examples), validation_split)
    train_ds, val_ds = (
        load_tfds_dataset(
            name,
            part,
            data_dir=args.data_dir,
            download=False,
            shuffle_files=shuffled,
            as_supervised=None,
            seed=args.seed if shuffled else None,
            prefetch=False,
        )[0]
        for part, shuffled in ((train_split, args.shuffle), (val_split, False))
    )
    return train_ds, val_ds, num_files, split_counts
