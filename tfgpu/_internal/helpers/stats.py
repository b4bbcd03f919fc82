"""The one definition of each small statistic tfgpu prints, so a figure shown in two places
agrees: missing values (None, NaN, infinities) are left out, none at all gives NaN."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from tfgpu._internal.helpers.checks import invalid_value


def finite(values: Iterable[Any]) -> list[float]:
    """The finite real numbers among `values`, as floats (None, NaN, inf, bools, str dropped)."""
    out = []
    for v in values:
        if isinstance(v, bool) or v is None:
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append(x)
    return out


def percentile(values: Iterable[Any], q: float) -> float:
    """The `q`-th percentile (0 to 100) of the finite `values`, linear as `numpy.nanpercentile`'s
    default ([1, 2, 3, 4]: 3.25 at 75); NaN if none; ValueError for `q` out of range."""
    if not 0 <= q <= 100:
        raise invalid_value("q", q, "0 to 100")
    ordered = sorted(finite(values))
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Iterable[Any]) -> float:
    """The median of the finite `values` (`percentile(values, 50)`); NaN if none."""
    return percentile(values, 50)


def mean(values: Iterable[Any]) -> float:
    """The mean of the finite `values`; NaN if none. Safe near the float maximum."""
    v = finite(values)
    if not v:
        return math.nan
    try:
        return math.fsum(v) / len(v)
    except OverflowError:  # the sum passes the float maximum (fsum raises for finite values)
        return math.fsum(x / len(v) for x in v)


def format_bytes(nbytes: float) -> str:
    """A byte count for people, in binary units: "512 B", "1.5 KiB", "2.0 MiB", "3.2 GiB"."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"
