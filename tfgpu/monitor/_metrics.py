"""Every quantity the monitor records (`tfgpu.monitor.METRICS`, in step with docs/metrics.md by
a test) and the epoch aggregates over them (`Sampler.aggregate()`, summed up by `GPUMonitor`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tfgpu._internal.helpers import stats

_NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class Metric:
    """One recorded quantity: its key (`gpu{i}_<name>` in the timeline for a GPU's), unit, the
    NVML or psutil call that produces it, its `nvidia-smi` query (or None) and what it means."""

    name: str
    unit: str
    source: str
    nvidia_smi: str | None
    description: str


def _by_name(*metrics: Metric) -> dict[str, Metric]:
    return {m.name: m for m in metrics}


BASE_METRICS: dict[str, Metric] = _by_name(
    Metric("time", "s", "time.time()", "--query-gpu=timestamp", "Unix time of the sample."),
    Metric("elapsed_s", "s", "time.time() - start", None, "Seconds since the sampler started."),
    Metric("epoch", "", "Sampler.mark(epoch=...) (GPUMonitor: on_epoch_begin)", None,
           "Epoch running when the sample was taken (0-based); nan before the first mark."),
    Metric("step", "", "Sampler.mark(step=...) (GPUMonitor: on_train_batch_begin)", None,
           "Batch index within the epoch whose execution began last (Keras `begin_step`); nan "
           "before the first mark."),
)  # fmt: skip

HOST_METRICS: dict[str, Metric] = _by_name(
    Metric("host_cpu_pct", "%",
           "psutil.cpu_times() (busy share of all cores between two readings)", None,
           "Whole-machine CPU utilization averaged over all cores, 0-100, since the previous "
           "reading at least half an interval back (nan in a session's first row, and in a row "
           "taken sooner, e.g. the last one at stop); a busy input pipeline shows here."),
    Metric("host_rss_mib", "MiB", "psutil.Process().memory_info().rss", None,
           "Resident memory of this process."),
    Metric("host_mem_used_pct", "%", "psutil.virtual_memory().percent", None,
           "System memory in use, all processes."),
)  # fmt: skip

GPU_METRICS: dict[str, Metric] = _by_name(
    Metric("util_pct", "%", "nvmlDeviceGetUtilizationRates().gpu", "--query-gpu=utilization.gpu",
           "Percent of the last sample period (1/6 s to 1 s, set by the driver) during which at "
           "least one kernel ran on the GPU."),
    Metric("mem_util_pct", "%", "nvmlDeviceGetUtilizationRates().memory",
           "--query-gpu=utilization.memory",
           "Percent of the last sample period during which device memory was read or written."),
    Metric("mem_used_mib", "MiB",
           "nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2).used (drivers without "
           "nvmlDeviceGetMemoryInfo_v2: nvmlDeviceGetMemoryInfo().used)", "--query-gpu=memory.used",
           "Device memory in use by all processes, without the memory the driver reserves (as "
           "recent nvidia-smi); with the older struct, reserved memory counts as used (about "
           "0.5 GiB more on H-class GPUs)."),
    Metric("mem_total_mib", "MiB", "nvmlDeviceGetMemoryInfo().total", "--query-gpu=memory.total",
           "Installed device memory."),
    Metric("proc_mem_mib", "MiB",
           "nvmlDeviceGetComputeRunningProcesses()[pid == os.getpid()].usedGpuMemory (drivers "
           "without the _v3 call: nvmlDeviceGetComputeRunningProcesses_v2)",
           "--query-compute-apps=pid,used_memory (a per-process query, not --query-gpu)",
           "Device memory held by this process; 0 when NVML lists no context for it (also in "
           "containers whose PID namespace hides the host PID), NaN where the driver withholds "
           "it."),
    Metric("power_w", "W", "nvmlDeviceGetPowerUsage() / 1000", "--query-gpu=power.draw",
           "Board power draw."),
    Metric("power_limit_w", "W", "nvmlDeviceGetEnforcedPowerLimit() / 1000",
           "--query-gpu=enforced.power.limit",
           "Power limit the driver enforces; the GPU slows its clocks to stay under it."),
    Metric("temp_c", "°C", "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
           "--query-gpu=temperature.gpu", "GPU core temperature."),
    Metric("sm_clock_mhz", "MHz", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", "--query-gpu=clocks.sm",
           "Current streaming-multiprocessor clock."),
    Metric("throttle_reasons", "bitmask",
           "nvmlDeviceGetCurrentClocksEventReasons() (older drivers: "
           "nvmlDeviceGetCurrentClocksThrottleReasons())",
           "--query-gpu=clocks_event_reasons.active (older: clocks_throttle_reasons.active)",
           "Why clocks are below their maximum, as NVML's bitmask: 0x1 idle, 0x4 software power "
           "cap, 0x8 hardware slowdown, 0x20 software thermal, 0x40 hardware thermal, 0x80 power "
           "brake. 0 means full speed."),
    Metric("sm_active_pct", "%", "GPM NVML_GPM_METRIC_SM_UTIL",
           "dcgmi dmon -e 1002 (DCGM_FI_PROF_SM_ACTIVE)",
           "Share of SMs busy, averaged over the time between two GPM samples (more than 0.1 s); "
           "Hopper or newer, NaN elsewhere. A single-thread kernel shows 100% util_pct but about "
           "1% here."),
    Metric("sm_occupancy_pct", "%", "GPM NVML_GPM_METRIC_SM_OCCUPANCY",
           "dcgmi dmon -e 1003 (DCGM_FI_PROF_SM_OCCUPANCY)",
           "Resident warps as a share of the SMs' maximum, same window; Hopper or newer."),
    Metric("tensor_active_pct", "%", "GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL",
           "dcgmi dmon -e 1004 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
           "Share of time the SMs' tensor cores were busy (any precision), same window; near 0 "
           "when float32 matmuls run without TF32 or bf16/fp16; Hopper or newer."),
    Metric("fp16_active_pct", "%", "GPM NVML_GPM_METRIC_FP16_UTIL",
           "dcgmi dmon -e 1008 (DCGM_FI_PROF_PIPE_FP16_ACTIVE)",
           "Share of time the SMs did non-tensor FP16 math, same window; Hopper or newer."),
    Metric("fp32_active_pct", "%", "GPM NVML_GPM_METRIC_FP32_UTIL",
           "dcgmi dmon -e 1007 (DCGM_FI_PROF_PIPE_FP32_ACTIVE)",
           "Share of time the SMs did non-tensor FP32 math, same window; Hopper or newer."),
    Metric("dram_active_pct", "%", "GPM NVML_GPM_METRIC_DRAM_BW_UTIL",
           "dcgmi dmon -e 1005 (DCGM_FI_PROF_DRAM_ACTIVE)",
           "Device-memory bandwidth used, as a share of the maximum, same window; Hopper or "
           "newer."),
    Metric("pcie_tx_mib_s", "MiB/s",
           "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC; else "
           "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX_BYTES) (byte counter: difference / "
           "time between readings at least half an interval apart); else "
           "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) (KB/s over 20 ms, read at most "
           "once a second, carried between reads)",
           "nvidia-smi dmon -s t (txpci); DCGM_FI_PROF_PCIE_TX_BYTES (1009)",
           "PCIe traffic out of the GPU (device to host and peers), MiB per second."),
    Metric("pcie_rx_mib_s", "MiB/s",
           "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC; else "
           "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_RX_BYTES); else "
           "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES), as for TX",
           "nvidia-smi dmon -s t (rxpci); DCGM_FI_PROF_PCIE_RX_BYTES (1010)",
           "PCIe traffic into the GPU (host-to-device copies: input batches), MiB per second."),
    Metric("energy_j", "J",
           "nvmlDeviceGetTotalEnergyConsumption() / 1000 (mJ since the driver loaded)",
           "--query-gpu=total_energy_consumption (dcgmi: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "
           "156)",
           "Energy the GPU used since the driver loaded, cumulative: the difference between two "
           "rows is the energy in between. Volta or newer."),
    Metric("proc_sm_util_pct", "%",
           "nvmlDeviceGetProcessUtilization(h, last_seen)[pid == os.getpid()].smUtil",
           "nvidia-smi pmon -s u (sm)",
           "This process's share of the time kernels ran (NVML's per-process utilization, the "
           "mean of the driver's samples since the previous row); 0 when NVML has no sample for "
           "this PID (idle, or a container hiding the host PID)."),
)  # fmt: skip

METRICS: dict[str, Metric] = {**BASE_METRICS, **HOST_METRICS, **GPU_METRICS}
"""Every timeline metric by name (per-GPU ones without their `gpu{i}_` prefix)."""


def timeline_columns(num_gpus: int) -> list[str]:
    """Returns the timeline's column names, in file order, for `num_gpus` sampled GPUs.

    Args:
        num_gpus: int, how many GPUs are sampled (`len(sampler.gpus)`).

    Returns:
        list of str: `time, elapsed_s, epoch, step`, the host's, then each GPU's.

    Example:

    >>> timeline_columns(1)[7:9]
    ['gpu0_util_pct', 'gpu0_mem_util_pct']
    """
    gpus = [f"gpu{i}_{name}" for i in range(num_gpus) for name in GPU_METRICS]
    return [*BASE_METRICS, *HOST_METRICS, *gpus]


# (column, statistic), keyed `<column>_<statistic>` (a "delta" by the column alone); what each
# statistic is: docs/metrics.md, "Epoch aggregates".
_GPU_AGGREGATES = (
    ("util_pct", "mean"), ("util_pct", "max"), ("mem_used_mib", "mean"), ("mem_used_mib", "max"),
    ("power_w", "mean"), ("power_w", "max"), ("sm_active_pct", "mean"),
    ("sm_occupancy_pct", "mean"), ("tensor_active_pct", "mean"), ("dram_active_pct", "mean"),
    ("pcie_tx_mib_s", "mean"), ("pcie_rx_mib_s", "mean"), ("energy_j", "delta"),
    ("power_limit_w", "max"), ("sm_clock_mhz", "mean"), ("throttle_reasons", "any"),
)  # fmt: skip
_HOST_AGGREGATES = (("host_cpu_pct", "mean"), ("host_rss_mib", "max"))


def _aggregates(num_gpus: int) -> list[tuple[str, str, str]]:
    """(key, column, statistic) of every aggregate, in order."""
    columns = [(f"gpu{i}_{c}", stat) for i in range(num_gpus) for c, stat in _GPU_AGGREGATES]
    return [
        (column if stat == "delta" else f"{column}_{stat}", column, stat)
        for column, stat in [*columns, *_HOST_AGGREGATES]
    ]


def aggregate_keys(num_gpus: int) -> list[str]:
    """Returns the keys of `Sampler.aggregate()`, in order. The guide: docs/metrics.md.

    Args:
        num_gpus: int, how many GPUs are sampled.

    Returns:
        list of str, each GPU's keys (`gpu0_util_pct_mean`, ...), then the host's.

    Example:

    >>> aggregate_keys(0)
    ['host_cpu_pct_mean', 'host_rss_mib_max']
    """
    return [key for key, _, _ in _aggregates(num_gpus)]


def _stat(values: Sequence[float], stat: str) -> float:
    finite = stats.finite(values)
    if not finite or stat == "mean":
        return stats.mean(finite)
    if stat == "max":
        return max(finite)
    if stat == "delta":
        change = finite[-1] - finite[0]
        return change if len(finite) >= 2 and change >= 0 else _NAN
    bits = 0  # "any"
    for v in finite:
        bits |= int(v) if v >= 0 else 0
    return float(bits)


def aggregate_columns(columns: Mapping[str, Sequence[float]], num_gpus: int) -> dict[str, float]:
    """Pure: epoch aggregates (NaN-ignoring mean/max) of the given column values."""
    return {key: _stat(columns.get(col, ()), stat) for key, col, stat in _aggregates(num_gpus)}
