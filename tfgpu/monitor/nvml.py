"""NVML queries: which GPUs exist, which this process uses, and their readings.

Imports only `pynvml` (from `nvidia-ml-py`), and only when a function runs; never TensorFlow.
NVML itself ships with the NVIDIA driver: wherever `nvidia-smi` works, these queries work.

Public here: `inventory()` with its `NvmlInventory` and `GpuInfo` records, `visible_gpus()`
(the pure mapping of `CUDA_VISIBLE_DEVICES` onto NVML devices), and `GPU_METRICS`, the
per-GPU metrics the sampler records, each naming its NVML source and `nvidia-smi` query.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, TypeVar

_log = logging.getLogger("tfgpu.monitor")

NVML_HINT = (
    "NVML ships with the NVIDIA driver: install or repair the driver until `nvidia-smi` "
    "works; the Python binding is `pip install nvidia-ml-py`."
)

_MIB = 1024.0 * 1024.0
_NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class Metric:
    """One recorded quantity: its key, unit, where it comes from, and its `nvidia-smi` twin.

    Attributes:
        name: str, the key (per-GPU metrics appear as `gpu{i}_<name>` in the timeline).
        unit: str, e.g. `"%"`, `"MiB"`, `"W"`.
        source: str, the library call that produces it (NVML or psutil).
        nvidia_smi: str or None, the equivalent `nvidia-smi` query, when there is one.
        description: str, what the number means.
    """

    name: str
    unit: str
    source: str
    nvidia_smi: str | None
    description: str


GPU_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "util_pct",
            "%",
            "nvmlDeviceGetUtilizationRates().gpu",
            "--query-gpu=utilization.gpu",
            "Percent of the last sample period (1/6 s to 1 s, set by the driver) during which "
            "at least one kernel ran on the GPU.",
        ),
        Metric(
            "mem_util_pct",
            "%",
            "nvmlDeviceGetUtilizationRates().memory",
            "--query-gpu=utilization.memory",
            "Percent of the last sample period during which device memory was read or written.",
        ),
        Metric(
            "mem_used_mib",
            "MiB",
            "nvmlDeviceGetMemoryInfo().used",
            "--query-gpu=memory.used",
            "Device memory in use by all processes (and the driver).",
        ),
        Metric(
            "mem_total_mib",
            "MiB",
            "nvmlDeviceGetMemoryInfo().total",
            "--query-gpu=memory.total",
            "Installed device memory.",
        ),
        Metric(
            "proc_mem_mib",
            "MiB",
            "nvmlDeviceGetComputeRunningProcesses()[pid == os.getpid()].usedGpuMemory",
            "--query-compute-apps=pid,used_memory (a per-process query, not --query-gpu)",
            "Device memory held by this process; 0 when NVML lists no context for it (also "
            "in containers whose PID namespace hides the host PID), NaN where the driver "
            "withholds it.",
        ),
        Metric(
            "power_w",
            "W",
            "nvmlDeviceGetPowerUsage() / 1000",
            "--query-gpu=power.draw",
            "Board power draw.",
        ),
        Metric(
            "power_limit_w",
            "W",
            "nvmlDeviceGetEnforcedPowerLimit() / 1000",
            "--query-gpu=enforced.power.limit",
            "Power limit the driver enforces; the GPU slows its clocks to stay under it.",
        ),
        Metric(
            "temp_c",
            "°C",
            "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
            "--query-gpu=temperature.gpu",
            "GPU core temperature.",
        ),
        Metric(
            "sm_clock_mhz",
            "MHz",
            "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
            "--query-gpu=clocks.sm",
            "Current streaming-multiprocessor clock.",
        ),
        Metric(
            "throttle_reasons",
            "bitmask",
            "nvmlDeviceGetCurrentClocksEventReasons() (older drivers: "
            "nvmlDeviceGetCurrentClocksThrottleReasons())",
            "--query-gpu=clocks_event_reasons.active (older: clocks_throttle_reasons.active)",
            "Why clocks are below their maximum, as NVML's bitmask: 0x1 idle, 0x4 software "
            "power cap, 0x8 hardware slowdown, 0x20 software thermal, 0x40 hardware thermal, "
            "0x80 power brake. 0 means full speed.",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it at the moment of the query.

    Attributes:
        index: int, the NVML index (PCI bus order; not necessarily CUDA's or TensorFlow's).
        name: str, the product name, e.g. `"NVIDIA A100-SXM4-80GB"`.
        uuid: str, e.g. `"GPU-1a2b..."`; what `CUDA_VISIBLE_DEVICES` may name.
        pci_bus_id: str, e.g. `"00000000:07:00.0"`.
        memory_total_mib: float, installed memory (`nvidia-smi --query-gpu=memory.total`).
        memory_used_mib: float, memory in use (`--query-gpu=memory.used`).
        compute_capability: tuple or None, e.g. `(8, 0)`; None when NVML cannot tell.
        utilization_pct: float, `--query-gpu=utilization.gpu`; NaN if unsupported.
    """

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: float
    memory_used_mib: float
    compute_capability: tuple[int, int] | None
    utilization_pct: float


@dataclasses.dataclass(frozen=True)
class NvmlInventory:
    """What NVML says about the machine; `available=False` (with `error`) when it cannot.

    Attributes:
        available: bool, whether NVML could be loaded and queried.
        error: str or None, why not, with the hint that NVML ships with the NVIDIA driver.
        driver_version: str or None, e.g. `"550.54.15"`.
        cuda_driver_version: str or None, the newest CUDA the driver supports, e.g. `"12.4"`.
        gpus: list of `GpuInfo`, every GPU on the machine in NVML order, whatever
            `CUDA_VISIBLE_DEVICES` says (see `visible_gpus` for this process's share).
    """

    available: bool
    error: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: list[GpuInfo] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the inventory."""
        return dataclasses.asdict(self)


def _decode(value: Any) -> str:
    """Text of a value or an exception; never raises (a binding's `__str__` may)."""
    try:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    except Exception:
        return type(value).__name__


def _import_pynvml() -> tuple[ModuleType | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, f"The `pynvml` module is not installed. {NVML_HINT}"
    except Exception as e:  # a broken install raising anything at import
        return None, f"The `pynvml` module failed to import ({type(e).__name__}: {e}). {NVML_HINT}"
    return pynvml, None


def _start(nv: ModuleType) -> str | None:
    """Initializes NVML (reference counted by NVML itself); returns an error text or None."""
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError, or OSError from a broken library
        return f"NVML could not be initialized ({_decode(e) or type(e).__name__}). {NVML_HINT}"
    return None


def _stop(nv: ModuleType) -> None:
    try:
        nv.nvmlShutdown()
    except Exception:  # nothing useful to do about a failed shutdown
        pass


def _call(fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    try:
        return fn(*args)
    except Exception:
        return default


def _format_cuda_version(version: int | None) -> str | None:
    if not version:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def _gpu_info(nv: ModuleType, index: int, handle: Any) -> GpuInfo:
    memory = _call(nv.nvmlDeviceGetMemoryInfo, handle)
    util = _call(nv.nvmlDeviceGetUtilizationRates, handle)
    pci = _call(nv.nvmlDeviceGetPciInfo, handle)
    cc = _call(nv.nvmlDeviceGetCudaComputeCapability, handle)
    bus_id = ""
    if pci is not None:
        bus_id = _decode(getattr(pci, "busId", b"") or getattr(pci, "busIdLegacy", b""))
    return GpuInfo(
        index=index,
        name=_decode(_call(nv.nvmlDeviceGetName, handle, default="unknown")),
        uuid=_decode(_call(nv.nvmlDeviceGetUUID, handle, default="")),
        pci_bus_id=bus_id,
        memory_total_mib=memory.total / _MIB if memory is not None else _NAN,
        memory_used_mib=memory.used / _MIB if memory is not None else _NAN,
        compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
        utilization_pct=float(util.gpu) if util is not None else _NAN,
    )


def inventory() -> NvmlInventory:
    """Lists the machine's GPUs through NVML, without touching CUDA or TensorFlow.

    Never raises: where NVML is missing or broken, the result has `available=False` and an
    `error` that says why and how to fix it.

    Returns:
        A `NvmlInventory`.

    Example:

    ```python
    inv = tfgpu.monitor.nvml.inventory()
    for gpu in inv.gpus:
        print(gpu.index, gpu.name, gpu.memory_total_mib)
    ```
    """
    nv, error = _import_pynvml()
    if nv is None:
        return NvmlInventory(False, error, None, None, [])
    error = _start(nv)
    if error is not None:
        return NvmlInventory(False, error, None, None, [])
    try:
        driver = _call(nv.nvmlSystemGetDriverVersion)
        cuda = _call(nv.nvmlSystemGetCudaDriverVersion)
        gpus = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except Exception as e:  # a lost or inaccessible GPU: list the others
                _log.warning("NVML cannot open GPU %d (%s); it is left out.", index, _decode(e))
                continue
            gpus.append(_gpu_info(nv, index, handle))
        return NvmlInventory(
            True,
            None,
            _decode(driver) if driver is not None else None,
            _format_cuda_version(cuda),
            gpus,
        )
    except Exception as e:
        return NvmlInventory(False, f"NVML query failed ({_decode(e)}). {NVML_HINT}", None, None)
    finally:
        _stop(nv)


class _GpuIds(Protocol):
    """What `visible_gpus` reads of a GPU: a `GpuInfo`, or anything with these two ids."""

    @property
    def uuid(self) -> str: ...

    @property
    def pci_bus_id(self) -> str: ...


_G = TypeVar("_G", bound=_GpuIds)

_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def _parse_pci(bus_id: str) -> tuple[int, int, int, int] | None:
    match = _PCI.match(bus_id.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function or "0", 16)


def _match_token(token: str, gpus: Sequence[_G]) -> _G | None:
    if re.fullmatch(r"[0-9]+", token):  # ASCII digits only, as CUDA reads them
        position = int(token)
        return gpus[position] if position < len(gpus) else None
    if token.upper().startswith("GPU-"):
        hits = [g for g in gpus if g.uuid.lower().startswith(token.lower())]
        return hits[0] if len(hits) == 1 else None  # CUDA rejects ambiguous prefixes too
    pci = _parse_pci(token)
    if pci is not None:
        hits = [g for g in gpus if _parse_pci(g.pci_bus_id) == pci]
        return hits[0] if hits else None
    return None  # e.g. MIG-... instances: not mapped


def visible_gpus(gpus: Sequence[_G], cuda_visible_devices: str | None) -> list[_G]:
    """Maps `CUDA_VISIBLE_DEVICES` onto NVML's GPUs, in the order this process sees them.

    Position `i` of the result is the GPU that CUDA, and so TensorFlow's `/GPU:i`, calls `i`.
    Entries may be UUIDs (`GPU-1a2b...`, a unique prefix is enough), PCI bus ids
    (`0000:3b:00.0`) or indices. Indices follow NVML's PCI-bus order, which is CUDA's order
    when `CUDA_DEVICE_ORDER=PCI_BUS_ID` (and on machines with identical GPUs). As CUDA does,
    parsing stops at the first entry that names no GPU, and repeats are dropped.

    Args:
        gpus: sequence of `GpuInfo`, all GPUs in NVML order (`inventory().gpus`).
        cuda_visible_devices: str or None, the variable's value; None means unset (all GPUs).

    Returns:
        The list of `GpuInfo` this process uses.

    Example:

    >>> [g.index for g in visible_gpus(inventory().gpus, "1,0")]  # on a 2-GPU machine
    [1, 0]
    """
    if cuda_visible_devices is None:
        return list(gpus)
    selected: list[_G] = []
    for raw in cuda_visible_devices.split(","):
        token = raw.strip()
        gpu = _match_token(token, gpus) if token else None
        if gpu is None:
            break
        if gpu not in selected:
            selected.append(gpu)
    return selected


class _GpuReader:
    """Reads one GPU's `GPU_METRICS` in the sampler thread; never raises.

    A query the GPU does not support is never asked again and reads NaN. Other failures (a
    lost GPU, a driver reload) read NaN, are logged once per (GPU, error kind), and are
    retried at the next sample.
    """

    def __init__(self, nv: ModuleType, gpu: GpuInfo, position: int, pid: int | None = None):
        self._nv = nv
        self._gpu = gpu
        self._position = position
        self._pid = os.getpid() if pid is None else pid
        self._handle: Any = None
        self._unsupported: set[str] = set()
        self._reported: set[str] = set()
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons_fn = reasons or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self._queries: list[tuple[str, tuple[str, ...], Callable[[Any], tuple[float, ...]]]] = [
            ("utilization", ("util_pct", "mem_util_pct"), self._utilization),
            ("memory", ("mem_used_mib", "mem_total_mib"), self._memory),
            ("processes", ("proc_mem_mib",), self._process_memory),
            ("power", ("power_w",), self._power),
            ("power_limit", ("power_limit_w",), self._power_limit),
            ("temperature", ("temp_c",), self._temperature),
            ("sm_clock", ("sm_clock_mhz",), self._sm_clock),
            ("throttle_reasons", ("throttle_reasons",), self._throttle_reasons),
        ]

    def _utilization(self, h: Any) -> tuple[float, ...]:
        rates = self._nv.nvmlDeviceGetUtilizationRates(h)
        return float(rates.gpu), float(rates.memory)

    def _memory(self, h: Any) -> tuple[float, ...]:
        info = self._nv.nvmlDeviceGetMemoryInfo(h)
        return info.used / _MIB, info.total / _MIB

    def _process_memory(self, h: Any) -> tuple[float, ...]:
        total = 0.0
        for proc in self._nv.nvmlDeviceGetComputeRunningProcesses(h):
            if proc.pid == self._pid:
                used = proc.usedGpuMemory
                if used is None:
                    return (_NAN,)
                total += used / _MIB
        return (total,)

    def _power(self, h: Any) -> tuple[float, ...]:
        return (self._nv.nvmlDeviceGetPowerUsage(h) / 1000.0,)

    def _power_limit(self, h: Any) -> tuple[float, ...]:
        return (self._nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,)

    def _temperature(self, h: Any) -> tuple[float, ...]:
        return (float(self._nv.nvmlDeviceGetTemperature(h, self._nv.NVML_TEMPERATURE_GPU)),)

    def _sm_clock(self, h: Any) -> tuple[float, ...]:
        return (float(self._nv.nvmlDeviceGetClockInfo(h, self._nv.NVML_CLOCK_SM)),)

    def _throttle_reasons(self, h: Any) -> tuple[float, ...]:
        if self._reasons_fn is None:
            raise self._nv.NVMLError(self._nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        return (float(self._reasons_fn(h)),)

    def _is_not_supported(self, error: Exception) -> bool:
        codes = {
            getattr(self._nv, "NVML_ERROR_NOT_SUPPORTED", 3),
            getattr(self._nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
        }
        return getattr(error, "value", None) in codes

    def _report(self, kind: str, metrics: Sequence[str], error: Exception) -> None:
        if kind in self._reported:
            return
        self._reported.add(kind)
        _log.warning(
            "tfgpu.monitor: GPU %d (%s, NVML index %d): NVML error %r reading %s; recorded as "
            "NaN and retried each sample while training goes on. (Logged once.)",
            self._position,
            self._gpu.name,
            self._gpu.index,
            _decode(error) or type(error).__name__,
            ", ".join(metrics),
        )

    def read(self) -> list[float]:
        """Returns the values of `GPU_METRICS`, in that order; NaN where unavailable."""
        if self._handle is None:
            try:
                self._handle = self._nv.nvmlDeviceGetHandleByIndex(self._gpu.index)
            except Exception as e:
                self._report(type(e).__name__, list(GPU_METRICS), e)
                return [_NAN] * len(GPU_METRICS)
        values: list[float] = []
        for query, metrics, fn in self._queries:
            if query in self._unsupported:
                values.extend([_NAN] * len(metrics))
                continue
            try:
                values.extend(fn(self._handle))
            except Exception as e:
                values.extend([_NAN] * len(metrics))
                if self._is_not_supported(e):
                    self._unsupported.add(query)
                    _log.info(
                        "tfgpu.monitor: GPU %d does not support %s; recorded as NaN.",
                        self._position,
                        ", ".join(metrics),
                    )
                else:
                    self._report(type(e).__name__, metrics, e)
        return values


def _open_readers(gpus: Sequence[GpuInfo]) -> tuple[ModuleType | None, list[_GpuReader]]:
    """Starts NVML for a sampling session; returns the module (to stop later) and readers."""
    if not gpus:
        return None, []
    nv, _ = _import_pynvml()
    if nv is None or _start(nv) is not None:
        return None, []
    return nv, [_GpuReader(nv, gpu, position) for position, gpu in enumerate(gpus)]


def _close_readers(nv: ModuleType | None) -> None:
    if nv is not None:
        _stop(nv)
