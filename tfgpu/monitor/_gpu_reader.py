"""The sampler thread's per-GPU readers, with older drivers' fallbacks (docs/metrics.md)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from tfgpu.monitor import _nvml_lib
from tfgpu.monitor._metrics import GPU_METRICS
from tfgpu.monitor._nvml_lib import Failure, constant, exported, nvml_failure, nvml_query
from tfgpu.monitor.nvml import GpuInfo

_log = logging.getLogger(__name__)

_MIB = 1024.0 * 1024.0
_NAN = float("nan")

Values = tuple[float, ...] | Failure  # a query's values, or its NVML call's `Failure`
Query = Callable[["GpuReader", Any], Values]

# Driver generations, the newest call first: the older one once the driver says it lacks it.
_REASONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_PROCESSES = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2")

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
"""NVML's least seconds between two GPM samples, counted from when the previous
`nvmlGpmSampleGet` returned (docs/metrics.md, "What GPU utilization hides")."""

PCIE_THROUGHPUT_PERIOD = 1.0
"""The least seconds between two reads of one `nvmlDeviceGetPcieThroughput` counter (it blocks):
all GPUs together make one such call per `PCIE_THROUGHPUT_PERIOD / (2 * GPUs)` s at most."""


@dataclasses.dataclass
class Session:
    """What a session's readers share: the clock, a rate's least window, blocking calls' turns."""

    clock: Callable[[], float]
    min_window: float
    spacing: float
    next_call: float = -math.inf
    served: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)


class GpuReader:
    """Reads one GPU's `GPU_METRICS`; never raises: what fails how, docs/metrics.md ("Sources by
    driver generation"); a query the GPU lacks is never asked again."""

    def __init__(self, nv: ModuleType, gpu: GpuInfo, position: int, session: Session) -> None:
        self._nv = nv
        self._gpu = gpu
        self._position = position
        self._pid = os.getpid()
        self._clock = session.clock
        self._handle: Any = None
        self._unsupported: set[str] = set()
        self._reported: set[str] = set()
        self._noted: set[str] = set()
        self._not_supported = constant(nv, "NVML_ERROR_NOT_SUPPORTED", 3)
        self._function_not_found = constant(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        self._not_found = constant(nv, "NVML_ERROR_NOT_FOUND", 6)
        self._in_use = constant(nv, "NVML_ERROR_IN_USE", 19)
        version = constant(nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25)
        self._no_v2 = (self._function_not_found, self._not_supported, version)
        self._gone = (  # the GPU (or NVML) is gone: no value of its row stands (docs/metrics.md)
            constant(nv, "NVML_ERROR_GPU_IS_LOST", 15),
            constant(nv, "NVML_ERROR_RESET_REQUIRED", 16),
            constant(nv, "NVML_ERROR_UNINITIALIZED", 1),
        )
        self._min_window = session.min_window
        self._reasons_names = exported(nv, *_REASONS)
        self._process_names = exported(nv, *_PROCESSES)
        self._memory_v2 = hasattr(nv, "nvmlMemory_v2")
        self._gpm: bool | None = None  # None undecided, True on, False off for good
        self._gpm_samples: list[Any] = []
        self._gpm_request: Any = None
        self._gpm_ids: list[int] = []
        self._fields_ok: bool | None = None  # PCIe byte counters: None untried, then worked?
        self._blocking = session
        self._proc_last_ts = 0
        self._forget()

    def _forget(self) -> None:
        """Drops the values and readings kept from earlier samples (at start; for a lost GPU)."""
        self._gpm_prev: int | None = None  # index in _gpm_samples of the previous sample
        self._gpm_done = -math.inf  # clock when the last nvmlGpmSampleGet returned
        self._gpm_values = [_NAN] * len(GPM_METRICS)
        self._fields_prev: tuple[float, float, float] | None = None  # (time s, tx, rx bytes)
        self._throughput: list[float] = [_NAN, _NAN]
        self._proc_value = _NAN
        self._proc_seen = -math.inf

    def _note(self, key: str, message: str, *args: Any) -> None:
        """Logs `message` at INFO once per reader and key (an unsupported metric, a fallback)."""
        if key not in self._noted:
            self._noted.add(key)
            _log.info(
                "tfgpu.monitor: GPU %d (%s): " + message, self._position, self._gpu.name, *args
            )

    def _newest(self, names: list[str], h: Any) -> Any:
        """Calls the first of `names` the driver exports, dropping those it does not."""
        while names:
            answer = nvml_query(self._nv, names[0], h)
            if not isinstance(answer, Failure) or len(names) == 1 or not answer.missing:
                return answer
            self._note(names[0], "the driver lacks %s; using %s.", names[0], names[1])
            del names[0]
        return nvml_failure(self._nv, self._function_not_found)

    def _utilization(self, h: Any) -> Values:
        rates = nvml_query(self._nv, "nvmlDeviceGetUtilizationRates", h)
        return rates if isinstance(rates, Failure) else (float(rates.gpu), float(rates.memory))

    def _memory(self, h: Any) -> Values:
        nv, info = self._nv, None
        if self._memory_v2:
            info = nvml_query(nv, "nvmlDeviceGetMemoryInfo", h, version=nv.nvmlMemory_v2)
            if isinstance(info, Failure) and (
                info.code in self._no_v2 or issubclass(info.kind, (TypeError, AttributeError))
            ):
                self._memory_v2 = False
                self._note(
                    "memory_v2",
                    "nvmlDeviceGetMemoryInfo_v2 unavailable (%s); mem_used_mib counts reserved "
                    "memory as used (the v1 struct), unlike recent nvidia-smi.",
                    info.text,
                )
                info = None
        if info is None:
            info = nvml_query(nv, "nvmlDeviceGetMemoryInfo", h)
        return info if isinstance(info, Failure) else (info.used / _MIB, info.total / _MIB)

    def _process_memory(self, h: Any) -> Values:
        processes = self._newest(self._process_names, h)
        if isinstance(processes, Failure):
            return processes
        used = [proc.usedGpuMemory for proc in processes if proc.pid == self._pid]
        return (_NAN,) if None in used else (sum((u / _MIB for u in used), 0.0),)

    def _number(self, h: Any, name: str, *constants: str, per: float = 1.0) -> Values:
        """NVML's number `name(h, *constants)`, divided by `per` (its milliwatts, millijoules)."""
        value = nvml_query(self._nv, name, h, *(getattr(self._nv, c) for c in constants))
        return value if isinstance(value, Failure) else (float(value) / per,)

    def _throttle_reasons(self, h: Any) -> Values:
        reasons = self._newest(self._reasons_names, h)
        return reasons if isinstance(reasons, Failure) else (float(reasons),)

    def _process_utilization(self, h: Any) -> Values:
        now = self._clock()
        samples = nvml_query(self._nv, "nvmlDeviceGetProcessUtilization", h, self._proc_last_ts)
        if isinstance(samples, Failure):
            if samples.code != self._not_found:
                return samples
            # No sample newer than the last one: carry it for a second, then idle.
            return (self._proc_value if now - self._proc_seen < 1.0 else 0.0,)
        self._proc_last_ts = max([self._proc_last_ts, *(int(s.timeStamp) for s in samples)])
        mine = [float(s.smUtil) for s in samples if s.pid == self._pid]
        self._proc_value = math.fsum(mine) / len(mine) if mine else 0.0
        self._proc_seen = now
        return (self._proc_value,)

    def _gpm_start(self, h: Any) -> Failure | None:
        """Decides whether GPM works on this GPU (`_gpm` True or False) and allocates its
        samples; a `Failure` leaves it undecided, asked again at the next read."""
        nv = self._nv
        needed = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet")
        if len(exported(nv, *needed)) < len(needed) or not hasattr(nv, "c_nvmlGpmMetricsGet_t"):
            self._gpm_off("this nvidia-ml-py has no GPM calls (pip install -U nvidia-ml-py)")
            return None
        support = nvml_query(nv, "nvmlGpmQueryDeviceSupport", h)
        if isinstance(support, Failure):
            if not self._is_not_supported(support):
                return support
            self._gpm_off(f"the driver does not offer GPM ({support.text})")
            return None
        if not support.isSupportedDevice:
            self._gpm_off("GPM not supported on this GPU (Hopper or newer needed)")
            return None
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        self._gpm_ids = [constant(nv, name, -1) for _, name in GPM_METRICS]
        request.numMetrics = len(GPM_METRICS)
        for k, metric_id in enumerate(self._gpm_ids):
            request.metrics[k].metricId = max(metric_id, 0)
        for _ in range(2):
            sample = nvml_query(nv, "nvmlGpmSampleAlloc")
            if isinstance(sample, Failure):
                self.free_gpm()  # what was allocated: tried again at the next read
                return sample
            self._gpm_samples.append(sample)
        self._gpm_request = request
        self._gpm = True
        return None

    def _gpm_off(self, why: str) -> None:
        self._gpm = False
        self._gpm_values = [_NAN] * len(GPM_METRICS)
        self._note(
            "gpm",
            "%s: sm/tensor/dram activity not recorded (NaN); PCIe rates come from other "
            "counters where the driver has them.",
            why,
        )
        self.free_gpm()

    def _gpm_read(self, h: Any) -> Values:
        if self._gpm is False or self._clock() - self._gpm_done <= GPM_MIN_PERIOD:
            return tuple(self._gpm_values[:6])  # off for good; or NVML needs more than 100 ms
        if self._gpm is None:
            failure = self._gpm_start(h)
            if not self._gpm:
                return failure or tuple(self._gpm_values[:6])
        previous, current = self._gpm_prev, 0 if self._gpm_prev != 0 else 1
        # What a failed call leaves, whatever it raises; a call that succeeds sets them anew.
        self._gpm_prev = None
        self._gpm_values = [_NAN] * len(GPM_METRICS)
        try:
            taken = nvml_query(self._nv, "nvmlGpmSampleGet", h, self._gpm_samples[current])
        finally:
            # The sample was taken before this: the next is more than the minimum after it.
            self._gpm_done = self._clock()
        if isinstance(taken, Failure):
            if taken.code == self._not_supported:
                self._gpm_off(f"GPM sampling is not supported here ({taken.text})")
            elif taken.code == self._in_use:
                self._report(
                    "gpm-in-use",
                    [n for n, _ in GPM_METRICS],
                    taken,
                    "the GPM counters are in use (another profiler: DCGM, Nsight, "
                    "nvidia-smi dmon?); retried every 0.1 s",
                )
            else:
                return taken
            return tuple(self._gpm_values[:6])
        self._gpm_prev = current
        if previous is None:
            return tuple(self._gpm_values[:6])  # the first sample: values come at the next
        request = self._gpm_request
        request.sample1, request.sample2 = self._gpm_samples[previous], self._gpm_samples[current]
        got = nvml_query(self._nv, "nvmlGpmMetricsGet", request)
        if isinstance(got, Failure):
            return got
        values = [_NAN] * len(GPM_METRICS)
        success = getattr(self._nv, "NVML_SUCCESS", 0)
        for k, (name, source) in enumerate(GPM_METRICS):
            metric = request.metrics[k]
            if self._gpm_ids[k] >= 0 and metric.nvmlReturn == success:
                values[k] = float(metric.value)
            else:
                self._note(f"gpm:{name}", "GPM metric %s not supported; %s is NaN.", source, name)
        self._gpm_values = values
        return tuple(values[:6])

    def free_gpm(self) -> None:
        """Frees the GPM samples (at the session's end: before `nvmlShutdown`). Never raises."""
        samples, self._gpm_samples = self._gpm_samples, []
        self._gpm_prev = None
        for sample in samples:  # nothing useful to do about a failed free at shutdown
            nvml_query(self._nv, "nvmlGpmSampleFree", sample, default=None)

    def _pcie(self, h: Any) -> Values:
        if all(v == v for v in self._gpm_values[6:]):  # GPM gave PCIe rates at its last read
            return self._gpm_values[6], self._gpm_values[7]
        values = self._pcie_fields(h) if self._fields_ok is not False else None
        return self._pcie_throughput(h) if values is None else values

    def _pcie_fields(self, h: Any) -> tuple[float, float] | Failure | None:
        """PCIe rates from the byte counters (non-blocking); None when the driver does not give
        them: it lacks them, or refuses them with any error before they ever worked."""
        nv = self._nv
        ids = [getattr(nv, f"NVML_FI_DEV_PCIE_COUNT_{way}_BYTES", None) for way in ("TX", "RX")]
        if not exported(nv, "nvmlDeviceGetFieldValues") or None in ids:
            self._fields_ok = False
            return None
        previous, self._fields_prev = self._fields_prev, None  # what a failed call leaves
        values = nvml_query(nv, "nvmlDeviceGetFieldValues", h, ids)
        if not isinstance(values, Failure):
            success = getattr(nv, "NVML_SUCCESS", 0)
            failed = [values[k].nvmlReturn for k in range(2) if values[k].nvmlReturn != success]
            if failed:
                values = nvml_failure(nv, failed[0])  # a field's own error, as the call's
        if isinstance(values, Failure):
            if values.code in self._gone or (
                self._fields_ok and not self._is_not_supported(values)
            ):
                return values  # a lost GPU: its row is NaN; counters that worked: NaN, retried
            self._fields_ok = False
            self._note(
                "fields",
                "no PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES: %s); using "
                "nvmlDeviceGetPcieThroughput.",
                values.text,
            )
            return None
        self._fields_ok = True
        stamp = values[0].timestamp / 1e6 if values[0].timestamp > 0 else self._clock()
        current = (stamp, float(values[0].value.ullVal), float(values[1].value.ullVal))
        self._fields_prev = current
        if previous is None or current[0] <= previous[0]:
            return _NAN, _NAN
        seconds = current[0] - previous[0]
        if seconds < self._min_window:
            self._fields_prev = previous  # too short for a rate: the next window spans both
            return _NAN, _NAN
        rates = [(current[k] - previous[k]) / seconds / _MIB for k in (1, 2)]
        return tuple(r if r >= 0 else _NAN for r in rates)  # type: ignore[return-value]

    def _pcie_throughput(self, h: Any) -> Values:
        """`nvmlDeviceGetPcieThroughput` (blocks ~20 ms): the session's readers take turns (least
        recently read counter first) within `PCIE_THROUGHPUT_PERIOD`; values carried between."""
        shared = self._blocking
        mine = ((self._position, 0), (self._position, 1))
        for key in mine:
            shared.served.setdefault(key, -math.inf)
        now, oldest = self._clock(), min(shared.served, key=lambda key: shared.served[key])
        waited = now - shared.served[oldest]
        if now < shared.next_call or oldest not in mine or waited < PCIE_THROUGHPUT_PERIOD:
            return tuple(self._throughput)  # not this counter's turn: its value carried
        shared.next_call = now + shared.spacing
        shared.served[oldest] = now
        k = oldest[1]  # 0: TX, 1: RX (NVML's own values of the two constants)
        counter = getattr(self._nv, ("NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_RX_BYTES")[k], k)
        self._throughput[k] = _NAN  # what a failed call leaves, whatever it raises
        kb_s = nvml_query(self._nv, "nvmlDeviceGetPcieThroughput", h, counter)
        if isinstance(kb_s, Failure):
            if self._is_not_supported(kb_s):
                for key in mine:  # never asked again: leave the turns to the others
                    shared.served.pop(key, None)
            return kb_s
        self._throughput[k] = kb_s / 1024.0  # KB/s (NVML's KB are 1024 bytes) to MiB/s
        return tuple(self._throughput)

    def _is_not_supported(self, failure: Failure) -> bool:
        return failure.code in (self._not_supported, self._function_not_found)

    def _report(self, kind: str, metrics: Sequence[str], failure: Failure, what: str = "") -> None:
        if kind in self._reported:
            return
        self._reported.add(kind)
        _log.warning(
            "tfgpu.monitor: GPU %d (%s, NVML index %d): NVML error %r reading %s%s; recorded as "
            "NaN and retried each sample while training goes on. (Logged once.)",
            self._position,
            self._gpu.name,
            self._gpu.index,
            failure.text,
            ", ".join(metrics),
            f" ({what})" if what else "",
        )

    def read(self) -> list[float]:
        """Returns the values of `GPU_METRICS`, in that order; NaN where unavailable."""
        if self._handle is None:
            handle = nvml_query(self._nv, "nvmlDeviceGetHandleByIndex", self._gpu.index)
            if isinstance(handle, Failure):
                self._report(handle.kind.__name__, list(GPU_METRICS), handle)
                return [_NAN] * len(GPU_METRICS)
            self._handle = handle
        values: list[float] = []
        for query, metrics, fn in _QUERIES:
            if query in self._unsupported:
                values.extend([_NAN] * len(metrics))
                continue
            try:
                result = fn(self, self._handle)
            except Exception as e:  # the tick's one catch-all: a query failing other than in
                # an NVML call (a struct the binding changed, a bug) reads NaN, as a failed call
                result = Failure.of(e)
            if not isinstance(result, Failure):
                values.extend(result)
                continue
            if result.code in self._gone:  # the rest would fail too; nothing read before stands
                self._report(result.kind.__name__, list(GPU_METRICS), result)
                self._forget()
                return [_NAN] * len(GPU_METRICS)
            values.extend([_NAN] * len(metrics))
            if self._is_not_supported(result):
                self._unsupported.add(query)
                _log.info(
                    "tfgpu.monitor: GPU %d does not support %s; recorded as NaN.",
                    self._position,
                    ", ".join(metrics),
                )
            else:
                self._report(result.kind.__name__, metrics, result)
        return values


def _number(name: str, *constants: str, per: float = 1.0) -> Query:
    return lambda reader, h: reader._number(h, name, *constants, per=per)


# Plain functions, called with the reader: bound methods on a reader would make it a reference
# cycle, kept (with its sampler and NVML handles) until a full collection.
_QUERIES: tuple[tuple[str, tuple[str, ...], Query], ...] = (
    ("utilization", ("util_pct", "mem_util_pct"), GpuReader._utilization),
    ("memory", ("mem_used_mib", "mem_total_mib"), GpuReader._memory),
    ("processes", ("proc_mem_mib",), GpuReader._process_memory),
    ("power", ("power_w",), _number("nvmlDeviceGetPowerUsage", per=1000.0)),
    ("power_limit", ("power_limit_w",), _number("nvmlDeviceGetEnforcedPowerLimit", per=1000.0)),
    ("temperature", ("temp_c",), _number("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU")),
    ("sm_clock", ("sm_clock_mhz",), _number("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM")),
    ("throttle_reasons", ("throttle_reasons",), GpuReader._throttle_reasons),
    ("gpm", tuple(name for name, _ in GPM_METRICS[:6]), GpuReader._gpm_read),
    ("pcie", ("pcie_tx_mib_s", "pcie_rx_mib_s"), GpuReader._pcie),
    ("energy", ("energy_j",), _number("nvmlDeviceGetTotalEnergyConsumption", per=1000.0)),
    ("process_utilization", ("proc_sm_util_pct",), GpuReader._process_utilization),
)


def open_readers(
    gpus: Sequence[GpuInfo], clock: Callable[[], float], min_window: float = 0.0
) -> tuple[ModuleType | None, list[GpuReader]]:
    """Starts NVML for a sampling session; returns the module (to stop later) and readers."""
    if not gpus:
        return None, []
    nv, _ = _nvml_lib.import_pynvml()
    if nv is None or _nvml_lib.start(nv) is not None:
        return None, []
    session = Session(clock, min_window, PCIE_THROUGHPUT_PERIOD / (2 * len(gpus)))
    return nv, [GpuReader(nv, gpu, position, session) for position, gpu in enumerate(gpus)]


def close_readers(nv: ModuleType | None, readers: Sequence[GpuReader]) -> None:
    for reader in readers:
        reader.free_gpm()
    if nv is not None:
        _nvml_lib.stop(nv)
