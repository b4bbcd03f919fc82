"""Epoch aggregates: the pure statistics over timeline columns that `Sampler.aggregate()`
returns and `GPUMonitor` summarizes into `logs` (every key: `docs/metrics.md`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfgpu._internal.helpers import stats

_NAN = float("nan")

# (key suffix, source column, statistic). mean/max ignore NaN; "delta": a cumulative counter's
# increase (last finite value minus the first, NaN with fewer than two or if it went back);
# "or": the bitwise OR of the finite bitmasks, as a float.
_GPU_AGGREGATES = (
    ("util_pct_mean", "util_pct", "mean"),
    ("util_pct_max", "util_pct", "max"),
    ("mem_used_mib_mean", "mem_used_mib", "mean"),
    ("mem_used_mib_max", "mem_used_mib", "max"),
    ("power_w_mean", "power_w", "mean"),
    ("power_w_max", "power_w", "max"),
    ("sm_active_pct_mean", "sm_active_pct", "mean"),
    ("sm_occupancy_pct_mean", "sm_occupancy_pct", "mean"),
    ("tensor_active_pct_mean", "tensor_active_pct", "mean"),
    ("dram_active_pct_mean", "dram_active_pct", "mean"),
    ("pcie_tx_mib_s_mean", "pcie_tx_mib_s", "mean"),
    ("pcie_rx_mib_s_mean", "pcie_rx_mib_s", "mean"),
    ("energy_j", "energy_j", "delta"),
    ("power_limit_w_max", "power_limit_w", "max"),
    ("sm_clock_mhz_mean", "sm_clock_mhz", "mean"),
    ("throttle_reasons_any", "throttle_reasons", "or"),
)
_HOST_AGGREGATES = (
    ("host_cpu_pct_mean", "host_cpu_pct", "mean"),
    ("host_rss_mib_max", "host_rss_mib", "max"),
)


def aggregate_keys(num_gpus: int) -> list[str]:
    """Returns the keys of `Sampler.aggregate()`, in order (see `docs/metrics.md`).

    Args:
        num_gpus: int, how many GPUs are sampled.

    Returns:
        list of str, each GPU's keys (`gpu0_util_pct_mean`, ..., `gpu0_throttle_reasons_any`),
        then `host_cpu_pct_mean`, `host_rss_mib_max`.

    Example:

    >>> aggregate_keys(0)
    ['host_cpu_pct_mean', 'host_rss_mib_max']
    """
    keys = [f"gpu{i}_{suffix}" for i in range(num_gpus) for suffix, _, _ in _GPU_AGGREGATES]
    return keys + [key for key, _, _ in _HOST_AGGREGATES]


def _stat(values: Sequence[float], stat: str) -> float:
    finite = stats.finite(values)
    if not finite or stat == "mean":
        return stats.mean(finite)
    if stat == "max":
        return max(finite)
    if stat == "delta":
        change = finite[-1] - finite[0]
        return change if len(finite) >= 2 and change >= 0 else _NAN
    bits = 0  # "or"
    for v in finite:
        bits |= int(v) if v >= 0 else 0
    return float(bits)


def aggregate_columns(columns: Mapping[str, Sequence[float]], num_gpus: int) -> dict[str, float]:
    """Pure: epoch aggregates (NaN-ignoring mean/max) of the given column values."""
    result: dict[str, float] = {}
    for i in range(num_gpus):
        for suffix, source, stat in _GPU_AGGREGATES:
            result[f"gpu{i}_{suffix}"] = _stat(columns.get(f"gpu{i}_{source}", ()), stat)
    for key, source, stat in _HOST_AGGREGATES:
        result[key] = _stat(columns.get(source, ()), stat)
    return result
