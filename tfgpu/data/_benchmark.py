"""`benchmark()`: the speed of an input pipeline alone, no model, after warm-up (the
measuring core's reader, `_internal.measure.reader`, with its arguments checked)."""

from __future__ import annotations

import tensorflow as tf

from tfgpu._internal.adapters.datasets import READ_TIMEOUT_S, cardinality
from tfgpu._internal.helpers.checks import check_int, check_number, invalid_type, invalid_value
from tfgpu._internal.measure.reader import PipelineBenchmark, read_alone
from tfgpu.data._limits import MAX_COUNT, POSITIVE

# The longest wait for one batch: a dataset that stops yielding (a `filter` nothing passes, a
# source that waits forever) is reported instead of blocking `benchmark` for ever.
TIMEOUT_S = READ_TIMEOUT_S

__all__ = ["PipelineBenchmark", "benchmark"]


def benchmark(
    data: tf.data.Dataset | tf.distribute.DistributedDataset,
    *,
    steps: int = 50,
    warmup: int = 5,
    timeout_s: float = TIMEOUT_S,
) -> PipelineBenchmark:
    """Measures an input pipeline alone: examples/s and batches/s after warm-up.

    Consumes `warmup` batches untimed, then times `steps` batches inside TensorFlow; a short
    finite dataset is read as `data.repeat()` reads it. See docs/data.md, "benchmark".

    Args:
        data: `tf.data.Dataset` of batches (e.g. from `pipeline()`), or a distributed
            dataset from `distribute=True`.
        steps: int, batches to time. Defaults to 50.
        warmup: int, batches to consume before timing. Defaults to 5.
        timeout_s: float, the longest wait for one batch (the first one included) before
            giving up. Defaults to 120.

    Returns:
        A `PipelineBenchmark`.

    Raises:
        TypeError: if `data` is not a dataset, or `steps`/`warmup` is not an int.
        ValueError: if `steps` is < 1, `warmup` is negative, `timeout_s` is not a finite
            number > 0, or the dataset yields no batches. An infinite dataset is fine: only
            `warmup + steps` are taken.
        TimeoutError: if no batch came in `timeout_s` seconds (a dataset that never
            yields, e.g. a `filter` that nothing passes); its reading thread is left to end
            on its own.

    Example:

    ```python
    result = tfgpu.data.benchmark(train, steps=100)
    print(result.examples_per_s)
    ```
    """
    if not isinstance(data, (tf.data.Dataset, tf.distribute.DistributedDataset)):
        raise invalid_type(
            "data",
            data,
            "a `tf.data.Dataset` or a distributed dataset",
            received=f"data of type {type(data).__name__}",
        )
    steps = check_int("steps", steps, maximum=MAX_COUNT, expected=POSITIVE)
    warmup = check_int("warmup", warmup, minimum=0, maximum=MAX_COUNT, expected="an integer >= 0")
    timeout = check_number(
        "timeout_s",
        timeout_s,
        minimum=0,
        exclusive_minimum=True,
        expected="a finite number of seconds > 0",
    )
    if isinstance(data, tf.data.Dataset) and cardinality(data) == 0:
        raise invalid_value(
            "data",
            data,
            "at least one batch (is drop_remainder dropping everything?)",
            received="a dataset with 0 batches",
        )
    return read_alone(data, steps, warmup, timeout)
