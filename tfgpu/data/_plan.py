"""The pipeline's pure decisions: `decide()` (a `Plan` from `Facts`), `validation_plan()`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tfgpu._internal.helpers.checks import invalid_value
from tfgpu._internal.helpers.stats import format_bytes
from tfgpu.data._sources import SOURCES

# Shuffle buffer when nothing else limits it: large enough to mix well, small enough to fill fast.
_MAX_SHUFFLE_BUFFER = 10_000
# ... when what fills it is computed every epoch (not a cache), as Keras's loaders shuffle 1,024
# paths (docs/data.md, "How large a shuffle buffer"; issue 27).
_UNCACHED_SHUFFLE_BUFFER = 1_024
_SHUFFLE_RAM_FRACTION = 0.1  # of the RAM budget, at most
_SHARED_SEED = 0  # for shuffles that must agree across workers (DATA sharding)


@dataclasses.dataclass(frozen=True)
class Facts:
    """What is known about the data and the machine when the plan is made."""

    kind: str  # the source's kind, a key of `_sources.SOURCES`
    num_examples: int | None  # None: unknown; -1: infinite
    element_bytes: int | None  # bytes of one example after map_fn, None when not static
    num_files: int | None
    has_map_fn: bool
    map_fn_random_ops: tuple[str, ...]
    replicas: int
    workers: int
    on_gpu: bool
    cpu_count: int
    ram_budget_bytes: int
    free_disk_bytes: int | None  # at the cache path, when caching to a file
    batched: bool = False  # the source's batches are kept: num_examples counts batches
    split_by_position: bool = False  # validation by take/skip: every worker reads it all
    service: bool = False  # tf.data service workers run the work up to the batches
    reshuffled: bool = False  # the dataset passed in reshuffles every pass (a Keras loader)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the pipeline will be built. Produced by `decide`, applied by `pipeline`."""

    global_batch_size: int
    drop_remainder: bool
    shuffle_buffer: int | None  # None: no shuffle
    shuffle_seed: int | None
    cache: str | None  # None, "memory", or a file path
    deterministic: bool
    shard_policy: str  # name of tf.data.experimental.AutoShardPolicy member
    private_threadpool_size: int
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # notes that call for the user's action, issued as warnings
    keep_shard: bool = False  # the source keeps its own auto-shard policy (a dataset passed in)


def drop_remainder_default(drop_remainder: bool | None, replicas: int, shuffle: bool) -> bool:
    """`drop_remainder` as given, else True for a shuffled (training) pipeline on several
    replicas: Keras splits a partial batch unevenly and each replica averages its own share,
    which is not the step one device takes (docs/data.md, "The last partial batch"). One
    replica keeps it, as `fit` does; an unshuffled pipeline is for validation: every example
    counts."""
    if drop_remainder is not None:
        return drop_remainder
    return replicas > 1 and shuffle


def dropped_by_default(facts: Facts, global_batch: int) -> str:
    """What the default `drop_remainder=True` drops every epoch, in words ("" when nothing:
    a source of a whole number of batches, or its own batches kept)."""
    n = facts.num_examples
    if facts.batched or not global_batch or (n is not None and (n < 0 or n % global_batch == 0)):
        return ""
    replicas = f"on {facts.replicas} replicas the last partial batch is dropped by default"
    fix = (
        "pass drop_remainder=False to keep it (Keras then splits it unevenly: each replica "
        "averages its own share), or drop_remainder=True to say you mean it"
    )
    if n is None:
        return f"{replicas} (an unknown number of examples every epoch); {fix}"
    left = n % global_batch
    return (
        f"{replicas}: {left} of {n} examples ({left / n:.1%}) every epoch, a global batch of "
        f"{global_batch}; {fix}"
    )


def decide(
    facts: Facts,
    *,
    batch_size: int | None,
    per_replica_batch_size: int | None,
    cache: Any,
    shuffle: bool,
    shuffle_buffer: int | None,
    drop_remainder: bool | None,
    deterministic: bool | None,
    seed: int | None,
    has_strategy: bool,
    private_threadpool_size: int | None,
    repeat: bool = False,
) -> Plan:
    """The `Plan` from facts and wishes (pure); ValueError for a batch or a cache that fails."""
    asked = drop_remainder
    drop_remainder = drop_remainder_default(asked, facts.replicas if has_strategy else 1, shuffle)
    global_batch = _global_batch(
        facts, batch_size, per_replica_batch_size, has_strategy, drop_remainder and not repeat
    )
    dropped = ""
    if drop_remainder and asked is None and not repeat:
        dropped = dropped_by_default(facts, global_batch)
    if facts.num_examples == 0:
        raise invalid_value(
            "data",
            None,
            "at least one example",
            received=f"a source with 0 {'batches' if facts.batched else 'examples'}",
        )

    # Under the tf.data service the job shares the data among trainers: no auto-sharding on
    # top (tf.distribute turns it off for a named job too). AUTO: as the user set it.
    policy = SOURCES[facts.kind].shard_policy(facts)
    notes = []
    if policy == "DATA" and facts.num_files is not None and facts.workers > 1:
        notes.append(
            f"{facts.num_files} file(s) for {facts.workers} workers: sharding by example (DATA), "
            "each worker reads every file"
        )
    shard_policy = "OFF" if facts.service else policy
    data_sharded = facts.workers > 1 and shard_policy in ("DATA", "AUTO")

    # DATA sharding keeps every k-th element: all workers need one order (deterministic, one
    # seed); so do unshuffled data and a seed. The service serves first come, first served.
    if deterministic is None:
        deterministic = not facts.service and (data_sharded or not shuffle or seed is not None)
    if data_sharded and seed is None and shuffle:
        seed = _SHARED_SEED
        notes.append(f"shuffle seeded with {_SHARED_SEED} so every worker shards the same order")

    cache_plan, cache_note, warning = _cache(facts, cache)
    buffer, buffer_note = _shuffle_buffer(
        facts, shuffle, shuffle_buffer, cached=cache_plan is not None, global_batch=global_batch
    )
    # Own thread pool on GPU hosts: input threads do not queue behind kernel launches.
    if private_threadpool_size is None:
        private_threadpool_size = facts.cpu_count if facts.on_gpu and not facts.service else 0

    return Plan(
        global_batch_size=global_batch,
        drop_remainder=bool(drop_remainder),
        shuffle_buffer=buffer,
        shuffle_seed=seed,
        cache=cache_plan,
        deterministic=bool(deterministic),
        shard_policy=shard_policy,
        private_threadpool_size=private_threadpool_size,
        notes=tuple(note for note in (*notes, cache_note, buffer_note) if note),
        warnings=tuple(w for w in (warning, dropped) if w),
        keep_shard=policy == "AUTO",
    )


def _global_batch(
    facts: Facts,
    batch_size: int | None,
    per_replica_batch_size: int | None,
    has_strategy: bool,
    drops_partial: bool,
) -> int:
    """The global batch; ValueError if it splits unevenly or a dropped partial batch leaves none."""
    replicas = facts.replicas
    if per_replica_batch_size is not None:
        global_batch = per_replica_batch_size * replicas
        arg, value = "per_replica_batch_size", per_replica_batch_size
    else:
        global_batch = int(batch_size or 0)  # 0: a kept source's batches of unknown size
        arg, value = "batch_size", global_batch
        if has_strategy and global_batch % replicas and not facts.batched:
            raise invalid_value(
                "batch_size",
                global_batch,
                f"a multiple of {replicas}, e.g. "
                f"batch_size={max(1, global_batch // replicas) * replicas}, "
                "or pass `per_replica_batch_size` instead",
                received=f"batch_size={global_batch}, which does not split evenly over the "
                f"strategy's {replicas} replicas",
            )
    n = facts.num_examples
    if drops_partial and not facts.batched and n is not None and 0 < n < global_batch:
        split = f" ({global_batch // replicas} per replica x {replicas} replicas)"
        raise invalid_value(
            arg,
            value,
            f"a global batch of at most {n}: pass a smaller `{arg}`, drop_remainder=False, "
            "or more data",
            received=f"{arg}={value}, a global batch of {global_batch}"
            f"{split if has_strategy else ''}, but the source has only {n} examples and "
            "drop_remainder=True drops the partial batch, so the pipeline would yield no "
            "batch at all",
        )
    return global_batch


def _infinite(facts: Facts) -> bool:
    """Whether the source is known to be infinite."""
    return facts.num_examples is not None and facts.num_examples < 0


def _cache_bytes(facts: Facts) -> int | None:
    """The size of a cache of every example, when the source is finite and its size static."""
    if facts.element_bytes is None or facts.num_examples is None or _infinite(facts):
        return None
    return facts.element_bytes * facts.num_examples


def _in_memory(facts: Facts) -> bool:
    """Whether the examples are arrays in memory already (no map_fn): a cache gains nothing."""
    return SOURCES[facts.kind].in_memory and not facts.has_map_fn


def _cache(facts: Facts, cache: Any) -> tuple[str | None, str, str]:
    """Where to cache (None: nowhere), a note, a warning ("": none); raises for one that fails."""
    if cache is None or cache is False:
        return None, "", ""
    cache_bytes = _cache_bytes(facts)
    if facts.service:
        # Each epoch hands every worker other examples: a cache there never holds the data.
        return None, "not cached: the tf.data service's workers get other examples every epoch", ""
    random_ops = ", ".join(facts.map_fn_random_ops)
    if cache != "auto":
        target = "memory" if cache is True or cache == "memory" else os.fspath(cache)
        _check_cache_fits(facts, cache, target, cache_bytes)
        repeated = f"cache after a map_fn with random ops ({random_ops}) repeats them every epoch"
        return target, "", repeated if random_ops else ""
    if random_ops:
        moved = f"not cached: map_fn contains random ops ({random_ops}); move them to augment_fn"
        return None, "", moved
    if _infinite(facts):
        return None, "not cached: the source is infinite", ""
    if not SOURCES[facts.kind].cache_unmapped and not facts.has_map_fn:
        # Already in memory / may hold the user's own randomness: nothing to gain.
        return None, "", ""
    if cache_bytes is None:
        return None, "not cached: the cache size cannot be estimated (dynamic shapes)", ""
    if cache_bytes > facts.ram_budget_bytes:
        budget = format_bytes(facts.ram_budget_bytes)
        return None, f"not cached: {format_bytes(cache_bytes)} exceeds the RAM budget {budget}", ""
    return "memory", "", ""


def _check_cache_fits(facts: Facts, cache: Any, target: str, cache_bytes: int | None) -> None:
    """Raises for a cache asked for that would never complete or not fit where it goes."""

    def refused(expected: str, received: str) -> ValueError:
        return invalid_value("cache", cache, expected, received=f"cache={cache!r}{received}")

    if _infinite(facts):
        raise refused(
            "cache=False, or a finite source (repeat with `repeat=True`, which comes after "
            "the cache)",
            " for an infinite source: the cache would never complete",
        )
    if cache_bytes is None:
        return
    size = f", but the cache would take about {format_bytes(cache_bytes)}"
    if target == "memory" and cache_bytes > facts.ram_budget_bytes:
        raise refused(
            "a cache that fits: pass a file path (cache='/fast/disk/cache'), raise "
            "`ram_budget_mib`, or cache smaller decoded examples (e.g. resize in map_fn)",
            f"{size} ({facts.num_examples} examples x {format_bytes(facts.element_bytes or 0)}), "
            f"more than the RAM budget of {format_bytes(facts.ram_budget_bytes)}",
        )
    free = facts.free_disk_bytes
    if target != "memory" and free is not None and cache_bytes > free:
        raise refused(
            "a path on a disk with enough free space",
            f"{size} and only {format_bytes(free)} is free there",
        )


def _shuffle_buffer(
    facts: Facts, shuffle: bool, shuffle_buffer: int | None, *, cached: bool, global_batch: int
) -> tuple[int | None, str]:
    """The shuffle buffer (None: no shuffle), with a note ("": none)."""
    if not shuffle or facts.batched:  # a kept source's order and shuffling are its own
        return None, ""
    if shuffle_buffer is not None:
        return shuffle_buffer, ""
    if facts.reshuffled and not cached:
        return None, "no shuffle buffer: the dataset passed in reshuffles every pass"
    buffer = _MAX_SHUFFLE_BUFFER
    if facts.num_examples is not None and facts.num_examples > 0:
        buffer = min(buffer, facts.num_examples)
    if facts.element_bytes:
        by_ram = int(facts.ram_budget_bytes * _SHUFFLE_RAM_FRACTION // facts.element_bytes)
        buffer = max(min(buffer, by_ram), min(buffer, global_batch), 1)
    if not cached and not _in_memory(facts):
        buffer = min(buffer, max(_UNCACHED_SHUFFLE_BUFFER, global_batch))
    return buffer, ""


# Validation examples of unknown size (dynamic shapes) cached in memory by `cache="auto"`
# when at most this many: a few hundred MiB even for decoded images.
_SMALL_VALIDATION = 2_000


def validation_plan(
    plan: Plan,
    facts: Facts,
    *,
    cache: Any,
    drop_remainder: bool | None,
    num_examples: int | None,
    element_bytes: int | None,
) -> Plan:
    """The validation side's plan from the training side's (docs/data.md, "Validation data")."""
    val_cache = plan.cache if plan.cache in (None, "memory") else f"{plan.cache}-validation"
    if (
        val_cache is None
        and cache == "auto"
        and not facts.map_fn_random_ops
        and not _in_memory(facts)
        and num_examples is not None
    ):
        size = element_bytes * num_examples if element_bytes is not None else None
        if (size is not None and size <= facts.ram_budget_bytes) or (
            size is None and num_examples <= _SMALL_VALIDATION
        ):
            val_cache = "memory"
    return dataclasses.replace(
        plan,
        shuffle_buffer=None,
        deterministic=True,
        drop_remainder=drop_remainder is True,
        cache=val_cache,
    )
