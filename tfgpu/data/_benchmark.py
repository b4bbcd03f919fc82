"""`benchmark()`: the measuring core's reader of a pipeline alone, its arguments checked."""

from __future__ import annotations

import tensorflow as tf

from tfgpu._internal.adapters.datasets import READ_TIMEOUT_S, cardinality
from tfgpu._internal.helpers.checks import check_int, check_number, invalid_type, invalid_value
from tfgpu._internal.measure.reader import PipelineBenchmark, read_alone
from tfgpu.data._limits import MAX_COUNT, POSITIVE


def benchmark(
    data: tf.data.Dataset | tf.distribute.DistributedDataset,
    *,
    steps: int = 50,
    warmup: int = 5,
    timeout_s: float = READ_TIMEOUT_S,
) -> PipelineBenchmark:
    """Measures an input pipeline alone: examples/s and batches/s after warm-up.

    Consumes `warmup` batches untimed, then times `steps` batches inside TensorFlow (a short
    finite dataset is read as `data.repeat()`). The guide: docs/data.md, "benchmark".

    Args:
        data: `tf.data.Dataset` of batches (e.g. from `pipeline()`), or a distributed dataset.
        steps: int, batches to time. Defaults to 50.
        warmup: int, batches to consume before timing. Defaults to 5.
        timeout_s: float, the longest wait for one batch, the first included. Defaults to 120.

    Returns:
        A `PipelineBenchmark`.

    Raises:
        TypeError: if `data` is not a dataset, or `steps`/`warmup` is not an int.
        ValueError: for `steps` < 1, `warmup` < 0, `timeout_s` not > 0, or no batch at all.
        TimeoutError: if no batch came in `timeout_s` seconds (its reading thread lives on).

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
