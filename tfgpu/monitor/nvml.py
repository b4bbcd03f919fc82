"""The machine's GPUs (`inventory()`) and this process's (`visible_gpus`), as NVML tells."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol, TypeVar

from tfgpu.monitor import _nvml_lib
from tfgpu.monitor._metrics import GPU_METRICS as GPU_METRICS
from tfgpu.monitor._nvml_lib import NVML_HINT, Failure, decode, nvml_query

_log = logging.getLogger(__name__)

_MIB = 1024.0 * 1024.0
_NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it at the moment of the query: memory in MiB as `nvidia-smi`'s
    `memory.total` and `memory.used`, `utilization_pct` as its `utilization.gpu`, NaN or None
    where NVML cannot tell. `index` is NVML's (PCI bus order), not necessarily CUDA's or
    TensorFlow's: docs/setup.md, "Which GPU is which"."""

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
    """What NVML says about the machine: `available=False` with an `error` (why, and the
    fix) when it cannot; `cuda_driver_version` is the newest CUDA the driver supports
    (`"12.4"`); `gpus`, every GPU in NVML order, whatever `CUDA_VISIBLE_DEVICES` says."""

    available: bool
    error: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: list[GpuInfo] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the inventory."""
        return dataclasses.asdict(self)


def _memory_info(nv: ModuleType, handle: Any) -> Any:
    """The v2 memory struct (without reserved memory, as `nvidia-smi`) where allowed, else v1."""
    version = getattr(nv, "nvmlMemory_v2", None)
    memory = None
    if version is not None:
        memory = nvml_query(nv, "nvmlDeviceGetMemoryInfo", handle, version=version, default=None)
    if memory is None:
        memory = nvml_query(nv, "nvmlDeviceGetMemoryInfo", handle, default=None)
    return memory


def _gpu_info(nv: ModuleType, index: int, handle: Any) -> GpuInfo:
    memory = _memory_info(nv, handle)
    util = nvml_query(nv, "nvmlDeviceGetUtilizationRates", handle, default=None)
    pci = nvml_query(nv, "nvmlDeviceGetPciInfo", handle, default=None)
    cc = nvml_query(nv, "nvmlDeviceGetCudaComputeCapability", handle, default=None)
    bus_id = decode(getattr(pci, "busId", b"") or getattr(pci, "busIdLegacy", b""))  # or ""
    return GpuInfo(
        index=index,
        name=decode(nvml_query(nv, "nvmlDeviceGetName", handle, default="unknown")),
        uuid=decode(nvml_query(nv, "nvmlDeviceGetUUID", handle, default="")),
        pci_bus_id=bus_id,
        memory_total_mib=memory.total / _MIB if memory is not None else _NAN,
        memory_used_mib=memory.used / _MIB if memory is not None else _NAN,
        compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
        utilization_pct=float(util.gpu) if util is not None else _NAN,
    )


def _failed(why: str) -> NvmlInventory:
    return NvmlInventory(False, f"NVML query failed ({why}). {NVML_HINT}", None, None)


def inventory() -> NvmlInventory:
    """Lists the machine's GPUs through NVML, without touching CUDA or TensorFlow.

    Returns:
        A `NvmlInventory`; where NVML is missing or broken (it never raises), one with
        `available=False` and an `error` that says why and how to fix it.

    Example:

    >>> [(gpu.index, gpu.name) for gpu in tfgpu.monitor.nvml.inventory().gpus]
    """
    nv, error = _nvml_lib.import_pynvml()
    if nv is not None:
        error = _nvml_lib.start(nv)
    if nv is None or error is not None:
        return NvmlInventory(False, error, None, None)
    try:
        driver = nvml_query(nv, "nvmlSystemGetDriverVersion", default=None)
        cuda = nvml_query(nv, "nvmlSystemGetCudaDriverVersion", default=None)
        count = nvml_query(nv, "nvmlDeviceGetCount")
        if isinstance(count, Failure):
            return _failed(count.text)
        gpus = []
        for index in range(count):
            handle = nvml_query(nv, "nvmlDeviceGetHandleByIndex", index)
            if isinstance(handle, Failure):  # a lost or inaccessible GPU: list the others
                _log.warning("NVML cannot open GPU %d (%s); it is left out.", index, handle.text)
                continue
            gpus.append(_gpu_info(nv, index, handle))
        driver_text = decode(driver) if driver is not None else None
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None  # 12040: "12.4"
        return NvmlInventory(True, None, driver_text, cuda_text, gpus)
    except Exception as e:  # never raises: a binding failing in any way means no NVML
        return _failed(decode(e))
    finally:
        _nvml_lib.stop(nv)


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
        return gpus[int(token)] if int(token) < len(gpus) else None
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

    As CUDA does, parsing stops at the first entry that names no GPU, and repeats are dropped.
    The guide: docs/setup.md, "Which GPU is which".

    Args:
        gpus: sequence of `GpuInfo`, all GPUs in NVML order (`inventory().gpus`).
        cuda_visible_devices: str or None, the variable's value; None: unset (all GPUs).

    Returns:
        The `GpuInfo` of this process's GPUs: position `i` is CUDA's `i`.

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
