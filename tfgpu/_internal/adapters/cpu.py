"""An upper bound of this CPU's FLOP/s (usable cores x max clock x FLOPs per cycle of its vector
flags) for `diagnose`, or None (the sources: docs/diagnosis.md, "FLOPs and MFU"). No TensorFlow."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from tfgpu._internal.helpers.checks import invalid_type, invalid_value

_CPUINFO = Path("/proc/cpuinfo")
_MAX_FREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
_CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")

# dtype (or Keras policy) name -> the rate class used below.
_DTYPES = {
    "float32": "fp32", "fp32": "fp32", "tf32": "fp32",
    "float64": "fp32",  # half the float32 rate on vector units: float32's stays an upper bound
    "float16": "fp16", "fp16": "fp16", "mixed_float16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16", "mixed_bfloat16": "bf16",
}  # fmt: skip

_AMX_PER_CYCLE = 1024  # one AMX tile multiply unit: 16x32x(2 bf16) per cycle per core
# float32 FLOPs per cycle per core for the best vector flags present (docs/diagnosis.md).
_FP32_PER_CYCLE = (
    ({"avx512f"}, 2 * 16 * 2), ({"avx2", "fma"}, 2 * 8 * 2), ({"avx"}, 2 * 8),
    ({"sse"}, 2 * 4 * 2), ({"sse2"}, 2 * 4 * 2), ({"asimd"}, 4 * 4 * 2),
)  # fmt: skip


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _positive(text: str | None) -> float | None:
    """`text` as a finite number > 0, or None (missing, "max", garbage)."""
    try:
        x = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return x if math.isfinite(x) and x > 0 else None


def _values(cpuinfo: str, *keys: str) -> list[str]:
    """The values of the `key : value` lines of a /proc/cpuinfo text whose key is in `keys`."""
    lines = (line.partition(":") for line in cpuinfo.splitlines())
    return [value for key, sep, value in lines if sep and key.strip().lower() in keys]


def _flops_per_cycle(cpuinfo: str, rate: str) -> int | None:
    """FLOPs per cycle per core for a rate class ('fp32', 'fp16', 'bf16') by cpuinfo's flags."""
    values = _values(cpuinfo, "flags", "features")
    flags = set(values[0].split()) if values else set()
    fp32 = next((n for needed, n in _FP32_PER_CYCLE if needed <= flags), None)
    if fp32 is None or rate == "fp32":
        return fp32
    if f"amx_{rate}" in flags:  # amx_bf16, amx_fp16
        return max(_AMX_PER_CYCLE, fp32)
    return 2 * fp32 if f"avx512_{rate}" in flags else fp32


def _max_clock_hz(cpuinfo: str, max_freq_khz: str | None) -> float | None:
    """The max clock: cpufreq's `cpuinfo_max_freq` (kHz), else the highest `cpu MHz`."""
    khz = _positive(max_freq_khz)
    if khz is not None:
        return khz * 1e3
    mhz = [m for m in map(_positive, _values(cpuinfo, "cpu mhz")) if m is not None]
    return max(mhz) * 1e6 if mhz else None


def _usable_cores(
    affinity: int | None,
    cpu_count: int | None,
    cgroup_v2_max: str | None = None,
    cfs_quota_us: str | None = None,
    cfs_period_us: str | None = None,
) -> int | None:
    """The cores this process can use: the affinity set (else cpu_count), capped by a quota."""
    cores = affinity if affinity else cpu_count
    if not cores or cores < 1:
        return None
    quota = period = None
    if cgroup_v2_max is not None:
        parts = cgroup_v2_max.split()  # "QUOTA PERIOD", or "max PERIOD": no quota
        if len(parts) == 2:
            quota, period = _positive(parts[0]), _positive(parts[1])
    else:
        quota, period = _positive(cfs_quota_us), _positive(cfs_period_us)  # -1: no quota
    if quota is not None and period is not None:
        cores = min(cores, max(1, math.ceil(quota / period)))
    return cores


def _peak_from_texts(
    cpuinfo: str | None, cores: int | None, max_freq_khz: str | None, rate: str
) -> float | None:
    """The pure part of `peak_flops`: cores x clock x FLOPs per cycle, or None."""
    if not cpuinfo or not cores:
        return None
    per_cycle = _flops_per_cycle(cpuinfo, rate)
    clock = _max_clock_hz(cpuinfo, max_freq_khz)
    if per_cycle is None or clock is None:
        return None
    return float(cores) * clock * per_cycle


def peak_flops(dtype: str = "float32") -> float | None:
    """An upper bound of this CPU's FLOP/s for a dtype or policy name ("bf16", ...), or None."""
    expected = f"one of: {', '.join(repr(d) for d in _DTYPES)}"
    if not isinstance(dtype, str):
        raise invalid_type("dtype", dtype, f"a str, {expected}")
    rate = _DTYPES.get(dtype.lower())
    if rate is None:
        raise invalid_value("dtype", dtype, expected)
    if not sys.platform.startswith("linux"):
        return None
    return _peak_from_texts(_read(_CPUINFO), usable_cores(), _read(_MAX_FREQ), rate)


def usable_cores() -> int:
    """The cores this process may use: its affinity set (else `os.cpu_count()`) within a quota."""
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        affinity = None
    cgroup = [_read(path) for path in (_CGROUP_V2_MAX, _CGROUP_V1_QUOTA, _CGROUP_V1_PERIOD)]
    return _usable_cores(affinity, os.cpu_count(), *cgroup) or 1
