"""A scripted stand-in for the `pynvml` module (nvidia-ml-py), for tests without a GPU.

Build one with `make(...)` and install it where `import pynvml` finds it:

```python
from tests import fake_pynvml

fake = fake_pynvml.make([fake_pynvml.FakeGpu(), fake_pynvml.FakeGpu(util=lambda: 99.0)])
monkeypatch.setitem(sys.modules, "pynvml", fake)   # NVML with two GPUs
monkeypatch.setitem(sys.modules, "pynvml", None)   # the module missing: ImportError
fake_pynvml.make(library_missing=True)             # module there, libnvidia-ml.so is not
```

Scripting:
- every reading of a `FakeGpu` may be a value or a zero-argument callable (read per call);
- `FakeGpu.not_supported` names queries (e.g. `"nvmlDeviceGetPowerUsage"`) that raise
  `NVMLError_NotSupported`, as on GPUs without a power sensor;
- set `fake.gpus[i].lost = True` mid-run: every query of that GPU raises
  `NVMLError_GpuIsLost`, as after an Xid error; set it back to recover;
- `old_api=True` leaves out `nvmlDeviceGetCurrentClocksEventReasons` from the module (an old
  nvidia-ml-py); `old_driver=True` keeps every Python name but makes the functions a driver
  from before R535 does not export raise `NVMLError_FunctionNotFound`, as the real binding
  does (`driver_lacks=` names them one by one). The unversioned
  `nvmlDeviceGetComputeRunningProcesses` then raises `NVMLLibraryMismatchError`, which, as
  in nvidia-ml-py, is not an `NVMLError`.

NVML's conventions are kept, so a wrong call fails here as it would on a GPU:
- structs are the ctypes types of nvidia-ml-py (`c_nvmlGpmMetricsGet_t`, `c_nvmlFieldValue_t`,
  `c_nvmlMemory_v2_t`, ...), versioned ones checked (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH`);
- GPM (`FakeGpu.gpm`, a dict of metric values; None: a GPU before Hopper): samples are opaque
  pointers from `nvmlGpmSampleAlloc`, filled by `nvmlGpmSampleGet`, freed by
  `nvmlGpmSampleFree`; `nvmlGpmMetricsGet` wants two filled samples of the same GPU, in time
  order, more than 0.1 s apart on `fake.clock` (NVML: "greater than 100ms"), else
  `NVMLError_InvalidArgument`; `nvmlGpmSampleGet` takes `FakeGpu.gpm_sample_s` seconds
  through `fake.sleep` and stamps the sample at its end; a metric missing from the dict
  reports `NVML_ERROR_NOT_SUPPORTED` in its own `nvmlReturn`; `FakeGpu.gpm_busy` makes
  `nvmlGpmSampleGet` raise `NVMLError_InUse` (another profiler, e.g. DCGM or Nsight, holds
  the counters); `fake.gpm_live` counts samples not yet freed;
- `nvmlDeviceGetFieldValues` returns the PCIe byte counters (`FakeGpu.pcie_tx_bytes`) with a
  timestamp in microseconds of `fake.clock`; a field the driver lacks reports
  `NVML_ERROR_NOT_SUPPORTED` in its own `nvmlReturn`, and `FakeGpu.field_errors` (field id
  -> NVML error code) scripts any other per-field error (e.g. `NVML_ERROR_INVALID_ARGUMENT`);
  `nvmlDeviceGetPcieThroughput` returns KB/s and blocks `fake.pcie_throughput_block_s`
  (0.02 s) through `fake.sleep`;
- energy is in mJ since driver load; `nvmlDeviceGetProcessUtilization(h, ts)` raises
  `NVMLError_NotFound` when no sample is newer than `ts`;
- `nvmlDeviceGetMemoryInfo(h)` (v1) counts `memory_reserved_mib` as used,
  `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)` does not (as `nvidia-smi`).

Topologies (what links the GPUs, for `tfgpu.scaling()`):
- `FakeGpu.nvlinks`, a list of `FakeLink` (state, `nvmlNvlinkVersion_t` value, remote PCI bus,
  remote device type); link indices past the list raise `NVMLError_InvalidArgument` (as a
  driver does up to `NVML_NVLINK_MAX_LINKS`), and a GPU without any raises
  `NVMLError_NotSupported` (PCIe only); `nvswitch_links(n)` and `direct_links(n, to=bus)`
  build them, `machine(n, ...)` builds `n` GPUs with distinct buses;
- `FakeGpu.pcie_gen_max`/`pcie_width_max` (`nvmlDeviceGetMaxPcieLinkGeneration`/`Width`) and
  `pcie_gen_current`/`pcie_width_current` (`nvmlDeviceGetCurrPcieLink*`; None: the max);
- `make(topology=, p2p=)`: `nvmlDeviceGetTopologyCommonAncestor` and `nvmlDeviceGetP2PStatus`
  between GPU indices, one value for every pair or a dict `{(i, j): value}` (either order;
  pairs left out: `NVML_TOPOLOGY_HOSTBRIDGE`, `NVML_P2P_STATUS_OK`), also settable later as
  `fake.topology` / `fake.p2p`. As in nvidia-ml-py, `NVML_P2P_CAPS_INDEX_READ` is the tuple
  `(0,)` (a stray comma in pynvml.py) and `nvmlDeviceGetP2PStatus` refuses anything but an
  int index with `ctypes.ArgumentError`, as ctypes does.

Like NVML, queries before `nvmlInit()` (or after the matching `nvmlShutdown()`) raise
`NVMLError_Uninitialized`; `fake.calls` records `(function name, thread id)` of every call.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_HMMA_TENSOR_UTIL = 7
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1
nvmlMemory_v2 = 0x02000028
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_VERSION_INVALID = 0  # nvmlNvlinkVersion_t: an enum, not the generation
NVML_NVLINK_VERSION_1_0 = 1
NVML_NVLINK_VERSION_2_0 = 2
NVML_NVLINK_VERSION_2_2 = 3
NVML_NVLINK_VERSION_3_0 = 4
NVML_NVLINK_VERSION_3_1 = 5
NVML_NVLINK_VERSION_4_0 = 6
NVML_NVLINK_VERSION_5_0 = 7
NVML_NVLINK_VERSION_6_0 = 8
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50
NVML_P2P_CAPS_INDEX_READ = (0,)  # sic: nvidia-ml-py writes `= 0,`, a tuple
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_CAPS_INDEX_ATOMICS = 3
NVML_P2P_CAPS_INDEX_PCI = 4
NVML_P2P_CAPS_INDEX_PROP = 4
NVML_P2P_CAPS_INDEX_UNKNOWN = 5
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED = 1
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3
NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_P2P_STATUS_UNKNOWN = 6

GPM_METRIC_NAMES = {
    NVML_GPM_METRIC_SM_UTIL: "sm_util",
    NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: "any_tensor",
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL: "hmma_tensor",
    NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_bw",
    NVML_GPM_METRIC_FP64_UTIL: "fp64",
    NVML_GPM_METRIC_FP32_UTIL: "fp32",
    NVML_GPM_METRIC_FP16_UTIL: "fp16",
    NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx",
    NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx",
}
"""The GPM metrics the fake knows, by id: the keys of `FakeGpu.gpm`."""

OLD_DRIVER = frozenset(
    {
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleGet",
        "nvmlGpmSampleFree",
        "nvmlGpmMetricsGet",
        "field:197",
        "field:198",
    }
)
"""What a driver from before R535 lacks (C functions, and `field:<id>` field values)."""


# The ctypes structs of nvidia-ml-py, field for field.
class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlMemory_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlValue_t(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_nvmlProcessUtilizationSample_t(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class struct_c_nvmlGpmSample_t(ctypes.Structure):
    pass  # opaque handle


c_nvmlGpmSample_t = ctypes.POINTER(struct_c_nvmlGpmSample_t)


class c_metricInfo_t(ctypes.Structure):
    _fields_ = [
        ("shortName", ctypes.c_char_p),
        ("longName", ctypes.c_char_p),
        ("unit", ctypes.c_char_p),
    ]


class c_nvmlGpmMetric_t(ctypes.Structure):
    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", c_metricInfo_t),
    ]


class c_nvmlGpmMetricsGet_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", c_nvmlGpmSample_t),
        ("sample2", c_nvmlGpmSample_t),
        ("metrics", c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX),
    ]


class c_nvmlGpmSupport_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


class NVMLLibraryMismatchError(Exception):
    """As in nvidia-ml-py: NOT a subclass of `NVMLError`."""


_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_IN_USE: "Resource in use",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml's: `NVMLError(code)` builds the subclass for that code; `.value` is it."""

    _classes: dict[int, type] = {}

    def __new__(cls, value: int = NVML_ERROR_UNKNOWN):
        if cls is NVMLError:
            cls = NVMLError._classes.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int | None = None):
        super().__init__()

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, code: int) -> type:
    def new(cls, *args):
        return NVMLError.__new__(cls, code)

    cls = type(name, (NVMLError,), {"__new__": new})
    NVMLError._classes[code] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_InsufficientSize = _error_class(
    "NVMLError_InsufficientSize", NVML_ERROR_INSUFFICIENT_SIZE
)
NVMLError_InUse = _error_class("NVMLError_InUse", NVML_ERROR_IN_USE)
NVMLError_ArgumentVersionMismatch = _error_class(
    "NVMLError_ArgumentVersionMismatch", NVML_ERROR_ARGUMENT_VERSION_MISMATCH
)
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class(
    "NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND
)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

Value = float | Callable[[], float]


@dataclasses.dataclass
class FakeLink:
    """One NVLink of a `FakeGpu`. `remote_bus` None: `nvmlDeviceGetNvLinkRemotePciInfo`
    raises `NVMLError_NotSupported`; `remote_type` None: so does
    `nvmlDeviceGetNvLinkRemoteDeviceType` (a driver that cannot tell)."""

    version: int = NVML_NVLINK_VERSION_4_0  # nvmlNvlinkVersion_t (6 is NVLink 4.0)
    remote_bus: str | None = "00000000:A0:00.0"
    remote_type: int | None = NVML_NVLINK_DEVICE_TYPE_SWITCH
    active: bool = True


def nvswitch_links(
    count: int = 18, version: int = NVML_NVLINK_VERSION_4_0, **changes: Any
) -> list[FakeLink]:
    """`count` active links to NVSwitches (an HGX board: H100 has 18 NVLink 4 links)."""
    return [FakeLink(version=version, **changes) for _ in range(count)]


def direct_links(
    count: int, to: str, version: int = NVML_NVLINK_VERSION_4_0, **changes: Any
) -> list[FakeLink]:
    """`count` active links straight to the GPU on PCI bus `to` (a bridge, a DGX-1 mesh)."""
    fields: dict[str, Any] = {"remote_bus": to, "remote_type": NVML_NVLINK_DEVICE_TYPE_GPU}
    fields.update(changes)
    return [FakeLink(version=version, **fields) for _ in range(count)]


@dataclasses.dataclass
class FakeGpu:
    """One scripted GPU. Readings are values or zero-argument callables."""

    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    pci_bus_id: str = "00000000:07:00.0"
    memory_total_mib: Value = 81920.0
    memory_used_mib: Value = 1024.0
    compute_capability: tuple[int, int] = (8, 0)
    util: Value = 50.0
    mem_util: Value = 20.0
    power_w: Value = 250.0
    power_limit_w: Value = 400.0
    temp_c: Value = 60.0
    sm_clock_mhz: Value = 1410.0
    throttle_reasons: Value = 0
    processes: Sequence[tuple[int, float | None]] = ()  # (pid, used MiB or None)
    memory_reserved_mib: Value = 0.0  # counted as used by the v1 struct only
    energy_j: Value = 1000.0  # since driver load (NVML reports it in mJ)
    pcie_tx_bytes: Value = 0  # byte counters (field values 197/198)
    pcie_rx_bytes: Value = 0
    pcie_tx_kb_s: Value = 0.0  # nvmlDeviceGetPcieThroughput
    pcie_rx_kb_s: Value = 0.0
    process_util: Sequence[tuple[int, float]] = ()  # (pid, SM %) per-process samples
    gpm: dict[str, Value] | None = None  # GPM metric values by GPM_METRIC_NAMES; None: no GPM
    gpm_busy: bool = False  # counters held by another profiler
    gpm_sample_s: Value = 0.0  # how long nvmlGpmSampleGet takes (stamped at its end)
    field_errors: dict[int, int] = dataclasses.field(default_factory=dict)  # field id -> code
    not_supported: set[str] = dataclasses.field(default_factory=set)
    lost: bool | int = False  # True: GPU_IS_LOST; an error code: that code (RESET_REQUIRED)
    nvlinks: Sequence[FakeLink] = ()  # none: NVLink queries raise NOT_SUPPORTED (PCIe only)
    pcie_gen_max: int = 4  # what the GPU and the slot allow
    pcie_width_max: int = 16
    pcie_gen_current: int | None = None  # now (idle GPUs drop to Gen1); None: the max
    pcie_width_current: int | None = None


def hopper(**changes: Any) -> FakeGpu:
    """An H100 with GPM: SM 60% busy, tensor 40%, PCIe 100/50 MiB/s (override any field)."""
    fields: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-hhhhhhhh-1111-2222-3333-444444444444",
        "compute_capability": (9, 0),
        "util": 100.0,
        "gpm": {
            "sm_util": 60.0,
            "sm_occupancy": 30.0,
            "any_tensor": 40.0,
            "hmma_tensor": 40.0,
            "dram_bw": 25.0,
            "fp64": 0.0,
            "fp32": 5.0,
            "fp16": 1.0,
            "pcie_tx": 100.0,
            "pcie_rx": 50.0,
        },
    }
    fields.update(changes)
    return FakeGpu(**fields)


def two_gpus() -> list[FakeGpu]:
    """Two distinct GPUs: an A100 (cc 8.0) and a V100 without power readings (cc 7.0)."""
    return [
        FakeGpu(),
        FakeGpu(
            name="Tesla V100-SXM2-16GB",
            uuid="GPU-99999999-8888-7777-6666-555555555555",
            pci_bus_id="00000000:0A:00.0",
            memory_total_mib=16384.0,
            compute_capability=(7, 0),
            util=10.0,
            power_w=100.0,
            not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"},
        ),
    ]


def machine(count: int, **changes: Any) -> list[FakeGpu]:
    """`count` GPUs (default fields, or `changes`) with distinct UUIDs and PCI buses
    `00000000:{0x10 * (i + 1):02X}:00.0`; `bus(i)` names them."""
    return [
        FakeGpu(
            **{"uuid": f"GPU-{i:08d}-1111-2222-3333-444444444444", "pci_bus_id": bus(i)} | changes
        )
        for i in range(count)
    ]


def bus(index: int) -> str:
    """The PCI bus id `machine()` gives GPU `index`."""
    return f"00000000:{0x10 * (index + 1):02X}:00.0"


def _read(value: Value) -> float:
    return value() if callable(value) else value


class _Struct(types.SimpleNamespace):
    pass


def make(
    gpus: Sequence[FakeGpu] | None = None,
    *,
    driver_version: str = "550.54.15",
    cuda_version: int = 12040,
    library_missing: bool = False,
    old_api: bool = False,
    old_driver: bool = False,
    driver_lacks: Sequence[str] = (),
    topology: int | dict[tuple[int, int], int] = NVML_TOPOLOGY_HOSTBRIDGE,
    p2p: int | dict[tuple[int, int], int] = NVML_P2P_STATUS_OK,
) -> types.ModuleType:
    """Returns a fresh fake `pynvml` module scripting `gpus` (default: `two_gpus()`).

    Args:
        gpus: list of `FakeGpu`, in NVML (PCI) order. Defaults to `two_gpus()`.
        driver_version: str. Defaults to `"550.54.15"`.
        cuda_version: int, as NVML encodes it (12040 is 12.4). Defaults to `12040`.
        library_missing: bool, `nvmlInit` raises `NVMLError_LibraryNotFound` (a machine
            without the NVIDIA driver). Defaults to `False`.
        old_api: bool, offer only `nvmlDeviceGetCurrentClocksThrottleReasons`.
            Defaults to `False`.
        old_driver: bool, a driver before R535: the functions in `OLD_DRIVER` raise
            `NVMLError_FunctionNotFound`. Defaults to `False`.
        driver_lacks: names of C functions (and `field:<id>`) the driver does not export.
            Defaults to none.
        topology: int (an `NVML_TOPOLOGY_*` for every pair) or dict `{(i, j): level}`, the
            closest common ancestor of GPUs `i` and `j`. Defaults to
            `NVML_TOPOLOGY_HOSTBRIDGE`.
        p2p: int (an `NVML_P2P_STATUS_*` for every pair) or dict `{(i, j): status}`, what
            `nvmlDeviceGetP2PStatus` answers for any capability. Defaults to
            `NVML_P2P_STATUS_OK`.
    """
    module = types.ModuleType("pynvml")
    module.gpus = list(two_gpus() if gpus is None else gpus)
    module.calls = []
    module.init_count = 0
    module.clock = time.monotonic  # GPM, field value and process sample timestamps
    module.sleep = time.sleep  # what nvmlDeviceGetPcieThroughput blocks on
    module.pcie_throughput_block_s = 0.02
    module.driver_lacks = set(driver_lacks) | (OLD_DRIVER if old_driver else set())
    module.gpm_live = 0
    module.topology = topology
    module.p2p = p2p
    gpm_samples: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    for name, value in globals().items():
        if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlMemory_")) or name in (
            "NVMLLibraryMismatchError",
            "struct_c_nvmlGpmSample_t",
            "c_metricInfo_t",
        ):
            setattr(module, name, value)

    def record(name: str) -> None:
        module.calls.append((name, threading.get_ident()))

    def nvmlInit() -> None:
        record("nvmlInit")
        if library_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        with lock:
            module.init_count += 1

    def nvmlShutdown() -> None:
        record("nvmlShutdown")
        with lock:
            if module.init_count <= 0:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            module.init_count -= 1

    def check(name: str) -> None:
        record(name)
        if module.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if name in module.driver_lacks:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)

    def device(name: str, handle: Any) -> FakeGpu:
        check(name)
        gpu = handle.gpu
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST if gpu.lost is True else gpu.lost)
        if name in gpu.not_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlSystemGetDriverVersion() -> str:
        check("nvmlSystemGetDriverVersion")
        return driver_version

    def nvmlSystemGetCudaDriverVersion() -> int:
        check("nvmlSystemGetCudaDriverVersion")
        return cuda_version

    def nvmlDeviceGetCount() -> int:
        check("nvmlDeviceGetCount")
        return len(module.gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> Any:
        check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(module.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        lost = module.gpus[index].lost
        if lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST if lost is True else lost)
        return _Struct(gpu=module.gpus[index], index=index)

    def nvmlDeviceGetName(h: Any) -> str:
        return device("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(h: Any) -> str:
        return device("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(h: Any) -> Any:
        gpu = device("nvmlDeviceGetPciInfo", h)
        return _Struct(busId=gpu.pci_bus_id.encode(), busIdLegacy=gpu.pci_bus_id.encode())

    def nvmlDeviceGetCudaComputeCapability(h: Any) -> tuple[int, int]:
        return device("nvmlDeviceGetCudaComputeCapability", h).compute_capability

    def nvmlDeviceGetMemoryInfo(h: Any, version: int | None = None) -> Any:
        if not version:
            gpu = device("nvmlDeviceGetMemoryInfo", h)
            c_memory: Any = c_nvmlMemory_t()
        else:
            gpu = device("nvmlDeviceGetMemoryInfo_v2", h)
            c_memory = c_nvmlMemory_v2_t()
            c_memory.version = version
            if c_memory.version != nvmlMemory_v2:
                raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total = int(_read(gpu.memory_total_mib) * 2**20)
        used = int(_read(gpu.memory_used_mib) * 2**20)
        reserved = int(_read(gpu.memory_reserved_mib) * 2**20)
        c_memory.total = total
        if version:
            c_memory.reserved, c_memory.used = reserved, used
            c_memory.free = total - used - reserved
        else:  # the v1 struct counts reserved memory as used
            c_memory.used, c_memory.free = used + reserved, total - used - reserved
        return c_memory

    def nvmlDeviceGetUtilizationRates(h: Any) -> Any:
        gpu = device("nvmlDeviceGetUtilizationRates", h)
        return _Struct(gpu=int(_read(gpu.util)), memory=int(_read(gpu.mem_util)))

    def processes(name: str, h: Any) -> list:
        gpu = device(name, h)
        return [
            _Struct(pid=pid, usedGpuMemory=None if mib is None else int(mib * 2**20))
            for pid, mib in gpu.processes
        ]

    def nvmlDeviceGetComputeRunningProcesses_v3(h: Any) -> list:
        return processes("nvmlDeviceGetComputeRunningProcesses_v3", h)

    def nvmlDeviceGetComputeRunningProcesses_v2(h: Any) -> list:
        return processes("nvmlDeviceGetComputeRunningProcesses_v2", h)

    def nvmlDeviceGetComputeRunningProcesses(h: Any) -> list:
        # nvidia-ml-py 12+: the unversioned name calls _v3 under @throwOnVersionMismatch.
        try:
            return nvmlDeviceGetComputeRunningProcesses_v3(h)
        except NVMLError_FunctionNotFound:
            raise NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML "
                "lib version. Either use matching pyNVML and NVML lib versions or use a "
                "versioned function such as nvmlDeviceGetComputeRunningProcesses_v2"
            ) from None

    def nvmlDeviceGetTotalEnergyConsumption(h: Any) -> int:
        return int(_read(device("nvmlDeviceGetTotalEnergyConsumption", h).energy_j) * 1000)

    def nvmlDeviceGetFieldValues(h: Any, fieldIds: Sequence[Any]) -> Any:
        gpu = device("nvmlDeviceGetFieldValues", h)
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(module.clock() * 1e6)
        for i, field in enumerate(fieldIds):
            if isinstance(field, tuple):
                values[i].fieldId, values[i].scopeId = field
            else:
                values[i].fieldId = field
            fid = values[i].fieldId
            values[i].timestamp = now_us
            known = {
                NVML_FI_DEV_PCIE_COUNT_TX_BYTES: gpu.pcie_tx_bytes,
                NVML_FI_DEV_PCIE_COUNT_RX_BYTES: gpu.pcie_rx_bytes,
            }
            if fid not in known or f"field:{fid}" in module.driver_lacks | gpu.not_supported:
                values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
                continue
            if fid in gpu.field_errors:
                values[i].nvmlReturn = gpu.field_errors[fid]
                continue
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[i].value.ullVal = int(_read(known[fid]))
            values[i].nvmlReturn = NVML_SUCCESS
        return values

    def nvmlDeviceGetPcieThroughput(h: Any, counter: int) -> int:
        gpu = device("nvmlDeviceGetPcieThroughput", h)
        if counter not in (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        module.sleep(module.pcie_throughput_block_s)  # NVML counts bytes over 20 ms
        value = gpu.pcie_tx_kb_s if counter == NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kb_s
        return int(_read(value))

    def nvmlDeviceGetProcessUtilization(h: Any, timeStamp: int) -> list:
        gpu = device("nvmlDeviceGetProcessUtilization", h)
        now_us = int(module.clock() * 1e6)
        if not gpu.process_util or now_us <= timeStamp:
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # no sample newer than timeStamp
        samples = (c_nvmlProcessUtilizationSample_t * len(gpu.process_util))()
        for sample, (pid, sm) in zip(samples, gpu.process_util):
            sample.pid, sample.timeStamp, sample.smUtil = pid, now_us, int(_read(sm))
        return samples[0 : len(gpu.process_util)]

    # GPM: opaque samples, as the C library hands them out.
    def sample_key(sample: Any) -> int:
        if not isinstance(sample, c_nvmlGpmSample_t) or not sample:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        key = ctypes.cast(sample, ctypes.c_void_p).value
        if key not in gpm_samples:  # never allocated, or freed
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return key

    def nvmlGpmQueryDeviceSupport(h: Any) -> Any:
        gpu = device("nvmlGpmQueryDeviceSupport", h)
        support = c_nvmlGpmSupport_t()
        support.version = NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm is not None)
        return support

    def nvmlGpmSampleAlloc() -> Any:
        check("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        sample = ctypes.cast(buffer, c_nvmlGpmSample_t)
        with lock:
            gpm_samples[ctypes.addressof(buffer)] = {"buffer": buffer, "device": None}
            module.gpm_live += 1
        return sample

    def nvmlGpmSampleFree(sample: Any) -> None:
        check("nvmlGpmSampleFree")
        key = sample_key(sample)
        with lock:
            del gpm_samples[key]
            module.gpm_live -= 1

    def nvmlGpmSampleGet(h: Any, sample: Any) -> Any:
        gpu = device("nvmlGpmSampleGet", h)
        key = sample_key(sample)
        if gpu.gpm is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if gpu.gpm_busy:
            raise NVMLError(NVML_ERROR_IN_USE)
        taking = float(_read(gpu.gpm_sample_s))
        if taking:
            module.sleep(taking)
        gpm_samples[key].update(
            device=h.index,
            time=module.clock(),
            values={name: float(_read(v)) for name, v in gpu.gpm.items()},
        )
        return sample

    def nvmlGpmMetricsGet(metricsGet: Any) -> Any:
        check("nvmlGpmMetricsGet")
        if not isinstance(metricsGet, c_nvmlGpmMetricsGet_t):
            raise TypeError("byref() argument must be a ctypes instance")
        if metricsGet.version != NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if not 0 < metricsGet.numMetrics <= NVML_GPM_METRIC_MAX:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        first = gpm_samples[sample_key(metricsGet.sample1)]
        second = gpm_samples[sample_key(metricsGet.sample2)]
        if first["device"] is None or second["device"] != first["device"]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # unfilled, or two GPUs
        if second["time"] - first["time"] <= 0.1:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # out of order, or not > 100 ms apart
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            name = GPM_METRIC_NAMES.get(metric.metricId)
            if name is None or name not in second["values"]:
                metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                metric.nvmlReturn, metric.value = NVML_SUCCESS, second["values"][name]
        return metricsGet

    def nvmlDeviceGetPowerUsage(h: Any) -> int:
        return int(_read(device("nvmlDeviceGetPowerUsage", h).power_w) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(h: Any) -> int:
        return int(_read(device("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_w) * 1000)

    def nvmlDeviceGetTemperature(h: Any, sensor: int) -> int:
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(_read(device("nvmlDeviceGetTemperature", h).temp_c))

    def nvmlDeviceGetClockInfo(h: Any, clock: int) -> int:
        if clock != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(_read(device("nvmlDeviceGetClockInfo", h).sm_clock_mhz))

    def nvmlDeviceGetCurrentClocksThrottleReasons(h: Any) -> int:
        gpu = device("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return int(_read(gpu.throttle_reasons))

    def nvmlDeviceGetCurrentClocksEventReasons(h: Any) -> int:
        gpu = device("nvmlDeviceGetCurrentClocksEventReasons", h)
        return int(_read(gpu.throttle_reasons))

    # Topology: NVLink, PCIe links, the path between two GPUs.
    def nvlink(name: str, h: Any, link: int) -> FakeLink:
        gpu = device(name, h)
        if not gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < min(len(gpu.nvlinks), NVML_NVLINK_MAX_LINKS):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(device: Any, link: int) -> int:
        active = nvlink("nvmlDeviceGetNvLinkState", device, link).active
        return NVML_FEATURE_ENABLED if active else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkVersion(device: Any, link: int) -> int:
        return nvlink("nvmlDeviceGetNvLinkVersion", device, link).version

    def nvmlDeviceGetNvLinkRemotePciInfo(device: Any, link: int) -> Any:
        # nvidia-ml-py calls the C function nvmlDeviceGetNvLinkRemotePciInfo_v2
        remote = nvlink("nvmlDeviceGetNvLinkRemotePciInfo_v2", device, link).remote_bus
        if remote is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Struct(busId=remote.encode(), busIdLegacy=remote[4:].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Any, link: int) -> int:
        kind = nvlink("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link).remote_type
        if kind is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return kind

    def nvmlDeviceGetMaxPcieLinkGeneration(handle: Any) -> int:
        return device("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(handle: Any) -> int:
        return device("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_width_max

    def nvmlDeviceGetCurrPcieLinkGeneration(handle: Any) -> int:
        gpu = device("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return gpu.pcie_gen_max if gpu.pcie_gen_current is None else gpu.pcie_gen_current

    def nvmlDeviceGetCurrPcieLinkWidth(handle: Any) -> int:
        gpu = device("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return gpu.pcie_width_max if gpu.pcie_width_current is None else gpu.pcie_width_current

    def between(table: Any, first: Any, second: Any, default: int) -> int:
        if isinstance(table, int):
            return table
        i, j = first.index, second.index
        return table.get((i, j), table.get((j, i), default))

    def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
        device("nvmlDeviceGetTopologyCommonAncestor", device1)
        device("nvmlDeviceGetTopologyCommonAncestor", device2)
        if device1.index == device2.index:
            return NVML_TOPOLOGY_INTERNAL
        return between(module.topology, device1, device2, NVML_TOPOLOGY_HOSTBRIDGE)

    def nvmlDeviceGetP2PStatus(device1: Any, device2: Any, p2pIndex: Any) -> int:
        device("nvmlDeviceGetP2PStatus", device1)
        device("nvmlDeviceGetP2PStatus", device2)
        if not isinstance(p2pIndex, int) or isinstance(p2pIndex, bool):
            # what ctypes says when handed nvidia-ml-py's NVML_P2P_CAPS_INDEX_READ, `(0,)`
            raise ctypes.ArgumentError(
                "argument 3: TypeError: Don't know how to convert parameter 3"
            )
        if not 0 <= p2pIndex < NVML_P2P_CAPS_INDEX_UNKNOWN:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return between(module.p2p, device1, device2, NVML_P2P_STATUS_OK)

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
            setattr(module, fn.__name__, fn)
    module.gpm_samples = gpm_samples
    if old_api:
        del module.nvmlDeviceGetCurrentClocksEventReasons
    return module
