"""Reading graphs without running them: the dataset's input pipeline (maps, cache,
prefetch, Python ops, batch shapes) and the ops of the traced train step."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.datasets import source_batches
from tfgpu.diagnosis._facts import OpFact


def batch_nbytes(batch) -> int | None:
    """Bytes of one batch's tensors (inputs, labels, weights), or None if unknown."""
    total = 0
    try:
        for t in tf.nest.flatten(batch, expand_composites=True):
            n = t.shape.num_elements()
            if n is None:
                return None
            total += int(n) * int(t.dtype.size)
    except AttributeError:  # an element that is not a tensor (None in the batch): unknown
        return None
    return total or None


def _has_gpu_kernel(node, registry: dict[str, list | None]) -> bool:
    """Whether a GPU (or device-agnostic) kernel is registered for `node`'s op and dtypes."""
    from tensorflow.python.framework import kernels

    if node.op not in registry:
        try:
            found = kernels.get_registered_kernels_for_op(node.op).kernel
        except tf.errors.OpError:  # the registry could not be read for it: unknown
            found = None
        registry[node.op] = (
            None if found is None else [k for k in found if k.device_type in ("GPU", "DEFAULT")]
        )
    candidates = registry[node.op]
    if candidates is None:
        return True  # unknown here: do not accuse it
    for kernel in candidates:
        if all(_fits(node.attr.get(c.name), c.allowed_values.list.type) for c in kernel.constraint):
            return True
    return False


def _fits(attr, allowed) -> bool:
    """Whether a node's type attribute is one a kernel constraint allows."""
    if attr is None or not allowed:
        return True
    which = attr.WhichOneof("value")
    if which == "type":
        return attr.type in allowed
    if which == "list":
        return all(t in allowed for t in attr.list.type)
    return True


def step_ops(model, batch) -> list[OpFact]:
    """Traces the model's train step on `batch` (no step runs) and lists the ops of its graph
    and its functions. Under several replicas the strategy places ops itself: the devices
    asked for are not kept there."""
    strategy = model.distribute_strategy
    keep_devices = int(strategy.num_replicas_in_sync) == 1

    def step(data):
        return strategy.run(model.train_step, args=(data,))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Gradients do not exist": not ours to say
        graph = tf.function(step).get_concrete_function(batch).graph.as_graph_def()
    registry: dict[str, list | None] = {}
    nodes = list(graph.node)
    for fn in graph.library.function:
        nodes += list(fn.node_def)
    return [
        OpFact(
            node.name, node.op, node.device if keep_devices else "", _has_gpu_kernel(node, registry)
        )
        for node in nodes
    ]


# Dataset ops that pass their input's elements on as they come (no per-element work, no
# buffer): a prefetch below one of them still hands batches over from its buffer.
_PASS_THROUGH_OPS = frozenset(
    {
        "OptionsDataset",
        "ModelDataset",
        "OptimizeDataset",
        "OptimizeDatasetV2",
        "MaxIntraOpParallelismDataset",
        "ExperimentalMaxIntraOpParallelismDataset",
        "PrivateThreadPoolDataset",
        "ExperimentalPrivateThreadPoolDataset",
        "ThreadPoolDataset",
        "ExperimentalThreadPoolDataset",
        "AssertCardinalityDataset",
        "AssertNextDataset",
        "ExperimentalAssertNextDataset",
        "AssertPrefetchDataset",
        "NonSerializableDataset",
        "ExperimentalNonSerializableDataset",
        "RepeatDataset",
        "TakeDataset",
    }
)

_PARALLEL_MAP_OPS = frozenset(
    {
        "ParallelMapDataset",
        "ParallelMapDatasetV2",
        "MapAndBatchDataset",
        "ExperimentalMapAndBatchDataset",
    }
)

_SEQUENTIAL_MAP_OPS = frozenset({"MapDataset"})

_CACHE_OPS = frozenset({"CacheDataset", "CacheDatasetV2"})

_BATCH_OPS = frozenset({"BatchDataset", "BatchDatasetV2", "PaddedBatchDatasetV2"})

_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless", "GeneratorDataset"})


@dataclass(frozen=True)
class PipelineFacts:
    """What the dataset's graph says about its input pipeline (see `read_pipeline`)."""

    python_input: bool = False  # py_function / generator somewhere in the pipeline
    prefetch: bool = True  # the last stage that does work is a prefetch
    parallel_map: bool = False  # some map runs with num_parallel_calls
    sequential_map: bool = False  # some map runs one element at a time
    cache: str | None = None  # "memory", "file" or None
    map_after_cache: bool = False  # per-example work after the cache (augmentation)
    private_threadpool_size: int | None = None  # tf.data.Options().threading


def read_pipeline(ds) -> PipelineFacts | None:
    """Reads the dataset's graph, from the output back along each stage's first input: Python
    ops, maps, cache, the final prefetch, thread pool. None when TF cannot serialize it."""
    try:
        serialized = tf.raw_ops.DatasetToGraphV2(
            input_dataset=ds._variant_tensor, external_state_policy=1
        )
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(serialized.numpy())
    except tf.errors.OpError:  # a dataset TF cannot serialize
        return None
    ops = [n.op for n in graph.node]
    for fn in graph.library.function:
        ops += [n.op for n in fn.node_def]
    by_name = {n.name: n for n in graph.node}

    def node_of(ref: str):
        return by_name.get(ref.split(":")[0].lstrip("^"))

    ret = next((n for n in graph.node if n.op == "_Retval"), None)
    chain: list[Any] = []  # stages (NodeDefs) from the output back to the source
    top = node_of(ret.input[0]) if ret is not None and ret.input else None
    while top is not None and len(chain) < 10_000:
        chain.append(top)
        top = node_of(top.input[0]) if top.input else None

    working = [n for n in chain if n.op not in _PASS_THROUGH_OPS]
    if ret is not None and ret.input:
        prefetch = bool(working) and "Prefetch" in working[0].op
    else:
        prefetch = "PrefetchDataset" in ops
    cache, map_after_cache, batched = None, False, False
    for node in chain:  # from the output back: maps seen before the cache come after it
        if node.op in _BATCH_OPS or node.op in ("MapAndBatchDataset",):
            batched = True
        if node.op in _CACHE_OPS:
            filename = node_of(node.input[1]) if len(node.input) > 1 else None
            values = list(filename.attr["value"].tensor.string_val) if filename else []
            cache = "file" if values and values[0] else "memory"
            break
        if batched and node.op in _PARALLEL_MAP_OPS | _SEQUENTIAL_MAP_OPS:
            map_after_cache = True  # per-example map between the cache and the batch
        if node.op == "MapAndBatchDataset":
            map_after_cache = True
    if cache is None:
        map_after_cache = False
    try:
        pool = ds.options().threading.private_threadpool_size
    except tf.errors.OpError:
        pool = None
    return PipelineFacts(
        python_input=any(o in _PYTHON_OPS for o in ops),
        prefetch=prefetch,
        parallel_map=any(n.op in _PARALLEL_MAP_OPS for n in chain),
        sequential_map=any(n.op in _SEQUENTIAL_MAP_OPS for n in chain),
        cache=cache,
        map_after_cache=map_after_cache,
        private_threadpool_size=pool,
    )


def shape_facts(ds) -> tuple[str | None, bool, int | None]:
    """(a batch component's shape that changes from batch to batch, as text, or None; whether
    the last batch is partial; the examples per epoch where the batch step's input says). A
    `None` batch dim alone changes nothing when batches are full."""
    try:
        batches, _ = source_batches(ds)
    except tf.errors.OpError:
        batches = None
    partial = bool(
        batches is not None
        and not batches.drop_remainder
        and (
            batches.num_examples is None
            or not batches.batch_size
            or batches.num_examples % batches.batch_size != 0
        )
    )
    dynamic = None
    for leaf in tf.nest.flatten(ds.element_spec):
        shape = getattr(leaf, "shape", None)
        if shape is None or not shape.rank:
            continue
        dims = shape.as_list()
        if any(d is None for d in dims[1:]) or (dims[0] is None and partial):
            dynamic = "(" + ", ".join("None" if d is None else str(d) for d in dims)
            dynamic += ",)" if shape.rank == 1 else ")"
            break
    examples = None if batches is None else batches.num_examples
    return dynamic, partial and dynamic is not None, examples
