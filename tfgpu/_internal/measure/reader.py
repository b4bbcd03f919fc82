"""The one bounded reader of the measuring core: a dataset's batches read alone, no model,
in a graph loop, timed after warm-up, given up when no batch comes for a bound (`read_alone`,
behind `tfgpu.data.benchmark`; `diagnose`, `tune` and `scaling` time the input with it)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import numpy as np
import tensorflow as tf

from tfgpu._internal.adapters import datasets
from tfgpu._internal.adapters.cpu import usable_cores
from tfgpu._internal.adapters.datasets import cardinality, stalled
from tfgpu._internal.helpers.bounded import call_bounded
from tfgpu._internal.helpers.checks import invalid_value


@dataclasses.dataclass(frozen=True)
class PipelineBenchmark:
    """Throughput of an input pipeline measured alone (no model), after warm-up.

    Attributes:
        examples_per_s: float, examples delivered per second over the timed batches.
        batches_per_s: float, batches delivered per second over the timed batches.
        num_batches: int, batches timed (after warm-up).
        num_examples: int, examples in the timed batches.
        seconds: float, wall time of the timed batches.
        batch_size: int or None, the batch size when every timed batch had the same one.
        warmup_batches: int, batches consumed before timing.
        warmup_seconds: float, wall time of the warm-up (pipeline start, buffers filling).
        epochs: int, passes over the dataset that provided the batches.
        cpu_busy: float, the share of the `cpu_cores` kept busy during the timed batches
            (about 1.0: every core is used; docs/data.md). NaN when not measured.
        cpu_cores: int, the CPU cores this process can use. 0 when not measured.
    """

    examples_per_s: float
    batches_per_s: float
    num_batches: int
    num_examples: int
    seconds: float
    batch_size: int | None
    warmup_batches: int = 0
    warmup_seconds: float = 0.0
    epochs: int = 1
    cpu_busy: float = math.nan
    cpu_cores: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        cpu = (
            f"; {self.cpu_busy:.0%} of {self.cpu_cores} CPU cores busy"
            if math.isfinite(self.cpu_busy) and self.cpu_cores
            else ""
        )
        return (
            f"{self.examples_per_s:,.0f} examples/s, {self.batches_per_s:,.1f} "
            f"batches/s ({self.num_batches} batches of {self.batch_size or 'varying size'} in "
            f"{self.seconds:.2f} s after {self.warmup_batches} warm-up batches{cpu})"
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


@functools.partial(tf.function, autograph=False)  # traced once per iterator type
def _consume(
    iterator: Any, n: tf.Tensor, progress: tf.Variable, indexed: bool = False
) -> tuple[tf.Tensor, ...]:
    """Takes up to `n` batches from `iterator` in a graph loop (microseconds a batch, where a
    Python `next()` costs tens to hundreds): (batches taken, fewer when exhausted; examples;
    smallest and largest batch; epochs started, from `indexed` `(index in epoch, batch)`).
    `progress` counts the batches taken, for a watcher in another thread."""

    def body(i, count, examples, low, high, starts):
        optional = iterator.get_next_as_optional()

        def took():
            value = optional.get_value()
            start = tf.constant(0, tf.int64)
            if indexed:
                index, value = value
                start = tf.cast(tf.equal(index, 0), tf.int64)
            k = _batch_examples(value)
            with tf.control_dependencies([progress.assign_add(1)]):
                k = tf.identity(k)
            smallest, largest = tf.minimum(low, k), tf.maximum(high, k)
            return i + 1, count + 1, examples + k, smallest, largest, starts + start

        def exhausted():
            return n, count, examples, low, high, starts

        return tf.cond(optional.has_value(), took, exhausted)

    zero = tf.constant(0, tf.int64)
    init = (zero, zero, zero, tf.constant(np.iinfo(np.int64).max, tf.int64), zero, zero)
    _, count, examples, low, high, starts = tf.while_loop(
        lambda i, *_: i < n, body, init, parallel_iterations=1
    )
    return count, examples, low, high, starts


class _Reader:
    """Batches of `data` from one iterator whatever the passes, as `fit` reads `data.repeat()`
    (the index in each pass counts them); a finite distributed dataset is started again."""

    def __init__(self, data: Any, progress: tf.Variable) -> None:
        self.indexed = isinstance(data, tf.data.Dataset) and cardinality(data) != -1
        self.source = data.enumerate().repeat() if self.indexed else data
        self.progress = progress
        self.iterator = iter(self.source)
        self.fresh = True  # no batch taken from `iterator` yet
        self.epochs = 1  # iterators made (`indexed`: the passes are counted instead)

    def consume(self, n: int) -> list[int]:
        """`_consume` of up to `n` batches of the current iterator, as Python ints."""
        taken = _consume(self.iterator, tf.constant(n, tf.int64), self.progress, self.indexed)
        return [int(t) for t in taken]

    def take(self, n: int) -> tuple[int, int, int, int]:
        """Takes `n` batches: (examples, smallest batch, largest batch, passes started)."""
        examples, low, high, starts = 0, np.iinfo(np.int64).max, 0, 0
        while n:
            count, k, lo, hi, st = self.consume(n)
            if count:
                self.fresh = False
                examples, low, high = examples + k, min(low, lo), max(high, hi)
                starts += st
            n -= count
            if n:
                if self.fresh:
                    empty = "a dataset that yields no batches"
                    raise invalid_value("data", None, "at least one batch", received=empty)
                self.epochs += 1
                self.iterator = iter(self.source)
                self.fresh = True
        return examples, low, high, starts


def _measure(data: Any, progress: tf.Variable, steps: int, warmup: int) -> PipelineBenchmark:
    """Takes `warmup` batches, then times `steps` (in `call_bounded`'s thread)."""
    reader = _Reader(data, progress)
    reader.consume(0)  # trace now: neither warm-up nor timing
    start = time.perf_counter()
    *_, starts_warm = reader.take(warmup)
    warmup_seconds = time.perf_counter() - start

    cores = usable_cores()
    start, cpu_start = time.perf_counter(), time.process_time()
    examples, low, high, starts_timed = reader.take(steps)
    seconds = max(time.perf_counter() - start, 1e-9)
    cpu_seconds = time.process_time() - cpu_start  # every thread of this process: tf.data's
    return PipelineBenchmark(
        examples_per_s=examples / seconds,
        batches_per_s=steps / seconds,
        num_batches=steps,
        num_examples=examples,
        seconds=seconds,
        batch_size=low if low == high else None,
        warmup_batches=warmup,
        warmup_seconds=warmup_seconds,
        epochs=max(1, starts_warm + starts_timed) if reader.indexed else reader.epochs,
        cpu_busy=min(1.0, max(0.0, cpu_seconds / (seconds * cores))),  # clock granularity
        cpu_cores=cores,
    )


def read_alone(
    data: Any, steps: int, warmup: int, timeout_s: float | None = None
) -> PipelineBenchmark:
    """`warmup` batches of `data` (a dataset or a distributed one) read untimed, then `steps`
    timed; a TimeoutError when no batch came for `timeout_s` (None: `READ_TIMEOUT_S`; its
    reading thread is left to end on its own), a ValueError when the dataset yields none."""
    timeout_s = datasets.READ_TIMEOUT_S if timeout_s is None else timeout_s
    progress = tf.Variable(0, dtype=tf.int64, trainable=False)  # batches taken so far
    return call_bounded(
        functools.partial(_measure, data, progress, steps, warmup),
        timeout_s=timeout_s,
        progress=lambda: int(progress.numpy()),
        timeout_error=lambda taken: stalled(timeout_s, f"after {taken} batches"),
        name="tfgpu-benchmark",
    )
