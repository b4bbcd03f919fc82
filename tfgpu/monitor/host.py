"""The sampler thread's host reader, through `psutil` (`HOST_METRICS`, importable from here too)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from tfgpu.monitor._metrics import HOST_METRICS as HOST_METRICS

_log = logging.getLogger(__name__)
_MIB = 1024.0 * 1024.0
_NAN = float("nan")


def _busy_and_total(times: Any) -> tuple[float, float]:
    total = sum(times)
    if sys.platform.startswith("linux"):
        # guest time is already counted in user/nice on Linux (psutil does the same)
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def _cpu_pct(previous: Any, current: Any) -> float:
    """Busy percent between two `psutil.cpu_times()` readings; NaN if no time passed."""
    busy0, total0 = _busy_and_total(previous)
    busy1, total1 = _busy_and_total(current)
    elapsed = total1 - total0
    if elapsed <= 0:
        return _NAN
    return max(0.0, min(100.0, 100.0 * (busy1 - busy0) / elapsed))


class HostReader:
    """Reads `HOST_METRICS` (NaN, one warning, if psutil fails). CPU percent from its own
    `cpu_times()` deltas (`psutil.cpu_percent()` callers cannot disturb it), over at least
    `min_window` seconds of `clock` (docs/metrics.md, "Rates from two counter readings")."""

    def __init__(self, clock: Callable[[], float], min_window: float = 0.0) -> None:
        self._psutil: Any = None
        self._process: Any = None  # None: psutil could not open this process
        self._clock = clock
        self._min_window = min_window
        self._last: tuple[float, Any] | None = None  # (clock, cpu_times()) of the CPU base
        self._reported = False
        try:
            import psutil
        except (ImportError, NotImplementedError) as e:  # not installed; an unknown platform
            self._warn(e)
            return
        self._psutil = psutil
        try:
            self._process = psutil.Process()
        except (psutil.Error, OSError) as e:
            self._warn(e)

    def _warn(self, error: Exception) -> None:
        if not self._reported:
            self._reported = True
            _log.warning(
                "tfgpu.monitor: host metrics unavailable (%s); recorded as NaN. "
                "Install psutil with: pip install psutil",
                error,
            )

    def read(self) -> list[float]:
        """Returns the values of `HOST_METRICS`, in that order."""
        psutil = self._psutil
        if psutil is None:
            return [_NAN] * len(HOST_METRICS)
        # psutil's own errors (no such process, access denied); OSError: a /proc it cannot read
        errors = (psutil.Error, OSError)
        values = [_NAN, _NAN, _NAN]
        try:
            now, times = self._clock(), psutil.cpu_times()
            if self._last is None or now - self._last[0] >= self._min_window:
                if self._last is not None:
                    values[0] = _cpu_pct(self._last[1], times)
                self._last = now, times
        except errors as e:
            self._warn(e)
        if self._process is not None:
            try:
                values[1] = self._process.memory_info().rss / _MIB
            except errors as e:
                self._warn(e)
        try:
            values[2] = float(psutil.virtual_memory().percent)
        except errors as e:
            self._warn(e)
        return values
