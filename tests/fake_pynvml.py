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
- `old_api=True` leaves out `nvmlDeviceGetCurrentClocksEventReasons` (drivers before 535
  only have the `...ThrottleReasons` name).

Like NVML, queries before `nvmlInit()` (or after the matching `nvmlShutdown()`) raise
`NVMLError_Uninitialized`; `fake.calls` records `(function name, thread id)` of every call.
"""

from __future__ import annotations

import dataclasses
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
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
NVMLError_DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class(
    "NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND
)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

Value = float | Callable[[], float]


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
    not_supported: set[str] = dataclasses.field(default_factory=set)
    lost: bool = False


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
    """
    module = types.ModuleType("pynvml")
    module.gpus = list(two_gpus() if gpus is None else gpus)
    module.calls = []
    module.init_count = 0
    lock = threading.Lock()

    for name, value in globals().items():
        if name.startswith(("NVML_", "NVMLError")):
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

    def device(name: str, handle: Any) -> FakeGpu:
        check(name)
        gpu = handle.gpu
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
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
        if module.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
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

    def nvmlDeviceGetMemoryInfo(h: Any) -> Any:
        gpu = device("nvmlDeviceGetMemoryInfo", h)
        total = int(_read(gpu.memory_total_mib) * 2**20)
        used = int(_read(gpu.memory_used_mib) * 2**20)
        return _Struct(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(h: Any) -> Any:
        gpu = device("nvmlDeviceGetUtilizationRates", h)
        return _Struct(gpu=int(_read(gpu.util)), memory=int(_read(gpu.mem_util)))

    def nvmlDeviceGetComputeRunningProcesses(h: Any) -> list:
        gpu = device("nvmlDeviceGetComputeRunningProcesses", h)
        return [
            _Struct(pid=pid, usedGpuMemory=None if mib is None else int(mib * 2**20))
            for pid, mib in gpu.processes
        ]

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

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
            setattr(module, fn.__name__, fn)
    if old_api:
        del module.nvmlDeviceGetCurrentClocksEventReasons
    return module
