"""`validation_split`: its check, the counts, the split of records by hash (docs/data.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import tensorflow as tf

from tfgpu._internal.helpers.checks import invalid_value

if TYPE_CHECKING:
    from tfgpu.data._arguments import Arguments

# Hash buckets of the TFRecord split: a record is validation when its bucket (of its bytes) is
# below `validation_split * _BUCKETS`, the same every epoch, file order and worker.
_BUCKETS = 1 << 20


def check_split_counts(
    n: int, args: Arguments, global_batch: int | None, drop_remainder: bool
) -> tuple[int, int]:
    """(train, validation) of `n` examples; ValueError for a side with no example, or no full
    batch to keep (the validation side drops one only with the user's `drop_remainder=True`)."""
    validation_split = args.validation_split
    train = math.floor(n * (1.0 - validation_split))  # the last fraction, as Keras `fit` takes it
    validation = n - train
    shown = (
        f"validation_split={validation_split} of {n} examples gives {train} for training "
        f"and {validation} for validation"
    )
    if n < 2:  # no fraction splits a single example
        raise invalid_value(
            "validation_split",
            validation_split,
            "a source of at least 2 examples, one for each side: pass more data, or "
            "validation_split=None",
            received=shown,
        )
    if not train or not validation:
        raise invalid_value(
            "validation_split",
            validation_split,
            "a split that leaves at least one example on each side: pass a validation_split "
            f"between {1 / n:.3g} and {1 - 1 / n:.3g}, or more data",
            received=shown,
        )
    if global_batch:
        short = [
            f"{side} ({count} examples)"
            for side, count, drops in (
                ("training", train, drop_remainder),
                ("validation", validation, args.drop_remainder is True),
            )
            if drops and count < global_batch
        ]
        if short:
            raise invalid_value(
                "validation_split",
                validation_split,
                "each side to hold at least one global batch: pass another validation_split, "
                "a smaller batch size, drop_remainder=False, or more data",
                received=f"{shown}, but drop_remainder=True drops partial batches of the "
                f"global batch of {global_batch}, so {' and '.join(short)} would yield no "
                "batch at all",
            )
    return train, validation


def refuse_dataset_split(reason: str, validation_split: float) -> ValueError:
    return invalid_value(
        "validation_split",
        validation_split,
        "a dataset whose examples come in the same order every pass, and a known number of "
        "them. Split with the loader instead, e.g. `train_ds, val_ds = "
        "keras.utils.image_dataset_from_directory("
        f'..., validation_split={validation_split}, subset="both", seed=1337)` and a '
        "`tfgpu.data.pipeline(...)` for each (validation with shuffle=False); or load it with "
        "shuffle=False, if its order is already mixed (a class-folder loader lists files class "
        "by class, so its last examples would all be of the last class)",
        received=f"validation_split={validation_split} for a `tf.data.Dataset` {reason}",
    )


def validation_filter(validation_split: float) -> Callable:
    """A `filter` predicate on serialized records: True for the validation share."""
    threshold = min(max(round(validation_split * _BUCKETS), 1), _BUCKETS - 1)

    def predicate(record: tf.Tensor) -> tf.Tensor:
        return tf.strings.to_hash_bucket_fast(record, _BUCKETS) < threshold

    return predicate
