"""The checks of `Sampler`'s, `record`'s and `GPUMonitor`'s arguments (interval, GPU indices,
run directory), raised before any sampling starts."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.checks import (
    check_dir,
    check_number,
    invalid_type,
    invalid_value,
    is_int,
)

MIN_INTERVAL = 0.01
"""The shortest sampling interval, in seconds. NVML refreshes its readings every 1/6 s to 1 s,
so shorter intervals only repeat values, and below this the sampler thread would take a core."""


def check_interval(interval: Any) -> float:
    """Checks a sampling interval (seconds, >= `MIN_INTERVAL`); returns it as a float."""
    return check_number(
        "interval",
        interval,
        minimum=MIN_INTERVAL,
        expected=f"a number of seconds >= {MIN_INTERVAL} (NVML refreshes every 1/6 s to 1 s), "
        "e.g. 0.2",
    )


_GPUS_EXPECTED = "None (all GPUs this process uses) or a list of GPU indices (ints), e.g. [0, 1]"


def check_gpus(gpus: Any) -> list[int] | None:
    """Checks the form of a `gpus` argument (the indices are checked against NVML later)."""
    if gpus is None:
        return None
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise invalid_type("gpus", gpus, _GPUS_EXPECTED)
    checked = []
    for g in gpus:
        if not is_int(g):
            raise invalid_type("gpus", list(gpus), _GPUS_EXPECTED)
        if g < 0:
            raise invalid_value(
                "gpus",
                list(gpus),
                "non-negative GPU indices, as TensorFlow numbers them (`/GPU:0` is 0)",
            )
        if int(g) in checked:
            raise invalid_value("gpus", list(gpus), "each GPU index at most once")
        checked.append(int(g))
    return checked


def check_log_dir(log_dir: Any, argument: str = "log_dir") -> Path:
    """Checks a run directory, creates it if needed and proves it writable (else ValueError)."""
    path = check_dir(argument, log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".tfgpu-write-test-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise invalid_value(
            argument,
            str(log_dir),
            f"a directory this process can create and write to "
            f"({type(e).__name__}: {e.strerror or e})",
        ) from e
    return path
