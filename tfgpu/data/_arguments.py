"""The checks `pipeline()` runs on its arguments before any work, and what they return.

Every argument is checked (type, range, conflicts with the others, the source's kind) and
the result is one frozen `Arguments`, the only thing the later phases read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.data_service import Address, check_job_name, parse_address
from tfgpu._internal.helpers.checks import (
    check_bool,
    check_dir,
    check_int,
    check_number,
    conflicting,
    invalid_type,
    invalid_value,
)
from tfgpu.data._cache import check_cache
from tfgpu.data._limits import MAX_COUNT, MAX_RAM_BUDGET_MIB, MAX_SEED, POSITIVE, SEED
from tfgpu.data._sources import Source, check_compression, classify
from tfgpu.data._split import check_validation_split, refuse_dataset_split, reshuffles
from tfgpu.data._tfds import check_tfds_name


@dataclasses.dataclass(frozen=True)
class Arguments:
    """`pipeline()`'s arguments after the checks: normalized, classified. Pure data."""

    src: Source
    batch_size: int | None
    per_replica_batch_size: int | None
    strategy: tf.distribute.Strategy | None
    map_fn: Callable | None
    augment_fn: Callable | None
    batch_map_fn: Callable | None
    batch_augment_fn: Callable | None
    validation_split: float | None
    cache: Any  # None/bool, "auto", "memory", or a user-expanded file prefix
    cache_dir: str | None  # the file prefix's directory
    shuffle: bool
    shuffle_buffer: int | None
    drop_remainder: bool | None
    deterministic: bool | None  # True for a dataset passed in with validation_split
    repeat: bool
    distribute: bool
    seed: int | None
    ram_budget_mib: float | None
    private_threadpool_size: int | None
    split: str | None
    data_dir: Path | None
    compression_type: str | None
    service: Address | None = None  # the tf.data service dispatcher, when one runs the work
    service_job_name: str | None = None


def check_arguments(
    data: Any,
    *,
    batch_size: Any,
    per_replica_batch_size: Any,
    strategy: Any,
    map_fn: Any,
    augment_fn: Any,
    batch_map_fn: Any,
    batch_augment_fn: Any,
    validation_split: Any,
    cache: Any,
    shuffle: Any,
    shuffle_buffer: Any,
    drop_remainder: Any,
    deterministic: Any,
    repeat: Any,
    distribute: Any,
    seed: Any,
    ram_budget_mib: Any,
    private_threadpool_size: Any,
    split: Any,
    data_dir: Any,
    compression_type: Any,
    service: Any = None,
    service_job_name: Any = None,
) -> Arguments:
    """Checks every argument of `pipeline()`; raises the errors its docstring lists."""
    if batch_size is not None and per_replica_batch_size is not None:
        raise conflicting(
            f"batch_size={batch_size!r}",
            f"per_replica_batch_size={per_replica_batch_size!r}",
            "Pass exactly one of them: the global batch size, or the batch size per replica.",
        )
    batch_size = check_int(
        "batch_size", batch_size, maximum=MAX_COUNT, allow_none=True, expected=POSITIVE
    )
    per_replica_batch_size = check_int(
        "per_replica_batch_size",
        per_replica_batch_size,
        maximum=MAX_COUNT,
        allow_none=True,
        expected=POSITIVE,
    )
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        hint = " (call it: pass an instance)" if isinstance(strategy, type) else ""
        raise TypeError(
            f"Invalid type for argument `strategy`. Received: strategy={strategy!r} of type "
            f"{type(strategy).__name__}{hint}. Expected a `tf.distribute.Strategy` (e.g. from "
            "`tfgpu.strategy()`) or None."
        )
    for name, fn in (
        ("map_fn", map_fn),
        ("augment_fn", augment_fn),
        ("batch_map_fn", batch_map_fn),
        ("batch_augment_fn", batch_augment_fn),
    ):
        if fn is not None and not callable(fn):
            what = "one batch" if name.startswith("batch_") else "one example"
            raise invalid_type(name, fn, f"a callable (a function of {what}) or None")
    for name, flag in (("shuffle", shuffle), ("repeat", repeat), ("distribute", distribute)):
        check_bool(name, flag)
    check_bool("drop_remainder", drop_remainder, allow_none=True)
    check_bool("deterministic", deterministic, allow_none=True)
    shuffle_buffer = check_int(
        "shuffle_buffer", shuffle_buffer, maximum=MAX_COUNT, allow_none=True, expected=POSITIVE
    )
    if shuffle_buffer is not None and not shuffle:
        raise conflicting(
            "shuffle=False",
            f"shuffle_buffer={shuffle_buffer}",
            "Pass shuffle=True with a buffer, or no buffer without shuffling.",
        )
    cache, cache_dir = check_cache(cache)
    if distribute and strategy is None:
        raise conflicting(
            "distribute=True",
            "strategy=None",
            "Pass the `strategy` to distribute the dataset with.",
        )
    seed = check_int("seed", seed, minimum=0, maximum=MAX_SEED, allow_none=True, expected=SEED)
    ram_budget_mib = check_number(
        "ram_budget_mib",
        ram_budget_mib,
        minimum=0,
        maximum=MAX_RAM_BUDGET_MIB,
        exclusive_minimum=True,
        allow_none=True,
        expected=f"a finite number of MiB > 0 and <= {MAX_RAM_BUDGET_MIB:.0f}, or None",
    )
    private_threadpool_size = check_int(
        "private_threadpool_size",
        private_threadpool_size,
        minimum=0,
        maximum=2**31 - 1,
        allow_none=True,
        expected="an integer >= 0 (0 shares TensorFlow's thread pool) or None",
    )
    if compression_type is not None and not isinstance(compression_type, str):
        raise invalid_type("compression_type", compression_type, "one of: None, 'GZIP', 'ZLIB'")
    if compression_type not in (None, "", "GZIP", "ZLIB"):
        raise invalid_value("compression_type", compression_type, "one of: None, 'GZIP', 'ZLIB'")
    if split is not None and (not isinstance(split, str) or not split.strip()):
        raise invalid_type("split", split, "a str such as 'train' or 'train[:90%]', or None")
    data_dir = check_dir("data_dir", data_dir, allow_none=True)
    validation_split = check_validation_split(validation_split)

    address = parse_address(service) if service is not None else None
    service_job_name = check_job_name(service_job_name)
    if address is None and service_job_name is not None:
        raise conflicting(
            f"service_job_name={service_job_name!r}",
            "service=None",
            "Pass the dispatcher's `service` address with a job name.",
        )
    if address is not None:
        check_service_conflicts(service, cache, deterministic)

    src = classify(data)
    if src.kind != "tfds" and (split is not None or data_dir is not None):
        raise ValueError(
            f"Invalid arguments `split`/`data_dir`. Received: split={split!r}, "
            f"data_dir={data_dir!r} for a {src.kind} source. Expected them only with a "
            "TensorFlow Datasets name as `data`."
        )
    if src.kind != "files" and compression_type:
        raise ValueError(
            f"Invalid argument `compression_type`. Received: compression_type="
            f"{compression_type!r} for a {src.kind} source. Expected it only for TFRecord files."
        )
    if src.kind == "files":
        check_compression(src.value, compression_type or "")
    if src.kind == "tfds":
        check_tfds_name(src.value, data_dir, arg="data")
    if validation_split is not None and src.kind == "tfds" and split and re.search(r"[\[+]", split):
        raise conflicting(
            f"split={split!r}",
            f"validation_split={validation_split}",
            "Pass an unsliced split (e.g. split='train') with validation_split, or build two "
            "pipelines from sliced splits (split='train[:90%]' and split='train[90%:]', the "
            "second with shuffle=False).",
        )
    if validation_split is not None and src.kind == "dataset" and reshuffles(src.value):
        raise refuse_dataset_split(
            "that reshuffles its examples every pass (a `shuffle` step with "
            "reshuffle_each_iteration=True, as Keras loaders do by default), so training and "
            "validation examples would swap every epoch",
            validation_split,
        )
    if validation_split is not None and src.kind == "dataset":
        # The split takes the dataset's last examples, so the steps before it (the loader's
        # own parallel maps) must keep their order: tf.data options reach the whole chain.
        if deterministic is False:
            raise conflicting(
                "deterministic=False",
                f"validation_split={validation_split} for a `tf.data.Dataset`",
                "The split takes the dataset's last examples, which must come in the same "
                "order every pass: leave deterministic=None (the pipeline is then "
                "deterministic).",
            )
        deterministic = True
    return Arguments(
        src=src,
        batch_size=batch_size,
        per_replica_batch_size=per_replica_batch_size,
        strategy=strategy,
        map_fn=map_fn,
        augment_fn=augment_fn,
        batch_map_fn=batch_map_fn,
        batch_augment_fn=batch_augment_fn,
        validation_split=validation_split,
        cache=cache,
        cache_dir=cache_dir,
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
        service=address,
        service_job_name=service_job_name,
    )


def check_service_conflicts(service: str, cache: Any, deterministic: Any) -> None:
    """What a dynamically sharded service pipeline cannot promise: a cache (every epoch
    hands each worker other examples, and workers would race on one cache file) or a fixed
    order (the workers' batches arrive first come, first served)."""
    if cache not in ("auto", False, None):
        raise conflicting(
            f"cache={cache!r}",
            f"service={service!r}",
            "With the tf.data service each worker gets other examples every epoch, so a cache "
            "on the workers never holds the data (and a file cache would be written by every "
            "worker at once): pass cache='auto' or False, or cache the decoded examples "
            "yourself in TFRecord files the workers read.",
        )
    if deterministic is True:
        raise conflicting(
            "deterministic=True",
            f"service={service!r}",
            "The service's workers deliver batches first come, first served, so the order is "
            "never reproducible (every example still comes once per epoch): leave "
            "deterministic=None, or train without `service` for a fixed order.",
        )
