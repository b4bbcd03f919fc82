"""Epoch aggregates: the pure statistics over timeline columns that `Sampler.aggregate()`
returns and `GPUMonitor` summarizes into `logs` (every key: `docs/metrics.md`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfgpu._internal.helpers import stats

_NAN = float("nan")

# (column, statistic), keyed `<column>_<statistic>` (a "delta" by the column alone); what each
# statistic is: docs/metrics.md, "Epoch aggregates".
_GPU_AGGREGATES = (
    ("util_pct", "mean"), ("util_pct", "max"), ("mem_used_mib", "mean"), ("mem_used_mib", "max"),
    ("power_w", "mean"), ("power_w", "max"), ("sm_active_pct", "mean"),
    ("sm_occupancy_pct", "mean"), ("tensor_active_pct", "mean"), ("dram_active_pct", "mean"),
    ("pcie_tx_mib_s", "mean"), ("pcie_rx_mib_s", "mean"), ("energy_j", "delta"),
    ("power_limit_w", "max"), ("sm_clock_mhz", "mean"), ("throttle_reasons", "any"),
)  # fmt: skip
_HOST_AGGREGATES = (("host_cpu_pct", "mean"), ("host_rss_mib", "max"))


def _aggregates(num_gpus: int) -> list[tuple[str, str, str]]:
    """(key, column, statistic) of every aggregate, in order."""
    columns = [(f"gpu{i}_{c}", stat) for i in range(num_gpus) for c, stat in _GPU_AGGREGATES]
    return [
        (column if stat == "delta" else f"{column}_{stat}", column, stat)
        for column, stat in [*columns, *_HOST_AGGREGATES]
    ]


def aggregate_keys(num_gpus: int) -> list[str]:
    """Returns the keys of `Sampler.aggregate()`, in order. The guide: docs/metrics.md.

    Args:
        num_gpus: int, how many GPUs are sampled.

    Returns:
        list of str, each GPU's keys (`gpu0_util_pct_mean`, ...), then the host's.

    Example:

    >>> aggregate_keys(0)
    ['host_cpu_pct_mean', 'host_rss_mib_max']
    """
    return [key for key, _, _ in _aggregates(num_gpus)]


def _stat(values: Sequence[float], stat: str) -> float:
    finite = stats.finite(values)
    if not finite or stat == "mean":
        return stats.mean(finite)
    if stat == "max":
        return max(finite)
    if stat == "delta":
        change = finite[-1] - finite[0]
        return change if len(finite) >= 2 and change >= 0 else _NAN
    bits = 0  # "any"
    for v in finite:
        bits |= int(v) if v >= 0 else 0
    return float(bits)


def aggregate_columns(columns: Mapping[str, Sequence[float]], num_gpus: int) -> dict[str, float]:
    """Pure: epoch aggregates (NaN-ignoring mean/max) of the given column values."""
    return {
        key: _stat(columns.get(column, ()), stat) for key, column, stat in _aggregates(num_gpus)
    }
