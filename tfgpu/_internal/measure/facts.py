"""The one set of workload facts of the measuring core: what the model, its data and the
devices are (`gather`: no batch read, nothing trained) and what a first measurement says;
`diagnose` and `tune` extend the class (docs/architecture.md, "The measuring core")."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfgpu._internal.adapters import cpu, datasets, devices, model_state
from tfgpu._internal.adapters.all_reduce import AllReduce, describe, kind_of

if TYPE_CHECKING:
    from tfgpu._internal.measure.workload import Workload


@dataclasses.dataclass
class WorkloadFacts:
    """What is known about a compiled model, its data and the devices: pure data."""

    # The model.
    steps_per_execution: int = 1
    jit_compile: bool = False
    xla_supported: bool = True  # Keras accepts jit_compile flipped for this model
    policy: str = "float32"  # its dtype policy
    replicas: int = 1  # its strategy's replicas in sync
    # The class of a strategy made for several replicas that has one ("MirroredStrategy"): its
    # distribution is pure overhead; "" for any other.
    one_replica_strategy: str = ""
    all_reduce: AllReduce | None = None  # how its strategy sums gradients
    has_factory: bool = False  # a function that builds it again was given
    # The data.
    from_arrays: bool = False  # arrays, batched here as `fit` batches them
    batch_size: int | None = None  # examples per step, all replicas together
    static_shape: bool = False  # every batch dimension of the element spec is known
    dynamic_shape: str | None = None  # a batch component's shape that varies, e.g. "(None, 32)"
    partial_batches: bool = False  # the last batch of an epoch may be smaller
    # (examples in the partial last batch, examples per epoch); None: none, or cannot tell
    remainder: tuple[int, int] | None = None
    batches_per_epoch: int | None = None  # None: unknown or infinite
    epoch_examples: int | None = None  # examples per epoch, where the batch step's input says
    pipeline: dict[str, Any] | None = None  # the `tfgpu.data.pipeline` arguments, if it built it
    made_by_pipeline: bool = False  # the data (or what it reads) is a tfgpu pipeline
    service: bool = False  # it reads from tf.data service workers
    prefetch: bool = True  # the last stage that does work is a prefetch
    cache: str | None = None  # "memory", "file" or None
    python_input: bool = False  # py_function / generator in the pipeline
    parallel_map: bool = False  # some map runs with num_parallel_calls
    sequential_map: bool = False  # some map runs one element at a time
    map_after_cache: bool = False  # per-example work (augmentation) after the cache
    private_threadpool_size: int | None = None
    # The devices.
    on_gpu: bool = False
    gpu_name: str | None = None
    compute_capabilities: tuple[tuple[int, int], ...] = ()  # one per physical GPU
    memory_capacity_bytes: int | None = None  # /GPU:0's
    cpu_native_bf16: bool = False  # AMX or AVX-512 BF16: bfloat16 faster than float32
    cpu_count: int = 1
    # Measured: seconds per step as the model trains, and per batch of the pipeline alone
    # (None: not measured); the share of the usable cores the pipeline alone kept busy.
    step_time_s: float | None = None
    input_time_s: float | None = None
    pipeline_cpu_busy: float = math.nan
    cpu_cores: int = 0


def gather(work: Workload) -> dict[str, Any]:
    """The facts of a workload (a compiled model and its batches), as keyword arguments of
    `WorkloadFacts`."""
    model = work.model
    strategy = model.distribute_strategy
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    return {
        "steps_per_execution": max(1, int(model.steps_per_execution or 1)),
        "jit_compile": bool(model.jit_compile),
        "xla_supported": model_state.supports_xla(model),
        "policy": str(getattr(getattr(model, "dtype_policy", None), "name", "float32")),
        "replicas": replicas,
        "one_replica_strategy": type(strategy).__name__
        if kind_of(strategy) and replicas == 1
        else "",
        "all_reduce": describe(strategy),
        "has_factory": work.factory is not None,
        "from_arrays": work.from_arrays,
        **work.data.facts(),
        **device_facts(),
    }


def batch_facts(ds: tf.data.Dataset, batches: datasets.Batches | None = None) -> dict[str, Any]:
    """The batches' facts (size, shapes, a partial last batch, an epoch), from the input chain
    (`batches`: what is known of them already, for batches made here)."""
    if batches is None:
        try:
            batches, _ = datasets.source_batches(ds)
        except tf.errors.OpError:
            batches = None
    leaves = [leaf for leaf in tf.nest.flatten(ds.element_spec) if hasattr(leaf, "shape")]
    static = bool(leaves) and all(leaf.shape.rank and leaf.shape[0] is not None for leaf in leaves)
    n = datasets.cardinality(ds)
    size = None if batches is None else batches.batch_size
    examples = None if batches is None else batches.num_examples
    partial = bool(
        batches is not None
        and not batches.drop_remainder
        and (examples is None or not size or examples % size != 0)
    )
    remainder = None
    if batches is not None and not (batches.drop_remainder or static) and examples and size:
        remainder = (examples % size, examples) if examples % size else None
    dynamic = None
    for leaf in leaves:
        dims = leaf.shape.as_list() if leaf.shape.rank else []
        if dims and (any(d is None for d in dims[1:]) or (dims[0] is None and partial)):
            dynamic = str(tuple(dims))  # e.g. "(None, 32)"
            break
    return {
        "batch_size": size,
        "static_shape": static,
        "dynamic_shape": dynamic,
        "partial_batches": partial and dynamic is not None,
        "remainder": remainder,
        "batches_per_epoch": n if n is not None and n > 0 else None,
        "epoch_examples": examples,
    }


def batch_nbytes(batch: Any) -> int | None:
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


def device_facts() -> dict[str, Any]:
    """The devices' facts: the GPUs TensorFlow uses and the CPU; starts no runtime."""
    gpus = devices.tf_gpus() if tf.config.get_visible_devices("GPU") else []
    # One capability per physical GPU (a split GPU counts once).
    ccs = {g.cuda_index: tuple(g.compute_capability) for g in gpus if g.compute_capability}
    first = gpus[0] if gpus else None
    return {
        "on_gpu": bool(tf.config.list_logical_devices("GPU")),
        "gpu_name": None if first is None else first.name,
        "compute_capabilities": tuple(ccs.values()),
        "memory_capacity_bytes": None if first is None else first.memory_total_bytes,
        "cpu_native_bf16": cpu_native_bf16(),
        "cpu_count": os.cpu_count() or 1,
    }


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 faster than float32 (AMX, AVX-512 BF16)."""
    bf16, fp32 = cpu.peak_flops("bfloat16"), cpu.peak_flops("float32")
    return bf16 is not None and fp32 is not None and bf16 > fp32


# Dataset ops that pass their input's elements on as they come (no per-element work, no
# buffer): a prefetch below one of them still hands batches over from its buffer.
_PASS_THROUGH_OPS = frozenset({
    "OptionsDataset", "ModelDataset", "OptimizeDataset", "OptimizeDatasetV2",
    "MaxIntraOpParallelismDataset", "ExperimentalMaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "ExperimentalPrivateThreadPoolDataset", "ThreadPoolDataset",
    "ExperimentalThreadPoolDataset", "AssertCardinalityDataset", "AssertNextDataset",
    "ExperimentalAssertNextDataset", "AssertPrefetchDataset", "NonSerializableDataset",
    "ExperimentalNonSerializableDataset", "RepeatDataset", "TakeDataset",
})  # fmt: skip
_PARALLEL_MAP_OPS = frozenset({
    "ParallelMapDataset", "ParallelMapDatasetV2", "MapAndBatchDataset",
    "ExperimentalMapAndBatchDataset",
})  # fmt: skip
_SEQUENTIAL_MAP_OPS = frozenset({"MapDataset"})
_CACHE_OPS = frozenset({"CacheDataset", "CacheDatasetV2"})
_BATCH_OPS = frozenset({"BatchDataset", "BatchDatasetV2", "PaddedBatchDatasetV2"})
_PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless", "GeneratorDataset"})


def pipeline_facts(ds: tf.data.Dataset) -> dict[str, Any]:
    """What the dataset's graph says of its pipeline (from the output back along each stage's
    first input), and who built it; where TF cannot serialize the graph, the chain's steps."""
    out: dict[str, Any] = {
        "pipeline": datasets.pipeline_arguments(ds),
        "made_by_pipeline": datasets.made_by_pipeline(ds),
        "service": datasets.has_step(ds, "dataservice"),
    }
    try:
        serialized = tf.raw_ops.DatasetToGraphV2(
            input_dataset=ds._variant_tensor, external_state_policy=1
        )
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(serialized.numpy())
    except tf.errors.OpError:  # a dataset TF cannot serialize: its steps' names
        cache = "memory" if datasets.has_step(ds, "cache") else None
        return {**out, "prefetch": datasets.has_step(ds, "prefetch"), "cache": cache}
    ops = [n.op for n in graph.node]
    for fn in graph.library.function:
        ops += [n.op for n in fn.node_def]
    by_name = {n.name: n for n in graph.node}

    def node_of(ref: str) -> Any:
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
    cache, map_after_cache = _cache_facts(chain, node_of)
    try:
        pool = ds.options().threading.private_threadpool_size
    except tf.errors.OpError:
        pool = None
    return {
        **out,
        "python_input": any(o in _PYTHON_OPS for o in ops),
        "prefetch": prefetch,
        "parallel_map": any(n.op in _PARALLEL_MAP_OPS for n in chain),
        "sequential_map": any(n.op in _SEQUENTIAL_MAP_OPS for n in chain),
        "cache": cache,
        "map_after_cache": map_after_cache,
        "private_threadpool_size": pool,
    }


def _cache_facts(chain: list[Any], node_of: Any) -> tuple[str | None, bool]:
    """(the cache: "memory", "file" or None; whether a per-example map runs between it and
    the batch) from the stages, output first."""
    batched = map_after_cache = False
    for node in chain:  # from the output back: maps seen before the cache come after it
        if node.op in _BATCH_OPS or node.op == "MapAndBatchDataset":
            batched = True
        if node.op in _CACHE_OPS:
            filename = node_of(node.input[1]) if len(node.input) > 1 else None
            values = list(filename.attr["value"].tensor.string_val) if filename else []
            return ("file" if values and values[0] else "memory"), map_after_cache
        if node.op == "MapAndBatchDataset" or (
            batched and node.op in _PARALLEL_MAP_OPS | _SEQUENTIAL_MAP_OPS
        ):
            map_after_cache = True  # per-example map between the cache and the batch
    return None, False
