"""`pipeline()` and its phases, in order: `check_arguments`, `_batching`, `source.read`,
`_decode` (`map_fn`), `_gather_facts` and the pure `decide`, then `_assemble` (the steps)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from typing import Any

import psutil
import tensorflow as tf

from tfgpu._internal.adapters.cpu import usable_cores
from tfgpu._internal.adapters.datasets import cardinality, mark_pipeline
from tfgpu._internal.helpers.checks import is_int
from tfgpu._internal.helpers.warn import warn_at_user_code
from tfgpu.data._arguments import Arguments, check_arguments
from tfgpu.data._cache import cached
from tfgpu.data._functions import check_map_output, parallel_map, random_op_types
from tfgpu.data._limits import MIB
from tfgpu.data._plan import Facts, Plan, decide, drop_remainder_default, validation_plan
from tfgpu.data._service import check_dispatcher, distributed
from tfgpu.data._sources import Batching, Read
from tfgpu.data._split import check_split_counts


def pipeline(
    data: Any,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    strategy: tf.distribute.Strategy | None = None,
    map_fn: Callable | None = None,
    augment_fn: Callable | None = None,
    batch_map_fn: Callable | None = None,
    batch_augment_fn: Callable | None = None,
    validation_split: float | None = None,
    cache: bool | str | os.PathLike = "auto",
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    drop_remainder: bool | None = None,
    deterministic: bool | None = None,
    repeat: bool = False,
    distribute: bool = False,
    seed: int | None = None,
    ram_budget_mib: float | None = None,
    private_threadpool_size: int | None = None,
    split: str | None = None,
    data_dir: str | os.PathLike | None = None,
    compression_type: str | None = None,
    service: str | None = None,
    service_job_name: str | None = None,
) -> Any:
    """Builds an input pipeline that keeps the GPU fed, with the steps in the right order.

    read -> `map_fn` -> cache -> shuffle -> [repeat] -> `augment_fn` -> batch -> `batch_map_fn`
    -> `batch_augment_fn` -> prefetch: decoding runs once, augmentation every epoch. The guide:
    docs/data.md (the order, the "Options" table, each source, "Validation data").

    Args:
        data: arrays or tensors, or a tuple/dict of them (e.g. `(x, y)`); a `tf.data.Dataset`
            of examples or of batches; TFRecord file pattern(s); or a TFDS name ("mnist").
        batch_size: int, the global batch size (or `per_replica_batch_size`). Defaults to None.
        per_replica_batch_size: int, the batch size per replica. Defaults to None.
        strategy: `tf.distribute.Strategy`, the one the model trains under. Defaults to None.
        map_fn: callable, deterministic per-example decode, before the cache. Defaults to None.
        augment_fn: callable, per-example random augmentation, after the cache. Defaults to None.
        batch_map_fn: callable, deterministic vectorized work on each batch. Defaults to None.
        batch_augment_fn: callable, vectorized augmentation of each batch. Defaults to None.
        validation_split: float, the fraction held out: `(train, validation)`. Defaults to None.
        cache: `"auto"`, True/`"memory"`, a file path prefix, or False. Defaults to `"auto"`.
        shuffle: bool, shuffle the examples (and the files' order). Defaults to True.
        shuffle_buffer: int, the shuffle buffer in examples. Defaults to None: sized here.
        drop_remainder: bool, drop the last partial batch. Defaults to None: when shuffling
            on several replicas (said in a warning with the examples dropped).
        deterministic: bool, a fixed order through parallel steps. Defaults to None.
        repeat: bool, repeat indefinitely, after the shuffle (custom loops). Defaults to False.
        distribute: bool, return `strategy.experimental_distribute_dataset(...)`. Defaults to False.
        seed: int, the seed of the file and example shuffles. Defaults to None.
        ram_budget_mib: float, RAM tf.data may use. Defaults to None: half of what is free.
        private_threadpool_size: int, a thread pool of its own (0: TensorFlow's). Defaults to None.
        split: str, the TFDS split (TFDS names only). Defaults to None (`"train"`).
        data_dir: path, the TFDS data directory (TFDS names only). Defaults to None.
        compression_type: str, `"GZIP"` or `"ZLIB"` for TFRecord files. Defaults to None.
        service: str, a tf.data service dispatcher's `"host:port"`. Defaults to None.
        service_job_name: str, the service job this run's trainers share. Defaults to None.

    Returns:
        A `tf.data.Dataset` of batches (distributed with `distribute=True`), or `(train,
        validation)`; the training one carries `pipeline_arguments`, this call's arguments.

    Raises:
        TypeError: an argument of the wrong type, or a function that cannot take its elements.
        ValueError: a value out of range, conflicting arguments, or a source that cannot work.
        ConnectionError: with `service`, no dispatcher answering at that address.
        FileNotFoundError: a file pattern that matches nothing, or a TFDS dataset not prepared.

    Example:

    ```python
    train = tfgpu.data.pipeline(
        (jpegs, labels), per_replica_batch_size=64, strategy=tfgpu.strategy(),
        map_fn=decode, augment_fn=augment)
    model.fit(train, epochs=10)
    ```
    """
    given = dict(locals())  # `data` and every keyword: checked, then carried by the result
    args = check_arguments(given)
    if args.service is not None:
        check_dispatcher(args.service)  # in seconds, naming the address, instead of a hang
    batching = _batching(args)
    read = _decode(args, args.source.read(args, batching))
    facts = _gather_facts(args, batching, read)
    plan = decide(
        facts,
        batch_size=batching.batch_size,
        per_replica_batch_size=args.per_replica_batch_size,
        cache=args.cache,
        shuffle=args.shuffle,
        shuffle_buffer=args.shuffle_buffer,
        drop_remainder=args.drop_remainder,
        deterministic=args.deterministic,
        seed=args.seed,
        has_strategy=args.strategy is not None,
        private_threadpool_size=args.private_threadpool_size,
        repeat=args.repeat,
    )
    for text in plan.warnings:
        warn_at_user_code(f"tfgpu.data.pipeline: {text}.")
    train, validation = _assemble(args, batching, read, facts, plan)
    sides = [mark_pipeline(train, given)]
    if validation is not None:
        sides.append(mark_pipeline(validation, None))
    if args.distribute:  # `strategy` is set: checked with distribute=True
        sides = [args.strategy.experimental_distribute_dataset(ds) for ds in sides]
    return sides[0] if validation is None else tuple(sides)


def _batching(args: Arguments) -> Batching:
    """The global batch, whether a batched source keeps its batches, the split's counts if known."""
    strategy, requested = args.strategy, args.batch_size
    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    if args.per_replica_batch_size is not None:
        requested = args.per_replica_batch_size * num_replicas
    batched, keep, batch_size = args.source.batching(args, requested, num_replicas)
    if batched is None and requested is None:
        raise ValueError(
            "Invalid arguments `batch_size` and `per_replica_batch_size`. Received: "
            "batch_size=None, per_replica_batch_size=None. Expected exactly one of them: the "
            "global batch size, or the batch size per replica (both may be None only for a "
            "dataset that is already batched, whose batches are then kept)."
        )
    drop = drop_remainder_default(args.drop_remainder, num_replicas, args.shuffle)
    global_batch = requested if requested is not None else batch_size
    split_counts = None
    if args.validation_split is not None:
        total = args.source.count(batched, args.validation_split)
        if total is not None:
            split_counts = check_split_counts(total, args, global_batch, drop)
    return Batching(num_replicas, batched, keep, batch_size, global_batch, drop, split_counts)


def _decode(args: Arguments, read: Read) -> Read:
    """`map_fn` on both sides (the validation side in order), after checking its arity."""
    ds, val_ds, map_fn = read.ds, read.val_ds, args.map_fn
    if map_fn is None:
        return read
    spec_in = ds.element_spec
    ds = parallel_map(ds, "map_fn", map_fn, args.deterministic)
    random_ops = random_op_types(map_fn, spec_in)
    ragged = check_map_output(map_fn, spec_in, ds.element_spec)
    if val_ds is not None:
        val_ds = parallel_map(val_ds, "map_fn", map_fn, True)
    return dataclasses.replace(read, ds=ds, val_ds=val_ds, random_ops=random_ops, ragged=ragged)


def _gather_facts(args: Arguments, batching: Batching, read: Read) -> Facts:
    """What the plan is made from: the decoded examples, the machine, the strategy."""
    return Facts(
        kind=args.source.kind,
        num_examples=cardinality(read.ds) if read.num_examples is None else read.num_examples,
        element_bytes=_bytes_per_example(read.ds.element_spec),
        num_files=read.num_files,
        has_map_fn=args.map_fn is not None,
        map_fn_random_ops=read.random_ops,
        replicas=batching.num_replicas,
        workers=_worker_count(args.strategy),
        on_gpu=bool(tf.config.list_physical_devices("GPU")),
        cpu_count=usable_cores(),
        ram_budget_bytes=_ram_budget(args.ram_budget_mib),
        free_disk_bytes=shutil.disk_usage(args.cache_dir).free if args.cache_dir else None,
        batched=batching.keep_batches,
        split_by_position=read.split_counts is not None,
        service=args.service is not None,
        reshuffled=read.reshuffled,
    )


def _bytes_per_example(spec: Any) -> int | None:
    """Bytes of one element of `spec`; None when a size is not static."""
    specs = tf.nest.flatten(spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in specs):
        return None
    if any(s.dtype in (tf.string, tf.variant, tf.resource) for s in specs):
        return None
    return sum(s.shape.num_elements() * s.dtype.size for s in specs)


def _ram_budget(ram_budget_mib: float | None) -> int:
    """In bytes: `ram_budget_mib`, else half of the available host memory."""
    if ram_budget_mib is not None:
        return int(ram_budget_mib * MIB)
    return int(psutil.virtual_memory().available * 0.5)


def _worker_count(strategy: Any) -> int:
    """The workers `strategy` trains on (1 when it cannot tell)."""
    if strategy is None:
        return 1
    n = getattr(strategy.extended, "worker_count", None)
    if n is not None and is_int(n) and n > 0:
        return int(n)
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    try:
        spec = resolver.cluster_spec()
        return max(1, sum(spec.num_tasks(job) for job in ("worker", "chief") if job in spec.jobs))
    # TF_CONFIG that is not JSON or not a cluster (ValueError, KeyError, TypeError), a
    # resolver that cannot ask the scheduler (OSError, RuntimeError): one worker.
    except (KeyError, OSError, RuntimeError, TypeError, ValueError):
        return 1


def _assemble(
    args: Arguments, batching: Batching, read: Read, facts: Facts, plan: Plan
) -> tuple[tf.data.Dataset, tf.data.Dataset | None]:
    """The training side's steps from the cache on, and the validation side's (in one order)."""

    def batched(ds: tf.data.Dataset, side: Plan, *, training: bool, batch: bool) -> Any:
        """batch (ragged again after a `map_fn` that got a ragged feature's rows) ->
        `batch_map_fn` -> on the training side, `batch_augment_fn` and the service -> prefetch."""
        if batch:
            # A plain batch, on purpose: it fuses with `map(augment_fn)` into MapAndBatchDataset
            # (a parallel one would not: 12-18% slower; docs/data.md, "Why a plain `batch`").
            batch_step = ds.ragged_batch if read.ragged else ds.batch
            ds = batch_step(side.global_batch_size, drop_remainder=side.drop_remainder)
        for name in ("batch_map_fn", "batch_augment_fn") if training else ("batch_map_fn",):
            fn = getattr(args, name)
            if fn is not None:
                ds = parallel_map(ds, name, fn, side.deterministic)
        if training and args.service is not None:
            # All so far runs on the service's workers, with options for their machine (their
            # own memory, TF's shared pool); the trainer reads whole batches and prefetches them.
            ds = ds.with_options(_options(side, 0, keep_shard=True))
            ds = distributed(ds, args.service, args.service_job_name, repeat=args.repeat)
        ds = ds.prefetch(tf.data.AUTOTUNE)
        return ds.with_options(_options(side, facts.ram_budget_bytes, keep_shard=side.keep_shard))

    ds = cached(read.ds, plan.cache)
    if plan.shuffle_buffer:
        ds = ds.shuffle(plan.shuffle_buffer, seed=plan.shuffle_seed, reshuffle_each_iteration=True)
    if args.repeat:
        ds = ds.repeat()
    if args.augment_fn is not None:
        ds = parallel_map(ds, "augment_fn", args.augment_fn, plan.deterministic)
    ds = batched(ds, plan, training=True, batch=not batching.keep_batches)
    val_ds = read.val_ds
    if val_ds is not None:
        val_plan = validation_plan(
            plan,
            facts,
            cache=args.cache,
            drop_remainder=args.drop_remainder,
            num_examples=read.split_counts[1] if read.split_counts is not None else None,
            element_bytes=_bytes_per_example(val_ds.element_spec),
        )
        val_ds = batched(cached(val_ds, val_plan.cache), val_plan, training=False, batch=True)
    return ds, val_ds


def _options(plan: Plan, ram_budget_bytes: int, *, keep_shard: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.autotune.enabled = True
    if ram_budget_bytes:  # 0: tf.data's own budget (a service worker's memory)
        options.autotune.ram_budget = int(ram_budget_bytes)
    options.deterministic = plan.deterministic
    for name in ("map_parallelization", "map_fusion", "filter_fusion", "parallel_batch"):
        setattr(options.experimental_optimization, name, True)
    if plan.private_threadpool_size:
        options.threading.private_threadpool_size = plan.private_threadpool_size
    if not keep_shard:
        options.experimental_distribute.auto_shard_policy = getattr(
            tf.data.experimental.AutoShardPolicy, plan.shard_policy
        )
    return options
