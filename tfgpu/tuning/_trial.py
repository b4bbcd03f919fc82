"""What `tune` reads beyond the workload's facts: the numerics guard's loss, whether
`augment_fn` runs on whole batches, whether another dataset's output may be cached."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import psutil
import tensorflow as tf

from tfgpu._internal.adapters.datasets import read_first, unrepeatable
from tfgpu._internal.adapters.model_state import preserved
from tfgpu._internal.helpers.warn import one_line
from tfgpu._internal.measure.facts import batch_nbytes
from tfgpu._internal.measure.variants import Variants

# Copies of one example in the batch that tells a per-example draw from a per-batch one: a
# random flip leaves 16 copies all alike once in 2**15 (4 copies: once in 8, a flaky verdict).
_COPIES = 16
# A user's dataset is cached only when its output takes at most this share of free memory.
CACHE_MEMORY_SHARE = 0.25


@dataclasses.dataclass
class Failure:
    """What the body of a `recorded` block raised, in words (None while nothing failed), and
    the exception itself."""

    text: str | None = None
    error: Exception | None = None


@contextlib.contextmanager
def recorded(describe: Callable[[Exception], str] = one_line) -> Iterator[Failure]:
    """Runs the body; an error in it goes into the `Failure` given, as `describe(error)`."""
    failure = Failure()
    try:
        yield failure
    except Exception as e:  # tune's one catch-all: a setting that breaks the model or the
        # pipeline (any error, theirs or TensorFlow's) is recorded, never a crash of the search
        failure.text, failure.error = describe(e), e


def mean_loss(variants: Variants, batches: list[Any], changes: dict[str, Any]) -> float:
    """The numerics guard: the mean training loss over `batches`, one step each, with
    `changes`, from the current weights of the user's model (put back afterwards)."""
    model = variants.model_for(changes)
    jit = changes.get("jit_compile", variants.model.jit_compile)
    losses = []
    with preserved(model), variants.strategy_for(model, changes), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.steps_per_execution = 1
        model.jit_compile = jit
        model.train_function = None
        for batch in batches:
            x, y, sw = keras.utils.unpack_x_y_sample_weight(batch)
            logs = model.train_on_batch(x, y, sample_weight=sw, return_dict=True)
            losses.append(float(logs["loss"]))
    if not losses:
        return math.nan
    if not all(math.isfinite(v) for v in losses):
        return next(v for v in losses if not math.isfinite(v))
    return sum(losses) / len(losses)


def augment_on_batches(arguments: dict[str, Any] | None, rebuild: Any) -> str:
    """Why the pipeline's `augment_fn` cannot simply run on whole batches ("" when it can, or
    there is none): it fails on a batch, or draws its random values once per batch (copies of
    one example come out alike while two calls differ). Reads one unaugmented batch, built by
    `rebuild` (`tfgpu.data.pipeline`)."""
    fn = (arguments or {}).get("augment_fn")
    if fn is None:
        return ""
    with recorded(lambda e: one_line(e, limit=120)) as failure:
        kwargs = {**(arguments or {}), "augment_fn": None, "shuffle": False, "distribute": False}
        kwargs.update(validation_split=None, repeat=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch = read_first(rebuild(**kwargs), 1)[0]
    if failure.text is not None:
        return f"its input batches could not be read: {failure.text}"
    parts = batch if isinstance(batch, tuple) else (batch,)  # fn's arguments
    with recorded(lambda e: one_line(e, limit=160)) as failure:
        out = fn(*parts)
        copies = tuple(
            tf.nest.map_structure(lambda t: tf.repeat(t[:1], _COPIES, axis=0), p) for p in parts
        )
        alike = fn(*copies)
        first = tuple(tf.nest.map_structure(lambda t: t[0], p) for p in parts)
        one, two = fn(*first), fn(*first)
    if failure.text is not None:
        return failure.text
    leaves_in, leaves_out = tf.nest.flatten(parts), tf.nest.flatten(out)
    if len(leaves_in) != len(leaves_out) or any(
        getattr(o, "shape", None) is None
        or o.shape.rank != i.shape.rank
        or o.shape[0] != i.shape[0]
        for i, o in zip(leaves_in, leaves_out, strict=False)
    ):
        return "on a batch it changes the batch's shape"

    def same(a: Any, b: Any) -> bool:
        return all(
            bool(tf.reduce_all(tf.equal(x, y)))
            for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True)
        )

    rows = [tf.nest.map_structure(lambda t, k=k: t[k], alike) for k in range(_COPIES)]
    if all(same(rows[0], r) for r in rows[1:]) and not same(one, two):
        return "on a batch it draws its random values once for the whole batch"
    return ""


def cache_untried(data: tf.data.Dataset, first: Any, batches: int | None) -> str:
    """Why caching another dataset's output is not tried ("": it is); `first`: its first batch."""
    why = unrepeatable(data)
    if why:
        return f"{why}: a cache would replay its first epoch"
    if batches is None:
        return "its length is unknown or infinite"
    size = batches * (batch_nbytes(first) or 0)
    available = psutil.virtual_memory().available
    if size > CACHE_MEMORY_SHARE * available:
        return f"about {size / 2**20:,.0f} MiB: more than a quarter of the memory available"
    return ""
