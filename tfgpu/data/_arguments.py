"""`pipeline()`'s arguments checked before any work; `Arguments` is what later phases read."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfgpu._internal.adapters.data_service import Address, check_job_name, parse_address
from tfgpu._internal.helpers.checks import (
    check_bool,
    check_dir,
    check_int,
    check_number,
    check_validation_split,
    conflicting,
    invalid_type,
    invalid_value,
)
from tfgpu.data._cache import check_cache
from tfgpu.data._limits import MAX_COUNT, MAX_RAM_BUDGET_MIB, MAX_SEED, POSITIVE, SEED
from tfgpu.data._sources import Source, classify


class Arguments(types.SimpleNamespace):
    """`pipeline()`'s arguments after the checks, by their names, normalized (`cache` a
    user-expanded file prefix, `service` a parsed address), and what the checks learned."""

    source: Source  # the adapter of `data`
    cache_dir: str | None  # the directory of a file cache
    service: Address | None  # the tf.data service dispatcher, when one runs the work


def check_arguments(given: Mapping[str, Any]) -> Arguments:
    """Checks every argument of `pipeline()` (`given`: `data` and every keyword by name)."""
    a = Arguments(**given)
    if a.batch_size is not None and a.per_replica_batch_size is not None:
        raise conflicting(
            f"batch_size={a.batch_size!r}",
            f"per_replica_batch_size={a.per_replica_batch_size!r}",
            "Pass exactly one of them: the global batch size, or the batch size per replica.",
        )
    a.batch_size, a.per_replica_batch_size = (
        check_int(name, getattr(a, name), maximum=MAX_COUNT, allow_none=True, expected=POSITIVE)
        for name in ("batch_size", "per_replica_batch_size")
    )
    _check_callables(a)
    for name in ("shuffle", "repeat", "distribute"):
        check_bool(name, getattr(a, name))
    check_bool("drop_remainder", a.drop_remainder, allow_none=True)
    check_bool("deterministic", a.deterministic, allow_none=True)
    a.shuffle_buffer = check_int(
        "shuffle_buffer", a.shuffle_buffer, maximum=MAX_COUNT, allow_none=True, expected=POSITIVE
    )
    if a.shuffle_buffer is not None and not a.shuffle:
        raise conflicting(
            "shuffle=False",
            f"shuffle_buffer={a.shuffle_buffer}",
            "Pass shuffle=True with a buffer, or no buffer without shuffling.",
        )
    a.cache, a.cache_dir = check_cache(a.cache)
    if a.distribute and a.strategy is None:
        raise conflicting(
            "distribute=True",
            "strategy=None",
            "Pass the `strategy` to distribute the dataset with.",
        )
    _check_numbers(a)
    compressions = "one of: None, 'GZIP', 'ZLIB'"
    if a.compression_type is not None and not isinstance(a.compression_type, str):
        raise invalid_type("compression_type", a.compression_type, compressions)
    if a.compression_type not in (None, "", "GZIP", "ZLIB"):
        raise invalid_value("compression_type", a.compression_type, compressions)
    if a.split is not None and (not isinstance(a.split, str) or not a.split.strip()):
        raise invalid_type("split", a.split, "a str such as 'train' or 'train[:90%]', or None")
    a.data_dir = check_dir("data_dir", a.data_dir, allow_none=True)
    a.validation_split = check_validation_split(a.validation_split)
    _check_service(a)
    a.source = classify(a.data)
    a.source.check(a)
    return a


def _check_callables(a: Arguments) -> None:
    """The `strategy` (an instance) and the functions applied to examples and batches."""
    if a.strategy is not None and not isinstance(a.strategy, tf.distribute.Strategy):
        hint = " (call it: pass an instance)" if isinstance(a.strategy, type) else ""
        raise invalid_type(
            "strategy",
            a.strategy,
            "a `tf.distribute.Strategy` (e.g. from `tfgpu.strategy()`) or None",
            received=f"strategy={a.strategy!r} of type {type(a.strategy).__name__}{hint}",
        )
    for name in ("map_fn", "augment_fn", "batch_map_fn", "batch_augment_fn"):
        fn = getattr(a, name)
        if fn is not None and not callable(fn):
            what = "one batch" if name.startswith("batch_") else "one example"
            raise invalid_type(name, fn, f"a callable (a function of {what}) or None")


def _check_numbers(a: Arguments) -> None:
    """`seed`, `ram_budget_mib` and `private_threadpool_size`, each in its range or None."""
    a.seed = check_int("seed", a.seed, minimum=0, maximum=MAX_SEED, allow_none=True, expected=SEED)
    a.ram_budget_mib = check_number(
        "ram_budget_mib",
        a.ram_budget_mib,
        minimum=0,
        maximum=MAX_RAM_BUDGET_MIB,
        exclusive_minimum=True,
        allow_none=True,
        expected=f"a finite number of MiB > 0 and <= {MAX_RAM_BUDGET_MIB:.0f}, or None",
    )
    a.private_threadpool_size = check_int(
        "private_threadpool_size",
        a.private_threadpool_size,
        minimum=0,
        maximum=2**31 - 1,
        allow_none=True,
        expected="an integer >= 0 (0 shares TensorFlow's thread pool) or None",
    )


def _check_service(a: Arguments) -> None:
    """The tf.data service's address and job name, and what cannot go with the service."""
    service = a.service
    a.service = parse_address(service) if service is not None else None
    a.service_job_name = check_job_name(a.service_job_name)
    if a.service is None and a.service_job_name is not None:
        raise conflicting(
            f"service_job_name={a.service_job_name!r}",
            "service=None",
            "Pass the dispatcher's `service` address with a job name.",
        )
    if a.service is None:
        return
    if a.cache not in ("auto", False, None):
        raise conflicting(
            f"cache={a.cache!r}",
            f"service={service!r}",
            "With the tf.data service each worker gets other examples every epoch, so a "
            "cache on the workers never holds the data (and a file cache would be written "
            "by every worker at once): pass cache='auto' or False, or cache the decoded "
            "examples yourself in TFRecord files the workers read.",
        )
    if a.deterministic is True:
        raise conflicting(
            "deterministic=True",
            f"service={service!r}",
            "The service's workers deliver batches first come, first served, so the order "
            "is never reproducible (every example still comes once per epoch): leave "
            "deterministic=None, or train without `service` for a fixed order.",
        )
