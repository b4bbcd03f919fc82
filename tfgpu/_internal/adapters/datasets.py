"""What a `tf.data.Dataset` yields (batches or examples, how many: told by its input chain and
element spec), whether it reshuffles, and which ones `tfgpu.data.pipeline` built."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from tfgpu._internal.helpers.bounded import call_bounded

# The longest wait for an element of the user's data read before any training: a dataset that
# never yields one (a `filter` nothing passes) is reported instead of waited on for ever.
READ_TIMEOUT_S = 120.0


def read_first(ds: tf.data.Dataset, n: int) -> list[Any]:
    """The first `n` elements of `ds` (fewer if it ends); TimeoutError past `READ_TIMEOUT_S`."""
    elements: list[Any] = []

    def read() -> list[Any]:
        for element in ds.take(n):
            elements.append(element)
        return elements

    return call_bounded(
        read,
        timeout_s=READ_TIMEOUT_S,
        progress=lambda: len(elements),
        timeout_error=lambda got: stalled(READ_TIMEOUT_S, f"after {got} of the first {n}"),
    )


def stalled(timeout_s: float, progress: str) -> TimeoutError:
    """The error of a read that waited `timeout_s` seconds for an element of `data`."""
    return TimeoutError(
        f"No element from `data` in {timeout_s:g} s ({progress}). A dataset that never "
        "yields one (a `filter` that nothing passes, a source that waits for ever) would "
        "block here for ever. Check that `next(iter(data))` returns."
    )


def cardinality(ds: tf.data.Dataset) -> int | None:
    """Elements in `ds`: a count, -1 when infinite, None when TensorFlow cannot tell."""
    n = int(ds.cardinality().numpy())
    if n == tf.data.UNKNOWN_CARDINALITY:
        return None
    return -1 if n == tf.data.INFINITE_CARDINALITY else n


# Steps of an input chain by their (private) class names, lowercased, without underscores. Only
# the steps that make, undo or replace batches matter: every other step with one input (prefetch,
# map, cache, ...) passes its input's batched-ness through; the element spec has the last word.
_UNBATCH_STEP = "unbatch"
_BATCH_STEP = "batch"  # batch, padded_batch, rebatch, ragged/sparse batch, map_and_batch
_NEW_ELEMENT_STEPS = ("flatmap", "interleave", "window", "groupby", "bucket", "generator")
_EXAMPLE_SOURCES = ("tensorslice", "range", "record", "textline", "csv", "counter", "listfiles")


@dataclasses.dataclass(frozen=True)
class Batches:
    """What is known about the batches of a source that is already batched. Pure data."""

    batch_size: int | None  # examples per batch (the last may be smaller), when known
    drop_remainder: bool | None  # True: every batch is full
    num_examples: int | None  # examples in all its batches, when known


def spec_looks_batched(spec: Any) -> bool:
    """Whether every component has a first dimension, all unknown or equal: a batch's shape."""
    leaves = tf.nest.flatten(spec)
    known: set[int] = set()
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        if not isinstance(leaf, tf.TypeSpec) or shape is None or shape.rank in (None, 0):
            return False
        if isinstance(leaf, tf.data.DatasetSpec):
            return False
        if shape[0] is not None:
            known.add(int(shape[0]))
    return bool(leaves) and len(known) <= 1


def dataset_inputs(ds: Any) -> list[Any] | None:
    """The datasets `ds` reads from (tf.data's private `_inputs()`), or None without it."""
    try:
        return list(ds._inputs())
    except (AttributeError, NotImplementedError):
        return None


def chain_state(ds: tf.data.Dataset, depth: int = 0) -> tuple[str, tf.data.Dataset | None]:
    """Walks back to the step that decides `ds`'s elements: ("batched", that step), ("examples",
    None) at an unbatch or a source of examples, ("unknown", None) at flat_map & co. or no chain."""
    for _ in range(10_000):
        name = type(ds).__name__.lower().replace("_", "")
        if _UNBATCH_STEP in name:
            return "examples", None
        if _BATCH_STEP in name:
            return "batched", ds
        if any(step in name for step in _NEW_ELEMENT_STEPS):
            return "unknown", None
        inputs = dataset_inputs(ds)
        if inputs is None:
            return "unknown", None
        if not inputs:
            known = any(source in name for source in _EXAMPLE_SOURCES)
            return ("examples" if known else "unknown"), None
        if len(inputs) > 1:  # zip, concatenate, sample_from_datasets: all inputs must agree
            if depth > 50:
                return "unknown", None
            states = {chain_state(d, depth + 1)[0] for d in inputs}
            return (states.pop() if len(states) == 1 else "unknown"), None
        ds = inputs[0]
    return "unknown", None


def _static_int(value: Any) -> int | None:
    try:
        number = int(value.numpy() if hasattr(value, "numpy") else value)
    except (TypeError, ValueError):  # None, or not a scalar
        return None
    return number if number > 0 else None


def source_batches(ds: tf.data.Dataset) -> tuple[Batches | None, bool]:
    """The facts of `ds`'s batches (None: it yields examples), and whether that was ambiguous
    (the chain unreadable, every first dimension unknown)."""
    state, step = chain_state(ds)
    leaves = tf.nest.flatten(ds.element_spec)
    looks_batched = spec_looks_batched(ds.element_spec)
    if state != "batched" or not looks_batched:
        ambiguous = state == "unknown" and looks_batched and len(leaves) > 1
        return None, ambiguous and all(leaf.shape[0] is None for leaf in leaves)
    static = {leaf.shape[0] for leaf in leaves} - {None}
    drop_remainder: bool | None = True if static else None
    batch_size: int | None = static.pop() if static else None
    if batch_size is None:  # from the batching step (`chain_state` returns it when "batched")
        batch_size = _static_int(getattr(step, "_batch_size", None))
        drop = getattr(step, "_drop_remainder", None)
        drop_remainder = None if drop is None else bool(_static_int(drop))
    num_examples = None
    batches = cardinality(ds)
    # Counted only when nothing after the batch step drops or adds batches.
    if batch_size and batches is not None and batches >= 0 and cardinality(step) == batches:
        if drop_remainder:
            num_examples = batches * batch_size
        else:
            inputs = dataset_inputs(step)
            before = cardinality(inputs[0]) if inputs else None
            if before is not None and before >= 0 and -(-before // batch_size) == batches:
                num_examples = before
    return Batches(batch_size, drop_remainder, num_examples), False


# The plain attribute `tfgpu.data.pipeline` sets on the datasets it returns (as Keras sets
# `class_names`): the call's arguments on the training side, None on the validation side.
ATTRIBUTE = "pipeline_arguments"


def mark_pipeline(ds: tf.data.Dataset, arguments: dict[str, Any] | None) -> tf.data.Dataset:
    """Sets `ds.pipeline_arguments` (`data` and every keyword, or None); returns `ds`."""
    setattr(ds, ATTRIBUTE, arguments)
    return ds


def pipeline_arguments(ds: Any) -> dict[str, Any] | None:
    """The arguments of the `pipeline` call that returned this very `ds` (a copy), or None."""
    arguments = getattr(ds, ATTRIBUTE, None) if isinstance(ds, tf.data.Dataset) else None
    return dict(arguments) if isinstance(arguments, dict) else None


def _single_input_chain(ds: Any) -> Iterator[Any]:
    """`ds`, then its input, its input's input, ... while each step has exactly one input."""
    for _ in range(10_000):
        yield ds
        inputs = dataset_inputs(ds)
        if inputs is None or len(inputs) != 1:
            return
        ds = inputs[0]


def has_step(ds: Any, step: str) -> bool:
    """Whether a step whose class name (lowered, no "_") has `step` is in the single-input chain."""
    return any(step in type(d).__name__.lower().replace("_", "") for d in _single_input_chain(ds))


def reshuffles(ds: Any) -> bool:
    """Whether a step of `ds`'s input graph is a shuffle with `reshuffle_each_iteration=True`."""
    stack, seen = [ds], 0
    while stack and seen < 10_000:
        step = stack.pop()
        seen += 1
        if "shuffle" in type(step).__name__.lower() and bool(
            getattr(step, "_reshuffle_each_iteration", False)
        ):
            return True
        stack.extend(dataset_inputs(step) or [])  # none without the accessor: nothing more known
    return False


# A partial last batch is dropped (tune's static batch shape, diagnose's advice) only when it
# holds less than this share of an epoch's examples: dropping more changes the training.
DROP_REMAINDER_MAX_SHARE = 0.05

# Op types whose output may differ from one epoch to the next, or hide what they do.
_UNREPEATABLE_OPS = ("Random", "Rng", "PyFunc", "Shuffle")
# The dataset attributes that hold a traced function (map, filter, interleave, scan, ...).
_FUNCTIONS = ("_map_func", "_predicate", "_scan_func", "_reduce_func", "_key_func")


def unrepeatable(ds: Any) -> str:
    """Why an epoch of `ds` may differ from the one before, so caching it would change the
    training: a shuffle, a random op or a Python function in its input graph ("" if none)."""
    stack, seen = [ds], 0
    while stack and seen < 10_000:
        step = stack.pop()
        seen += 1
        name = type(step).__name__.strip("_")
        if "shuffle" in name.lower():
            return f"it shuffles ({name})"
        for attr in _FUNCTIONS:
            graph = getattr(getattr(getattr(step, attr, None), "function", None), "graph", None)
            if graph is None:
                continue
            ops = {op.type for op in graph.get_operations()}
            ops |= {n.op for f in graph.as_graph_def().library.function for n in f.node_def}
            found = sorted(o for o in ops if any(k in o for k in _UNREPEATABLE_OPS))
            if found:
                return f"its {name} runs {found[0]}"
        inputs = dataset_inputs(step)
        if inputs is None:
            return f"its {name} step cannot be read"
        stack.extend(inputs)
    return ""


def made_by_pipeline(ds: Any) -> bool:
    """Whether `ds` or a dataset in its single-input chain was built by `tfgpu.data.pipeline`."""
    return any(
        isinstance(d, tf.data.Dataset) and hasattr(d, ATTRIBUTE) for d in _single_input_chain(ds)
    )


# The settings of a user's own dataset that go at the end of its chain.
END_SETTINGS = ("cache", "prefetch", "private_threadpool_size")


def with_end_settings(ds: tf.data.Dataset, change: dict[str, Any]) -> tf.data.Dataset:
    """`ds` with the `END_SETTINGS` of `change` at its end: a cache (then a prefetch), a
    prefetch, a private thread pool; as `tfgpu tune` tries and `tfgpu tune SCRIPT.py`'s
    fresh processes apply them."""
    if change.get("cache"):
        ds = ds.cache()
    if change.get("prefetch") or change.get("cache"):
        ds = ds.prefetch(tf.data.AUTOTUNE)
    if "private_threadpool_size" in change:
        options = tf.data.Options()
        options.threading.private_threadpool_size = int(change["private_threadpool_size"])
        ds = ds.with_options(options)
    return ds
