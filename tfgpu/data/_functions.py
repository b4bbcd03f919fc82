"""`map_fn`, `augment_fn`, `batch_map_fn`, `batch_augment_fn`: checked, mapped, random ops."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from tfgpu._internal.helpers.checks import invalid_type, invalid_value
from tfgpu._internal.helpers.warn import warn_at_user_code
from tfgpu._internal.measure.workload import flatten_with_paths

# What tf.data calls each function on (the others: a batch), as the arity error says it.
_CALLED_ON = {"map_fn": "an example", "augment_fn": "an example after `map_fn`"}


def _call_text(name: str, spec: Any) -> tuple[int, str]:
    """How tf.data calls a function on elements of `spec`: (positional arguments, a picture)."""
    if type(spec) is tuple:  # tf.data unpacks plain tuples only (not namedtuples, not dicts)
        names = ", ".join(f"c{i}" for i in range(len(spec)))
        return len(spec), f"{name}({names}), one argument per component of the tuple"
    what = "dict" if isinstance(spec, Mapping) else "element"
    return 1, f"{name}({what}), with the whole {what} as one argument"


def _check_arity(name: str, fn: Callable, spec: Any, what: str) -> None:
    """Raises TypeError when `fn` cannot take the arguments tf.data will call it with (a
    signature Python cannot read, of some builtins, is let through)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    count, call = _call_text(name, spec)
    try:
        signature.bind(*range(count))
    except TypeError as e:
        raise invalid_type(
            name,
            fn,
            f"a function of {count} argument(s)"
            + (" (e.g. `lambda x, y: ...`)" if count == 2 else ""),
            received=f"{name}={_label(fn)}{signature}, which cannot be called with {count} "
            f"positional argument(s) ({e}). tf.data calls it on {what} as {call}; the element "
            f"is {spec}",
        ) from None


def parallel_map(ds: tf.data.Dataset, name: str, fn: Callable, deterministic: bool | None) -> Any:
    """`ds.map(fn)` in parallel, `fn`'s arity checked; an error while tracing `fn` names the
    argument `name`, as does the TypeError for a `fn` that returns nothing."""
    _check_arity(name, fn, ds.element_spec, _CALLED_ON.get(name, "a batch"))
    what = "batch" if name.startswith("batch_") else "example"
    empty: list[Any] = []  # what `fn` returned when it returned nothing

    def checked(*args: Any) -> Any:
        out = fn(*args)
        if out is None or not tf.nest.flatten(out):
            empty.append(out)
            return tf.constant(0)  # a placeholder so tracing ends; refused below
        return out

    try:
        mapped = ds.map(checked, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    except Exception as e:  # the user's code raises anything: re-raised, with a note added
        e.add_note(f"tfgpu.data.pipeline: raised while tracing `{name}` on {ds.element_spec}.")
        raise
    if empty:
        raise invalid_type(
            name,
            fn,
            f"a function that returns the new {what} (e.g. `return x, y`): is a `return` missing?",
            received=f"{name}={_label(fn)}, which returned {empty[0]!r} on the {what} "
            f"{ds.element_spec}",
        )
    return mapped


def _label(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _traced(fn: Callable, args: tuple, **options: Any) -> Any:
    """`fn`'s concrete function on `args`, or None where it cannot be traced alone (a probe:
    tf.data reports the real error when it traces `fn` on the dataset)."""
    try:
        return tf.function(lambda *a: fn(*a), **options).get_concrete_function(*args)
    except Exception:  # the user's code may raise anything, and this is a probe only
        return None


def _on_a_batch(fn: Callable, spec: Any) -> dict[str, Any] | None:
    """What `fn` returns traced on a batch of 3 examples, {path: spec}; None when it fails
    there (written for one example). A function for batches keeps the 3 (or unknown)."""
    args = tf.nest.map_structure(
        lambda s: tf.TensorSpec([3, *s.shape], s.dtype) if isinstance(s, tf.TensorSpec) else s, spec
    )
    args = args if type(args) is tuple else (args,)
    traced = _traced(fn, args, autograph=False)
    if traced is None:
        return None
    outputs = traced.structured_outputs
    specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t, outputs
    )
    return dict(flatten_with_paths("element", specs))


def _batch_of_one(a: Any, b: Any) -> bool:
    """Whether a function turned the scalar spec `a` into `b`, shaped like a batch of one."""
    if not isinstance(a, tf.TensorSpec) or not isinstance(b, tf.TensorSpec) or a.shape.rank != 0:
        return False
    return b.shape.rank is not None and b.shape.rank >= 2 and b.shape[0] in (1, None)


def _unknown_size(spec: Any) -> bool:
    return isinstance(spec, tf.TensorSpec) and not spec.shape.is_fully_defined()


def check_map_output(map_fn: Callable, spec_in: Any, spec_out: Any) -> bool:
    """Raises for a map_fn that returns batches of one; warns for shapes a batch cannot stack.
    Returns whether to batch ragged again (`map_fn` got a ragged feature's rows as dense)."""
    leaves_in = tf.nest.flatten(spec_in)
    out = flatten_with_paths("element", spec_out)
    pairs: list[tuple[Any, str, Any]] = []
    try:
        tf.nest.assert_same_structure(spec_in, spec_out, check_types=False)
        pairs = [(a, p, b) for a, (p, b) in zip(leaves_in, out, strict=True)]
    except (TypeError, ValueError):
        if len(leaves_in) == 1:
            pairs = [(leaves_in[0], p, b) for p, b in out]
    suspects = [(p, a, b) for a, p, b in pairs if _batch_of_one(a, b)]
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
        raise invalid_value(
            "map_fn",
            map_fn,
            "a per-example function; pass a function written for batches (such as "
            "`TextVectorization` after `tf.expand_dims(text, -1)`) as `batch_map_fn=` "
            "instead, which runs on whole batches after batching",
            received=f"map_fn={_label(map_fn)}, which turns one example's {path} of shape "
            f"{tuple(a.shape.as_list())} into shape {shape}: a batch of one, not one example, "
            f"so batches would be (batch, {', '.join(str(d) for d in shape)}). `map_fn` runs "
            "on one example at a time",
        )
    ragged = {p for a, p, b in pairs if isinstance(a, tf.RaggedTensorSpec) and _unknown_size(b)}
    variable = [
        f"{p} {tuple(b.shape.as_list()) if b.shape.rank is not None else '(unknown rank)'}"
        for p, b in out
        if _unknown_size(b) and p not in ragged
    ]
    if variable:
        warn_at_user_code(
            f"tfgpu.data.pipeline: `map_fn` ({_label(map_fn)}) returns examples of unknown size "
            f"at {', '.join(variable)}; a batch fails at run time when examples differ in "
            "size. Give them a fixed size in map_fn (`TextVectorization(..., "
            "output_sequence_length=N)`, `tf.image.resize`), return a `tf.RaggedTensor`, or "
            "vectorize whole batches with `batch_map_fn=`."
        )
    return bool(ragged)


def random_op_types(fn: Callable, spec: Any) -> tuple[str, ...]:
    """Op types with "Random" in their name that `fn` would run on one example (traced only)."""
    args = spec if isinstance(spec, tuple) else (spec,)
    traced = _traced(fn, args)
    if traced is None:
        return ()
    graph_def = traced.graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return tuple(sorted({n.op for n in nodes if "Random" in n.op}))
