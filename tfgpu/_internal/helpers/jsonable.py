"""Turning records into strict JSON (no NaN, no NumPy scalars, no unknown objects)."""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """`value` with only JSON types: NaN/inf -> None, tuples -> lists, NumPy scalars -> Python
    values, dict keys and unknown objects -> str."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a NumPy scalar
        return json_safe(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
