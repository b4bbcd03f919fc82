"""`pipeline()`: check the arguments, read the source, decode, decide, then assemble the steps.

The phases, in the order `pipeline()` runs them:

1. `check_arguments` (`_arguments.py`): every argument, before any work.
2. `_batching`: keep a batched source's batches or rebatch it; the validation split's counts
   where they are known before reading.
3. `read` (`_read.py`): the source as a dataset of examples, validation split off.
4. `_decode`: `map_fn` on both sides, with its checks.
5. `_gather_facts` then `decide` (`_plan.py`, pure): the plan.
6. `_assemble`: cache -> shuffle -> [repeat] -> augment_fn -> batch -> batch_map_fn ->
   batch_augment_fn -> prefetch -> options, and the validation side without the random steps.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import warnings
from collections.abc import Callable
from typing import Any, TypeAlias, overload

import tensorflow as tf

from tfgpu._internal.adapters.cpu import usable_cores
from tfgpu._internal.adapters.data_service import Address
from tfgpu._internal.adapters.datasets import Batches, cardinality, mark_pipeline, source_batches
from tfgpu.data._arguments import Arguments, check_arguments
from tfgpu.data._cache import cached
from tfgpu.data._facts import bytes_per_example, ram_budget, worker_count
from tfgpu.data._functions import check_arity, check_map_output, parallel_map, random_op_types
from tfgpu.data._plan import Facts, Plan, decide, validation_plan
from tfgpu.data._read import Read, read
from tfgpu.data._service import check_reachable, choose_job, distributed, memory_source
from tfgpu.data._sources import batched_source_plan
from tfgpu.data._split import check_split_counts, refuse_dataset_split

# What `pipeline()` returns for each side: a dataset of batches, or its distributed form.
_Pipeline: TypeAlias = tf.data.Dataset | tf.distribute.DistributedDataset


@overload
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
    validation_split: None = None,
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
) -> _Pipeline: ...


@overload
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
    validation_split: float = ...,
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
) -> tuple[_Pipeline, _Pipeline]: ...


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

    Order: read (files interleaved in parallel and shuffled by file) -> `map_fn` (parallel,
    AUTOTUNE) -> cache -> shuffle (reshuffled each epoch) -> [repeat] -> `augment_fn`
    (parallel) -> batch -> `batch_map_fn` -> `batch_augment_fn` -> prefetch (AUTOTUNE).
    Caching sits after the deterministic work and before the random work, so decoding runs
    once and augmentation is new every epoch.

    With `validation_split`, the validation examples are split off before any shuffle and go
    through the same `map_fn`, cache, batch and `batch_map_fn`, but no augmentation, shuffle
    or repeat, always in the same order: `train, val = pipeline(..., validation_split=0.1)`,
    then `model.fit(train, validation_data=val)`. The validation side keeps its last partial
    batch (even under a strategy) unless `drop_remainder=True` is passed, and with
    `cache="auto"` it is cached in memory when it fits, so later passes do not read the source.

    `tf.data.Options` are set deliberately: autotune on with `ram_budget_mib`, map
    parallelization, map and filter fusion, parallel batch, a private thread pool on GPU hosts,
    and the auto-shard policy for the source (DATA for in-memory data, FILE for files when
    there is at least one file per worker, AUTO for a dataset passed in, DATA for a dataset
    passed in with `validation_split`, whose split counts the whole dataset).

    For Keras `fit`, leave `repeat=False`: the dataset is finite, `fit` iterates it once per
    epoch (reshuffled each time) and needs no `steps_per_epoch`; Keras distributes it over the
    strategy itself. For a custom training loop, pass `distribute=True` to get
    `strategy.experimental_distribute_dataset(...)`.

    Args:
        data: the data. A NumPy array or tf.Tensor, or a tuple/dict of them (e.g. `(x, y)`)
            whose first dimensions are equal (ragged and string data too); a
            `tf.data.Dataset` of examples, or of batches (a Keras loader's,
            `.batch(n).prefetch(...)`: kept when no other batch size is asked for, else
            unbatched and batched again, never batched twice); a TFRecord file pattern or list
            of patterns (parse records with `map_fn`); or a TensorFlow Datasets name such as
            `"mnist"` (read with `load_tfds`, supervised `(input, label)` pairs when the
            dataset defines them).
        batch_size: int, the global batch size (all replicas together), as Keras `fit` uses
            it. Give exactly one of `batch_size` and `per_replica_batch_size`, or neither for
            a dataset that is already batched (its batches are kept). Defaults to None.
        per_replica_batch_size: int, the batch size per replica; the global batch is this times
            `strategy.num_replicas_in_sync` (1 without a strategy). Defaults to None.
        strategy: `tf.distribute.Strategy` the model trains under, or None. Sets the replica
            count, the sharding, and `drop_remainder=True` by default. Defaults to None.
        map_fn: callable, per-example decode/preprocess (parse a record, decode an image,
            resize, normalize). Must be deterministic: it runs before the cache. It is called
            as `map_fn(*example)` when an example is a tuple (`map_fn(x, y)` for `(x, y)`
            arrays or supervised TFDS pairs), and as `map_fn(example)` when it is a dict
            (TFDS feature dicts) or a single tensor (an array, a serialized TFRecord); it
            returns the new example. Defaults to None.
        augment_fn: callable, per-example random augmentation; runs after the cache and the
            shuffle, so it differs every epoch. Called like `map_fn`, on what `map_fn`
            returned: `augment_fn(*example)` for a tuple, `augment_fn(example)` for a dict or
            a single tensor. Defaults to None.
        batch_map_fn: callable, deterministic vectorized preprocessing of a whole batch,
            right after batching (e.g. a `TextVectorization` layer on a batch of strings: a
            function written for batches belongs here, not in `map_fn`). Called like
            `batch_augment_fn`, before it; applied to the validation batches too. Defaults to
            None.
        batch_augment_fn: callable, vectorized augmentation of a whole batch, after batching.
            Called like `map_fn`, on a batch: `batch_augment_fn(*batch)` when examples are
            tuples (`batch_augment_fn(x_batch, y_batch)`), `batch_augment_fn(batch)` when they
            are dicts or single tensors. Defaults to None.
        validation_split: float in (0, 1), the fraction of the examples held out for
            validation; `pipeline` then returns `(train, validation)`. Arrays: the last
            fraction, as Keras `fit(validation_split=)` takes it (`floor(n * (1 - split))`
            examples train). A dataset passed in: its last fraction, when its size is known
            and its order is the same every pass (the training pipeline is then
            deterministic too, and both sides are sharded by example across workers; for a
            Keras loader use its own `validation_split=...,
            subset="both"`: with `shuffle=False` it lists files class by class, so the last
            fraction would be the last class). TFRecord files: the records whose
            hash falls in the fraction (about that share, the same in every epoch, file order
            and worker). A TFDS name: the split sliced by counts (`split` must not be sliced
            already). Defaults to None: no split, one dataset is returned.
        cache: `"auto"`, True/`"memory"`, a file path, or False. `"auto"` caches the output of
            `map_fn` (or of reading files/TFDS) in memory when its estimated size fits the RAM
            budget, the source is finite and `map_fn` has no random ops. True/`"memory"`
            always caches in memory and raises if the estimate exceeds the budget; a path
            caches to files at that prefix (checked against free disk space); a cache is only
            complete after one full pass. Defaults to `"auto"`.
        shuffle: bool, whether to shuffle (examples and, for files, file order). Defaults to
            True.
        shuffle_buffer: int, shuffle buffer size in examples. Defaults to None: the whole
            dataset up to 10,000 examples, and at most 10% of the RAM budget.
        drop_remainder: bool, drop the last partial batch so every batch has a static shape
            (needed by XLA/`jit_compile` and for even splits over replicas). Defaults to None:
            True under a strategy, else False; the validation side of `validation_split`
            drops it only when True is passed (Keras evaluates partial batches under a
            strategy, and no validation example is left out).
        deterministic: bool, keep element order fixed through parallel maps and interleaves
            (reproducible, possibly slower). Defaults to None: True when `shuffle=False`
            (the order is the data's), when a `seed` is given (a reproducible run, needed for
            exact resume with `tfgpu.callbacks.BackupAndRestore`), or when several workers
            shard in-memory data by example (they must agree on the order); else False, the
            fastest.
        repeat: bool, repeat indefinitely (after the shuffle, so each pass is reshuffled and
            batches run across epoch boundaries). For custom loops; not needed for `fit`.
            Defaults to False.
        distribute: bool, return `strategy.experimental_distribute_dataset(dataset)` for a
            custom training loop. Needs `strategy`. Defaults to False.
        seed: int, seed for the file and example shuffles. Defaults to None (a fixed seed is
            used when several workers shard in-memory data, so they agree).
        ram_budget_mib: float, RAM tf.data may use: autotune's buffer budget, the limit for
            the cache, and 10% of it for the shuffle buffer. Defaults to None: half of the
            available host memory.
        private_threadpool_size: int, size of a thread pool used only by this pipeline; 0
            shares TensorFlow's pool. Defaults to None: the CPU count on hosts with a GPU
            visible to TensorFlow, else 0.
        split: str, TFDS split (TFDS sources only), e.g. `"train"` or `"train[:90%]"`.
            Defaults to None (`"train"`).
        data_dir: path, TFDS data directory (TFDS sources only). Defaults to None (TFDS's
            default, `~/tensorflow_datasets` or `$TFDS_DATA_DIR`).
        compression_type: str, `"GZIP"` or `"ZLIB"` for compressed TFRecord files (file
            sources only). Defaults to None.
        service: str, the address of a tf.data service dispatcher, `"grpc://host:port"` or
            `"host:port"` (start one with `tfgpu data-service dispatcher`, workers with
            `tfgpu data-service worker`): the training side's work up to the batches (read,
            `map_fn`, shuffle, `augment_fn`, batch, `batch_map_fn`, `batch_augment_fn`) then
            runs on the service's workers, with dynamic sharding (every example at most once
            per epoch: exactly once unless a worker fails mid-epoch), and this process reads
            whole batches, splits them per replica and prefetches them. The order is not
            reproducible, nothing is cached (each epoch gives every worker other examples),
            each worker keeps its own partial last batch, and the validation side stays on
            this host. The dispatcher must accept a connection within 3 s. See
            docs/data_service.md. Defaults to None: everything runs on this host.
        service_job_name: str, the service job this run's trainers share (letters, digits,
            `.`, `_`, `-`). Needed for several trainers outside Slurm (the same name on every
            trainer, a new one every run, e.g. the launcher's run id). Defaults to None: a
            fresh name for a lone process, the Slurm job and step ids under Slurm.

    Returns:
        A `tf.data.Dataset` of batches, or a `tf.distribute.DistributedDataset` when
        `distribute=True`. With `validation_split`, a tuple `(train, validation)` of two of
        them (both distributed with `distribute=True`); the validation one is finite even
        with `repeat=True`.

    Raises:
        TypeError: for an argument of the wrong type (a float batch size, a str seed, a
            strategy class instead of an instance), a source of unsupported type, a
            non-callable function argument, or a function that cannot take the arguments
            tf.data calls it with (the message shows its signature and the element), a
            function that returns nothing (None: a missing `return`), or a
            `validation_split` that is not a number.
        ValueError: for a value out of range (a batch size < 1, a NaN or infinite RAM budget,
            a negative seed), mismatched array lengths (naming each), an empty source, fewer
            examples than one global batch with `drop_remainder=True`, an unknown dataset
            name, conflicting arguments, a cache path under a file or in a missing directory,
            files whose compression contradicts `compression_type`, or a cache that would not
            fit the RAM budget; a `validation_split` of 0, 1, NaN or out of range, one that
            leaves a side with no example (or no full batch with `drop_remainder=True`), or
            one for a dataset of unknown size or reshuffled every pass, or with a sliced TFDS
            `split`; a `map_fn` that returns a batch of one (a function written for batches:
            pass it as `batch_map_fn`). All raised before any data is read.
        ConnectionError: with `service`, for a dispatcher that does not accept a connection
            within 3 s (the message names the address).
        FileNotFoundError: for a file pattern that matches no files, or a TFDS dataset that is
            not prepared in `data_dir`.

    Example:

    ```python
    def decode(jpeg, label):
        image = tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (160, 160))
        return image, label

    def augment(image, label):
        image = tf.image.random_crop(image, (128, 128, 3))
        return tf.image.random_flip_left_right(image), label

    strategy = tfgpu.strategy()
    train = tfgpu.data.pipeline(
        (jpegs, labels), per_replica_batch_size=64, strategy=strategy,
        map_fn=decode, augment_fn=augment)
    model.fit(train, epochs=10)
    ```
    """
    # The call's arguments: checked here, and recorded with the result so that `tune` can
    # build the pipeline again with other settings.
    arguments: dict[str, Any] = dict(
        data=data,
        batch_size=batch_size,
        per_replica_batch_size=per_replica_batch_size,
        strategy=strategy,
        map_fn=map_fn,
        augment_fn=augment_fn,
        batch_map_fn=batch_map_fn,
        batch_augment_fn=batch_augment_fn,
        validation_split=validation_split,
        cache=cache,
        shuffle=shuffle,
        shuffle_buffer=shuffle_buffer,
        drop_remainder=drop_remainder,
        deterministic=deterministic,
        repeat=repeat,
        distribute=distribute,
        seed=seed,
        ram_budget_mib=ram_budget_mib,
        private_threadpool_size=private_threadpool_size,
        split=split,
        data_dir=data_dir,
        compression_type=compression_type,
        service=service,
        service_job_name=service_job_name,
    )
    args = check_arguments(**arguments)
    if args.service is not None:
        check_reachable(args.service)  # seconds, naming the address, instead of a hang
    batching = _batching(args)
    source = read(
        args,
        batched_source=batching.batched_source,
        keep_batches=batching.keep_batches,
        split_counts=batching.split_counts,
        global_batch=batching.global_batch,
        drop=batching.drop,
    )
    if args.service is not None and args.src.kind == "memory":
        # Chunks the dispatcher hands out one at a time, not one split per example.
        n_train = source.split_counts[0] if source.split_counts else args.src.num_examples
        source = dataclasses.replace(source, ds=memory_source(args.src.value, n_train or 0))
    decoded = _decode(args, source)
    facts = _gather_facts(args, batching, source, decoded)
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
    for note in plan.notes:
        if note.startswith("cache after") or note.startswith("not cached: map_fn"):
            warnings.warn(f"tfgpu.data.pipeline: {note}.", stacklevel=2)
    train, validation = _assemble(args, batching, source, decoded, facts, plan)
    mark_pipeline(train, arguments=arguments)
    if args.distribute:
        strategy = args.strategy  # not None: checked with distribute=True
        train_out = strategy.experimental_distribute_dataset(train)  # type: ignore[union-attr]
        if validation is None:
            return train_out
        return train_out, strategy.experimental_distribute_dataset(validation)  # type: ignore[union-attr]
    return train if validation is None else (train, validation)


@dataclasses.dataclass(frozen=True)
class _Service:
    """Where the service part of the training side goes, and the job it joins."""

    address: Address
    job_name: str
    consumer_index: int | None
    num_consumers: int | None


@dataclasses.dataclass(frozen=True)
class _Batching:
    """How the source is batched, and the validation split's counts known before reading."""

    num_replicas: int
    batched_source: Batches | None  # what is known of a dataset passed in already batched
    keep_batches: bool  # its batches are kept as they are
    batch_size: int | None  # the global batch size `decide` gets (a kept source's own)
    global_batch: int | None  # the global batch asked for (or the kept source's)
    drop: bool  # whether the training side drops its last partial batch
    split_counts: tuple[int, int] | None  # (train, validation) for arrays and datasets


def _batching(args: Arguments) -> _Batching:
    """A dataset passed in may already be batched (Keras loaders, `.batch(n).prefetch(1)`):
    its batches are kept when they already are what was asked for, else it is unbatched and
    batched again at the requested size; batches are never batched. Then the validation
    split's counts are checked, before any work, where the count is known."""
    src, strategy = args.src, args.strategy
    batch_size, per_replica_batch_size = args.batch_size, args.per_replica_batch_size
    num_replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    batched_source: Batches | None = None
    keep_batches = False
    if src.kind == "dataset":
        batched_source, ambiguous = source_batches(src.value)
        if ambiguous:
            warnings.warn(
                "tfgpu.data.pipeline: cannot tell whether the dataset passed in yields examples "
                f"or batches (its chain ends in a step that makes new elements, and every "
                f"component has an unknown first dimension: {src.value.element_spec}). It is "
                "treated as examples and batched; if its elements are batches, unbatch them "
                "first (`.unbatch()`), or build it without batching.",
                stacklevel=3,
            )
    requested = (
        batch_size
        if batch_size is not None
        else None
        if per_replica_batch_size is None
        else per_replica_batch_size * num_replicas
    )
    if batched_source is None and requested is None:
        raise ValueError(
            "Invalid arguments `batch_size` and `per_replica_batch_size`. Received: "
            "batch_size=None, per_replica_batch_size=None. Expected exactly one of them: the "
            "global batch size, or the batch size per replica (both may be None only for a "
            "dataset that is already batched, whose batches are then kept)."
        )
    if batched_source is not None:
        keep_batches, batch_size = batched_source_plan(
            batched_source,
            requested=requested,
            batch_size=batch_size,
            per_replica_batch_size=per_replica_batch_size,
            per_example=[
                f"{n}=..."
                for n, f in (("map_fn", args.map_fn), ("augment_fn", args.augment_fn))
                if f
            ]
            + ([f"shuffle_buffer={args.shuffle_buffer}"] if args.shuffle_buffer is not None else [])
            + (
                [f"validation_split={args.validation_split}"]
                if args.validation_split is not None
                else []
            ),
            drop_remainder=args.drop_remainder,
            num_replicas=num_replicas if strategy is not None else 1,
        )

    drop = bool(args.drop_remainder) if args.drop_remainder is not None else strategy is not None
    global_batch = requested if requested is not None else batch_size
    split_counts: tuple[int, int] | None = None
    if args.validation_split is not None and src.kind in ("memory", "dataset"):
        if src.kind == "memory":
            total = src.num_examples
        elif batched_source is not None:
            total = batched_source.num_examples
        else:
            total = cardinality(src.value)
        if total is None:
            raise refuse_dataset_split(
                "whose number of examples is unknown (e.g. after a `filter` or from a "
                "generator), so its last fraction cannot be taken",
                args.validation_split,
            )
        if total < 0:
            raise refuse_dataset_split("that is infinite (repeated)", args.validation_split)
        split_counts = check_split_counts(
            total, args.validation_split, global_batch, drop, args.drop_remainder is True
        )
    return _Batching(
        num_replicas=num_replicas,
        batched_source=batched_source,
        keep_batches=keep_batches,
        batch_size=batch_size,
        global_batch=global_batch,
        drop=drop,
        split_counts=split_counts,
    )


@dataclasses.dataclass(frozen=True)
class _Decoded:
    """Both sides after `map_fn`, and what was learned about it."""

    ds: tf.data.Dataset
    val_ds: tf.data.Dataset | None
    random_ops: tuple[str, ...]  # random op types in map_fn (they defeat the cache)
    ragged: bool  # map_fn got rows of a ragged feature: batch them ragged again


def _decode(args: Arguments, source: Read) -> _Decoded:
    """`map_fn` on both sides (the validation side in order), after checking its arity."""
    ds, val_ds, map_fn = source.ds, source.val_ds, args.map_fn
    if map_fn is None:
        return _Decoded(ds=ds, val_ds=val_ds, random_ops=(), ragged=False)
    check_arity("map_fn", map_fn, ds.element_spec, "an example")
    random_ops = random_op_types(map_fn, ds.element_spec)
    spec_in = ds.element_spec
    ds = parallel_map(ds, "map_fn", map_fn, args.deterministic)
    ragged = check_map_output(map_fn, spec_in, ds.element_spec)
    if val_ds is not None:
        val_ds = parallel_map(val_ds, "map_fn", map_fn, True)
    return _Decoded(ds=ds, val_ds=val_ds, random_ops=random_ops, ragged=ragged)


def _gather_facts(args: Arguments, batching: _Batching, source: Read, decoded: _Decoded) -> Facts:
    """What the plan is made from: the decoded examples, the machine, the strategy."""
    return Facts(
        kind=args.src.kind,
        num_examples=(source.split_counts[0] if source.split_counts else args.src.num_examples)
        if args.service is not None and args.src.kind == "memory"
        else cardinality(decoded.ds),
        element_bytes=bytes_per_example(decoded.ds.element_spec),
        num_files=source.num_files,
        has_map_fn=args.map_fn is not None,
        map_fn_random_ops=decoded.random_ops,
        num_replicas=batching.num_replicas,
        num_workers=worker_count(args.strategy),
        has_gpu=bool(tf.config.list_physical_devices("GPU")),
        cpu_count=usable_cores(),
        ram_budget_bytes=ram_budget(args.ram_budget_mib),
        free_disk_bytes=shutil.disk_usage(args.cache_dir).free if args.cache_dir else None,
        batched=batching.keep_batches,
        split_by_position=args.src.kind == "dataset" and args.validation_split is not None,
        service=args.service is not None,
    )


def _assemble(
    args: Arguments,
    batching: _Batching,
    source: Read,
    decoded: _Decoded,
    facts: Facts,
    plan: Plan,
) -> tuple[tf.data.Dataset, tf.data.Dataset | None]:
    """cache -> shuffle -> [repeat] -> augment_fn -> batch -> batch_map_fn -> batch_augment_fn
    -> prefetch on the training side; the validation side gets the same map_fn, batch_map_fn,
    batch, cache and sharding, but no augmentation, shuffle or repeat, always in one order."""
    ds = cached(decoded.ds, plan.cache)
    if plan.shuffle_buffer:
        ds = ds.shuffle(plan.shuffle_buffer, seed=plan.shuffle_seed, reshuffle_each_iteration=True)
    if args.repeat:
        ds = ds.repeat()
    if args.augment_fn is not None:
        check_arity("augment_fn", args.augment_fn, ds.element_spec, "an example after `map_fn`")
        ds = parallel_map(ds, "augment_fn", args.augment_fn, plan.deterministic)

    def finish(
        ds: tf.data.Dataset, plan: Plan, batch: bool, augment: Any, service: Any = None
    ) -> tf.data.Dataset:
        return _batched(
            ds,
            plan,
            batch=batch,
            ragged=decoded.ragged,
            batch_map_fn=args.batch_map_fn,
            batch_augment_fn=augment,
            ram_budget_bytes=facts.ram_budget_bytes,
            # A dataset passed in keeps its own sharding, unless it is split by position.
            keep_shard=args.src.kind == "dataset" and args.validation_split is None,
            service=service,
        )

    service = None
    if args.service is not None:
        name, index, count = choose_job(args.service_job_name, repeat=args.repeat)
        service = _Service(args.service, name, index, count)
    ds = finish(ds, plan, not batching.keep_batches, args.batch_augment_fn, service)
    val_ds = decoded.val_ds
    if val_ds is not None:
        split_counts = source.split_counts
        val_plan = validation_plan(
            plan,
            facts,
            cache=args.cache,
            drop_remainder=args.drop_remainder,
            num_examples=split_counts[1] if split_counts is not None else None,
            element_bytes=bytes_per_example(val_ds.element_spec),
        )
        val_ds = cached(val_ds, val_plan.cache)
        val_ds = finish(val_ds, val_plan, True, None)
    return ds, val_ds


def _batched(
    ds: tf.data.Dataset,
    plan: Plan,
    *,
    batch: bool,
    ragged: bool,
    batch_map_fn: Callable | None,
    batch_augment_fn: Callable | None,
    ram_budget_bytes: int,
    keep_shard: bool,
    service: _Service | None = None,
) -> tf.data.Dataset:
    """batch (`ragged`: a ragged batch) -> `batch_map_fn` -> `batch_augment_fn` -> prefetch ->
    options; the result is marked as built by `pipeline`."""
    if batch:
        # A plain batch, on purpose: tf.data fuses `map(augment_fn) -> batch` into one
        # MapAndBatchDataset that writes each augmented example straight into its batch. A
        # batch with `num_parallel_calls` is a ParallelBatchDataset, which that fusion skips:
        # one more stage and buffer per example cost 12-18% throughput on the image benchmark.
        # Where nothing fuses, the `parallel_batch` option (set in `_options`) still
        # parallelizes the copy.
        if ragged:  # rows of a ragged feature after map_fn: ragged again, as they came
            ds = ds.ragged_batch(plan.global_batch_size, drop_remainder=plan.drop_remainder)
        else:
            ds = ds.batch(plan.global_batch_size, drop_remainder=plan.drop_remainder)
    if batch_map_fn is not None:
        check_arity("batch_map_fn", batch_map_fn, ds.element_spec, "a batch")
        ds = parallel_map(ds, "batch_map_fn", batch_map_fn, plan.deterministic)
    if batch_augment_fn is not None:
        check_arity("batch_augment_fn", batch_augment_fn, ds.element_spec, "a batch")
        ds = parallel_map(ds, "batch_augment_fn", batch_augment_fn, plan.deterministic)
    if service is not None:
        # Everything so far runs on the service's workers, with options for their machine
        # (autotune within their own memory, TensorFlow's shared pool); the trainer reads
        # whole batches (one RPC each), splits them per replica and prefetches them.
        ds = ds.with_options(_options(plan, 0, keep_shard=True))
        ds = distributed(
            ds,
            service.address,
            name=service.job_name,
            consumer_index=service.consumer_index,
            num_consumers=service.num_consumers,
        )
    ds = ds.prefetch(tf.data.AUTOTUNE)
    ds = ds.with_options(_options(plan, ram_budget_bytes, keep_shard=keep_shard))
    return mark_pipeline(ds)


def _options(plan: Plan, ram_budget_bytes: int, *, keep_shard: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.autotune.enabled = True
    if ram_budget_bytes:  # 0: tf.data's own budget (a service worker's memory)
        options.autotune.ram_budget = int(ram_budget_bytes)
    options.deterministic = plan.deterministic
    opt = options.experimental_optimization
    opt.map_parallelization = True
    opt.map_fusion = True
    opt.filter_fusion = True
    opt.parallel_batch = True
    if plan.private_threadpool_size:
        options.threading.private_threadpool_size = plan.private_threadpool_size
    if not keep_shard:
        options.experimental_distribute.auto_shard_policy = getattr(
            tf.data.experimental.AutoShardPolicy, plan.shard_policy
        )
    return options
