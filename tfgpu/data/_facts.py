"""Facts the plan is made from, read without side effects: example size, RAM, CPUs, workers."""

from __future__ import annotations

from typing import Any

import psutil
import tensorflow as tf

from tfgpu._internal.helpers.checks import is_int
from tfgpu.data._limits import MIB

# Fraction of the available host memory used as the default RAM budget.
_DEFAULT_RAM_FRACTION = 0.5


def bytes_per_example(spec: Any) -> int | None:
    total = 0
    for s in tf.nest.flatten(spec):
        if (
            not isinstance(s, tf.TensorSpec)
            or not s.shape.is_fully_defined()
            or s.dtype in (tf.string, tf.variant, tf.resource)
        ):
            return None
        total += s.shape.num_elements() * s.dtype.size
    return total


def ram_budget(ram_budget_mib: float | None) -> int:
    if ram_budget_mib is not None:
        return int(ram_budget_mib * MIB)
    return int(psutil.virtual_memory().available * _DEFAULT_RAM_FRACTION)


def worker_count(strategy: Any) -> int:
    if strategy is None:
        return 1
    n = getattr(strategy.extended, "worker_count", None)
    if n is not None and is_int(n) and n > 0:
        return int(n)
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None:
        try:
            spec = resolver.cluster_spec()
            return max(
                1, sum(spec.num_tasks(job) for job in ("worker", "chief") if job in spec.jobs)
            )
        # TF_CONFIG that is not JSON or not a cluster (ValueError, KeyError, TypeError), a
        # resolver that cannot ask the scheduler (OSError, RuntimeError): one worker.
        except (KeyError, OSError, RuntimeError, TypeError, ValueError):
            return 1
    return 1
