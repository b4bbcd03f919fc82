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
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol, TypeVar

_log = logging.getLogger(__name__)

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
            "nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2).used (drivers without "
            "nvmlDeviceGetMemoryInfo_v2: nvmlDeviceGetMemoryInfo().used)",
            "--query-gpu=memory.used",
            "Device memory in use by all processes, without the memory the driver reserves "
            "(as recent nvidia-smi); with the older struct, reserved memory counts as used "
            "(about 0.5 GiB more on H-class GPUs).",
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
            "nvmlDeviceGetComputeRunningProcesses()[pid == os.getpid()].usedGpuMemory "
            "(drivers without the _v3 call: nvmlDeviceGetComputeRunningProcesses_v2)",
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
        Metric(
            "sm_active_pct",
            "%",
            "GPM NVML_GPM_METRIC_SM_UTIL",
            "dcgmi dmon -e 1002 (DCGM_FI_PROF_SM_ACTIVE)",
            "Share of SMs busy, averaged over the time between two GPM samples (at least "
            "0.1 s); Hopper or newer, NaN elsewhere. A single-thread kernel shows 100% "
            "util_pct but about 1% here.",
        ),
        Metric(
            "sm_occupancy_pct",
            "%",
            "GPM NVML_GPM_METRIC_SM_OCCUPANCY",
            "dcgmi dmon -e 1003 (DCGM_FI_PROF_SM_OCCUPANCY)",
            "Resident warps as a share of the SMs' maximum, same window; Hopper or newer.",
        ),
        Metric(
            "tensor_active_pct",
            "%",
            "GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL",
            "dcgmi dmon -e 1004 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
            "Share of time the SMs' tensor cores were busy (any precision), same window; "
            "near 0 when float32 matmuls run without TF32 or bf16/fp16; Hopper or newer.",
        ),
        Metric(
            "fp16_active_pct",
            "%",
            "GPM NVML_GPM_METRIC_FP16_UTIL",
            "dcgmi dmon -e 1008 (DCGM_FI_PROF_PIPE_FP16_ACTIVE)",
            "Share of time the SMs did non-tensor FP16 math, same window; Hopper or newer.",
        ),
        Metric(
            "fp32_active_pct",
            "%",
            "GPM NVML_GPM_METRIC_FP32_UTIL",
            "dcgmi dmon -e 1007 (DCGM_FI_PROF_PIPE_FP32_ACTIVE)",
            "Share of time the SMs did non-tensor FP32 math, same window; Hopper or newer.",
        ),
        Metric(
            "dram_active_pct",
            "%",
            "GPM NVML_GPM_METRIC_DRAM_BW_UTIL",
            "dcgmi dmon -e 1005 (DCGM_FI_PROF_DRAM_ACTIVE)",
            "Device-memory bandwidth used, as a share of the maximum, same window; Hopper "
            "or newer.",
        ),
        Metric(
            "pcie_tx_mib_s",
            "MiB/s",
            "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC; else nvmlDeviceGetFieldValues("
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES) (byte counter: difference / time between "
            "samples); else nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) (KB/s over "
            "20 ms, read at most once a second, carried between reads)",
            "nvidia-smi dmon -s t (txpci); DCGM_FI_PROF_PCIE_TX_BYTES (1009)",
            "PCIe traffic out of the GPU (device to host and peers), MiB per second.",
        ),
        Metric(
            "pcie_rx_mib_s",
            "MiB/s",
            "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC; else nvmlDeviceGetFieldValues("
            "NVML_FI_DEV_PCIE_COUNT_RX_BYTES); else "
            "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES), as for TX",
            "nvidia-smi dmon -s t (rxpci); DCGM_FI_PROF_PCIE_RX_BYTES (1010)",
            "PCIe traffic into the GPU (host-to-device copies: input batches), MiB per second.",
        ),
        Metric(
            "energy_j",
            "J",
            "nvmlDeviceGetTotalEnergyConsumption() / 1000 (mJ since the driver loaded)",
            "--query-gpu=total_energy_consumption (dcgmi: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "
            "156)",
            "Energy the GPU used since the driver loaded, cumulative: the difference between "
            "two rows is the energy in between. Volta or newer.",
        ),
        Metric(
            "proc_sm_util_pct",
            "%",
            "nvmlDeviceGetProcessUtilization(h, last_seen)[pid == os.getpid()].smUtil",
            "nvidia-smi pmon -s u (sm)",
            "This process's share of the time kernels ran (NVML's per-process utilization, "
            "the mean of the driver's samples since the previous row); 0 when NVML has no "
            "sample for this PID (idle, or a container hiding the host PID).",
        ),
    )
}

GPM_METRICS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("fp16_active_pct", "NVML_GPM_METRIC_FP16_UTIL"),
    ("fp32_active_pct", "NVML_GPM_METRIC_FP32_UTIL"),
    ("dram_active_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    ("pcie_tx_mib_s", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    ("pcie_rx_mib_s", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
)
"""The GPM metrics read, with the NVML constant of each (the last two feed the PCIe columns)."""

GPM_MIN_PERIOD = 0.1
"""Seconds between two GPM samples at the least (NVML needs 100 ms between them); with a
shorter sampling interval GPM values are computed every 0.1 s and carried in between."""

PCIE_THROUGHPUT_PERIOD = 1.0
"""Seconds between two reads of one `nvmlDeviceGetPcieThroughput` counter at the least (each
blocks about 20 ms), used only where neither GPM nor the PCIe byte-counter field values work.
All GPUs together make at most one such call per `PCIE_THROUGHPUT_PERIOD / (2 * GPUs)` s, so
with many GPUs each counter is refreshed less often (8 GPUs at 0.2 s: every 3.2 s)."""


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


def _memory_v2(nv: ModuleType, handle: Any) -> Any:
    """`nvmlDeviceGetMemoryInfo` with the v2 struct (used without reserved memory, as
    `nvidia-smi`); raises `TypeError`/`AttributeError` with a binding that lacks it."""
    return nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)


def _memory_info(nv: ModuleType, handle: Any) -> Any:
    """The memory struct as `nvidia-smi` reports it where the driver allows, else v1."""
    try:
        return _memory_v2(nv, handle)
    except Exception:
        return _call(nv.nvmlDeviceGetMemoryInfo, handle)


def _gpu_info(nv: ModuleType, index: int, handle: Any) -> GpuInfo:
    memory = _memory_info(nv, handle)
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


@dataclasses.dataclass
class _BlockingCalls:
    """Shared by a session's readers: when the next blocking NVML call may be made."""

    spacing: float
    next_call: float = -math.inf
    served: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)


def _error_code(nv: ModuleType, name: str, default: int) -> int:
    value = getattr(nv, name, default)
    return value if isinstance(value, int) else default


class _GpuReader:
    """Reads one GPU's `GPU_METRICS` in the sampler thread; never raises.

    A query the GPU does not support is never asked again and reads NaN (noted once at INFO).
    Other failures (a lost GPU, a driver reload) read NaN, are logged once per (GPU, error
    kind), and are retried at the next sample. Where a newer NVML call is missing from the
    driver, the older one is used: `...ClocksThrottleReasons` for `...ClocksEventReasons`,
    `nvmlDeviceGetComputeRunningProcesses_v2` for the unversioned (v3) call, the v1 memory
    struct for `nvmlDeviceGetMemoryInfo_v2`.

    GPM (Hopper and newer) takes one `nvmlGpmSampleGet` per read, into one of two samples
    allocated once (freed by `close()`), and computes the metrics between the previous
    sample and this one; reads closer than `GPM_MIN_PERIOD` carry the last values.
    """

    def __init__(
        self,
        nv: ModuleType,
        gpu: GpuInfo,
        position: int,
        pid: int | None = None,
        clock: Callable[[], float] | None = None,
        blocking: _BlockingCalls | None = None,
    ):
        self._nv = nv
        self._gpu = gpu
        self._position = position
        self._pid = os.getpid() if pid is None else pid
        self._clock: Callable[[], float] = clock or time.monotonic
        self._handle: Any = None
        self._unsupported: set[str] = set()
        self._reported: set[str] = set()
        self._noted: set[str] = set()
        self._not_supported = _error_code(nv, "NVML_ERROR_NOT_SUPPORTED", 3)
        self._function_not_found = _error_code(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        self._not_found = _error_code(nv, "NVML_ERROR_NOT_FOUND", 6)
        self._in_use = _error_code(nv, "NVML_ERROR_IN_USE", 19)
        # Driver generations: the newest call first, the older one once the driver says so.
        self._reasons_names = [
            n
            for n in (
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrentClocksThrottleReasons",
            )
            if callable(getattr(nv, n, None))
        ]
        self._process_names = [
            n
            for n in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetComputeRunningProcesses_v2",
            )
            if callable(getattr(nv, n, None))
        ]
        self._memory_v2 = hasattr(nv, "nvmlMemory_v2")
        # GPM state: None undecided, True on, False off for good.
        self._gpm: bool | None = None
        self._gpm_samples: list[Any] = []
        self._gpm_request: Any = None
        self._gpm_ids: list[int] = []
        self._gpm_prev: int | None = None  # index in _gpm_samples of the previous sample
        self._gpm_tried = -math.inf  # clock of the last nvmlGpmSampleGet attempt
        self._gpm_values = [_NAN] * len(GPM_METRICS)
        self._gpm_pcie_ok = False  # whether GPM gave PCIe rates at its last read
        # PCIe fallbacks: byte-counter field values, then the blocking throughput call.
        self._fields_ok: bool | None = None
        self._fields_prev: tuple[float, float, float] | None = None  # (time s, tx, rx bytes)
        self._throughput: list[float] = [_NAN, _NAN]
        self._blocking = blocking or _BlockingCalls(PCIE_THROUGHPUT_PERIOD / 2)
        self._proc_last_ts = 0
        self._proc_value = _NAN
        self._proc_seen = -math.inf
        self._queries: list[tuple[str, tuple[str, ...], Callable[[Any], tuple[float, ...]]]] = [
            ("utilization", ("util_pct", "mem_util_pct"), self._utilization),
            ("memory", ("mem_used_mib", "mem_total_mib"), self._memory),
            ("processes", ("proc_mem_mib",), self._process_memory),
            ("power", ("power_w",), self._power),
            ("power_limit", ("power_limit_w",), self._power_limit),
            ("temperature", ("temp_c",), self._temperature),
            ("sm_clock", ("sm_clock_mhz",), self._sm_clock),
            ("throttle_reasons", ("throttle_reasons",), self._throttle_reasons),
            ("gpm", tuple(name for name, _ in GPM_METRICS[:6]), self._gpm_read),
            ("pcie", ("pcie_tx_mib_s", "pcie_rx_mib_s"), self._pcie),
            ("energy", ("energy_j",), self._energy),
            ("process_utilization", ("proc_sm_util_pct",), self._process_utilization),
        ]

    # ------------------------------------------------------------- helpers
    def _code(self, error: Exception) -> Any:
        return getattr(error, "value", None)

    def _note(self, key: str, message: str, *args: Any) -> None:
        """Logs `message` at INFO once per reader and key (an unsupported metric, a fallback)."""
        if key not in self._noted:
            self._noted.add(key)
            _log.info(
                "tfgpu.monitor: GPU %d (%s): " + message, self._position, self._gpu.name, *args
            )

    def _newest(self, names: list[str], h: Any) -> Any:
        """Calls the first of `names` the driver exports, dropping those it does not."""
        mismatch = getattr(self._nv, "NVMLLibraryMismatchError", None)
        while names:
            try:
                return getattr(self._nv, names[0])(h)
            except Exception as e:
                older = len(names) > 1 and (
                    self._code(e) == self._function_not_found
                    or (isinstance(mismatch, type) and isinstance(e, mismatch))
                )
                if not older:
                    raise
                self._note(names[0], "the driver lacks %s; using %s.", names[0], names[1])
                del names[0]
        raise self._nv.NVMLError(self._function_not_found)

    # ------------------------------------------------------------- queries
    def _utilization(self, h: Any) -> tuple[float, ...]:
        rates = self._nv.nvmlDeviceGetUtilizationRates(h)
        return float(rates.gpu), float(rates.memory)

    def _memory(self, h: Any) -> tuple[float, ...]:
        if self._memory_v2:
            try:
                info = _memory_v2(self._nv, h)
                return info.used / _MIB, info.total / _MIB
            except Exception as e:
                if not (
                    isinstance(e, (TypeError, AttributeError))
                    or self._code(e)
                    in (
                        self._function_not_found,
                        self._not_supported,
                        _error_code(self._nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
                    )
                ):
                    raise
                self._memory_v2 = False
                self._note(
                    "memory_v2",
                    "nvmlDeviceGetMemoryInfo_v2 unavailable (%s); mem_used_mib counts reserved "
                    "memory as used (the v1 struct), unlike recent nvidia-smi.",
                    _decode(e) or type(e).__name__,
                )
        info = self._nv.nvmlDeviceGetMemoryInfo(h)
        return info.used / _MIB, info.total / _MIB

    def _process_memory(self, h: Any) -> tuple[float, ...]:
        total = 0.0
        for proc in self._newest(self._process_names, h):
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
        return (float(self._newest(self._reasons_names, h)),)

    def _energy(self, h: Any) -> tuple[float, ...]:
        return (self._nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,)

    def _process_utilization(self, h: Any) -> tuple[float, ...]:
        now = self._clock()
        try:
            samples = self._nv.nvmlDeviceGetProcessUtilization(h, self._proc_last_ts)
        except Exception as e:
            if self._code(e) != self._not_found:
                raise
            # No sample newer than the last one: carry it for a second, then idle.
            return (self._proc_value if now - self._proc_seen < 1.0 else 0.0,)
        mine = []
        for sample in samples:
            self._proc_last_ts = max(self._proc_last_ts, int(sample.timeStamp))
            if sample.pid == self._pid:
                mine.append(float(sample.smUtil))
        self._proc_value = math.fsum(mine) / len(mine) if mine else 0.0
        self._proc_seen = now
        return (self._proc_value,)

    # ------------------------------------------------------------- GPM
    def _gpm_start(self, h: Any) -> bool:
        """Decides whether GPM works on this GPU; allocates its samples. True when on."""
        nv = self._nv
        needed = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet")
        if not all(callable(getattr(nv, n, None)) for n in needed) or not hasattr(
            nv, "c_nvmlGpmMetricsGet_t"
        ):
            self._gpm_off("this nvidia-ml-py has no GPM calls (pip install -U nvidia-ml-py)")
            return False
        try:
            support = nv.nvmlGpmQueryDeviceSupport(h)
        except Exception as e:
            if self._code(e) in (self._not_supported, self._function_not_found):
                self._gpm_off(f"the driver does not offer GPM ({_decode(e)})")
                return False
            raise
        if not support.isSupportedDevice:
            self._gpm_off("GPM not supported on this GPU (Hopper or newer needed)")
            return False
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        ids = [getattr(nv, constant, None) for _, constant in GPM_METRICS]
        self._gpm_ids = [i if isinstance(i, int) else -1 for i in ids]
        request.numMetrics = len(GPM_METRICS)
        for k, metric_id in enumerate(self._gpm_ids):
            request.metrics[k].metricId = max(metric_id, 0)
        self._gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        self._gpm_request = request
        self._gpm = True
        return True

    def _gpm_off(self, why: str) -> None:
        self._gpm = False
        self._gpm_values = [_NAN] * len(GPM_METRICS)
        self._gpm_pcie_ok = False
        self._note(
            "gpm",
            "%s: sm/tensor/dram activity not recorded (NaN); PCIe rates come from other "
            "counters where the driver has them.",
            why,
        )
        self._free_gpm()

    def _gpm_read(self, h: Any) -> tuple[float, ...]:
        if self._gpm is False:
            return tuple(self._gpm_values[:6])
        now = self._clock()
        if now - self._gpm_tried < GPM_MIN_PERIOD:
            return tuple(self._gpm_values[:6])  # NVML needs 100 ms between samples: carry
        self._gpm_tried = now
        if self._gpm is None and not self._gpm_start(h):
            return tuple(self._gpm_values[:6])
        current = 0 if self._gpm_prev != 0 else 1
        try:
            self._nv.nvmlGpmSampleGet(h, self._gpm_samples[current])
        except Exception as e:
            self._gpm_prev = None  # the next metrics need two fresh samples
            self._gpm_values = [_NAN] * len(GPM_METRICS)
            self._gpm_pcie_ok = False
            if self._code(e) == self._not_supported:
                self._gpm_off(f"GPM sampling is not supported here ({_decode(e)})")
            elif self._code(e) == self._in_use:
                self._report(
                    "gpm-in-use",
                    [n for n, _ in GPM_METRICS],
                    e,
                    "the GPM counters are in use (another profiler: DCGM, Nsight, "
                    "nvidia-smi dmon?); retried every 0.1 s",
                )
            else:
                raise
            return tuple(self._gpm_values[:6])
        previous, self._gpm_prev = self._gpm_prev, current
        if previous is None:
            return tuple(self._gpm_values[:6])  # the first sample: values come at the next
        request = self._gpm_request
        request.sample1 = self._gpm_samples[previous]
        request.sample2 = self._gpm_samples[current]
        try:
            self._nv.nvmlGpmMetricsGet(request)
        except Exception:
            self._gpm_values = [_NAN] * len(GPM_METRICS)
            self._gpm_pcie_ok = False
            raise
        values = []
        success = getattr(self._nv, "NVML_SUCCESS", 0)
        for k, (name, constant) in enumerate(GPM_METRICS):
            metric = request.metrics[k]
            if self._gpm_ids[k] >= 0 and metric.nvmlReturn == success:
                values.append(float(metric.value))
            else:
                values.append(_NAN)
                self._note(f"gpm:{name}", "GPM metric %s not supported; %s is NaN.", constant, name)
        self._gpm_values = values
        self._gpm_pcie_ok = all(v == v for v in values[6:])
        return tuple(values[:6])

    def _free_gpm(self) -> None:
        samples, self._gpm_samples = self._gpm_samples, []
        self._gpm_prev = None
        for sample in samples:
            try:
                self._nv.nvmlGpmSampleFree(sample)
            except Exception:  # nothing useful to do about a failed free at shutdown
                pass

    # ------------------------------------------------------------- PCIe
    def _pcie(self, h: Any) -> tuple[float, ...]:
        if self._gpm and self._gpm_pcie_ok:
            return self._gpm_values[6], self._gpm_values[7]
        if self._fields_ok is not False:
            values = self._pcie_fields(h)
            if values is not None:
                return values
        return self._pcie_throughput(h)

    def _pcie_fields(self, h: Any) -> tuple[float, float] | None:
        """PCIe rates from the byte counters (non-blocking); None when the driver lacks them."""
        nv = self._nv
        ids = (
            getattr(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", None),
            getattr(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", None),
        )
        if not callable(getattr(nv, "nvmlDeviceGetFieldValues", None)) or None in ids:
            self._fields_ok = False
            return None
        try:
            values = nv.nvmlDeviceGetFieldValues(h, list(ids))
        except Exception as e:
            if self._code(e) in (self._not_supported, self._function_not_found):
                self._fields_ok = False
                self._note(
                    "fields",
                    "no PCIe byte counters (%s); trying nvmlDeviceGetPcieThroughput.",
                    _decode(e),
                )
                return None
            self._fields_prev = None
            raise
        success = getattr(nv, "NVML_SUCCESS", 0)
        returns = [values[k].nvmlReturn for k in range(2)]
        if any(r == self._not_supported for r in returns):
            self._fields_ok = False
            self._note(
                "fields",
                "no PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES not supported); "
                "trying nvmlDeviceGetPcieThroughput.",
            )
            return None
        if any(r != success for r in returns):
            self._fields_prev = None
            return _NAN, _NAN
        self._fields_ok = True
        stamp = values[0].timestamp / 1e6 if values[0].timestamp > 0 else self._clock()
        current = (stamp, float(values[0].value.ullVal), float(values[1].value.ullVal))
        previous, self._fields_prev = self._fields_prev, current
        if previous is None or current[0] <= previous[0]:
            return _NAN, _NAN
        seconds = current[0] - previous[0]
        rates = [(current[k] - previous[k]) / seconds / _MIB for k in (1, 2)]
        return tuple(r if r >= 0 else _NAN for r in rates)  # type: ignore[return-value]

    def _pcie_throughput(self, h: Any) -> tuple[float, ...]:
        """`nvmlDeviceGetPcieThroughput` (blocks ~20 ms): at most one call per read, the
        session's readers taking turns (least recently read counter first), at most one call
        per `PCIE_THROUGHPUT_PERIOD / (2 * GPUs)` s, each counter at most once per
        `PCIE_THROUGHPUT_PERIOD`; values are carried in between."""
        shared = self._blocking
        mine = ((self._position, 0), (self._position, 1))
        for key in mine:
            shared.served.setdefault(key, -math.inf)
        now = self._clock()
        if now < shared.next_call:
            return tuple(self._throughput)
        oldest = min(shared.served, key=lambda key: shared.served[key])
        if oldest not in mine or now - shared.served[oldest] < PCIE_THROUGHPUT_PERIOD:
            return tuple(self._throughput)
        shared.next_call = now + shared.spacing
        shared.served[oldest] = now
        k = oldest[1]
        counter = (
            getattr(self._nv, "NVML_PCIE_UTIL_TX_BYTES", 0)
            if k == 0
            else getattr(self._nv, "NVML_PCIE_UTIL_RX_BYTES", 1)
        )
        try:
            kb_s = self._nv.nvmlDeviceGetPcieThroughput(h, counter)
        except Exception as e:
            self._throughput[k] = _NAN
            if self._is_not_supported(e):
                for key in mine:  # never asked again: leave the turns to the others
                    shared.served.pop(key, None)
            raise
        self._throughput[k] = kb_s / 1024.0  # KB/s (NVML's KB are 1024 bytes) to MiB/s
        return tuple(self._throughput)

    # ------------------------------------------------------------- reading
    def _is_not_supported(self, error: Exception) -> bool:
        return self._code(error) in (self._not_supported, self._function_not_found)

    def _report(self, kind: str, metrics: Sequence[str], error: Exception, what: str = "") -> None:
        if kind in self._reported:
            return
        self._reported.add(kind)
        _log.warning(
            "tfgpu.monitor: GPU %d (%s, NVML index %d): NVML error %r reading %s%s; recorded as "
            "NaN and retried each sample while training goes on. (Logged once.)",
            self._position,
            self._gpu.name,
            self._gpu.index,
            _decode(error) or type(error).__name__,
            ", ".join(metrics),
            f" ({what})" if what else "",
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

    def close(self) -> None:
        """Frees the GPM samples (before `nvmlShutdown`). Never raises."""
        self._free_gpm()


def _open_readers(
    gpus: Sequence[GpuInfo], clock: Callable[[], float] | None = None
) -> tuple[ModuleType | None, list[_GpuReader]]:
    """Starts NVML for a sampling session; returns the module (to stop later) and readers."""
    if not gpus:
        return None, []
    nv, _ = _import_pynvml()
    if nv is None or _start(nv) is not None:
        return None, []
    blocking = _BlockingCalls(PCIE_THROUGHPUT_PERIOD / (2 * len(gpus)))
    return nv, [
        _GpuReader(nv, gpu, position, clock=clock, blocking=blocking)
        for position, gpu in enumerate(gpus)
    ]


def _close_readers(nv: ModuleType | None, readers: Sequence[_GpuReader] = ()) -> None:
    for reader in readers:
        reader.close()
    if nv is not None:
        _stop(nv)
