"""The sampler: a background thread that records GPU and host metrics at an interval.

Each sample becomes one row: kept in memory (a column store, about 8 bytes per value) and,
when a run directory is given, appended and flushed to its timeline CSV at once, so a crash
or SIGKILL loses at most the row being taken. Never imports TensorFlow or Keras.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from tfgpu import _files, _warnings
from tfgpu._checks import (
    check_bool,
    check_dir,
    check_number,
    invalid_type,
    invalid_value,
    is_int,
    is_number,
)
from tfgpu._cluster import Cluster, resolve_cluster
from tfgpu.monitor.host import HOST_METRICS, _HostReader
from tfgpu.monitor.nvml import (
    GPU_METRICS,
    GpuInfo,
    Metric,
    _close_readers,
    _open_readers,
    inventory,
    visible_gpus,
)

_log = logging.getLogger(__name__)
_NAN = float("nan")

BASE_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("time", "s", "time.time()", "--query-gpu=timestamp", "Unix time of the sample."),
        Metric("elapsed_s", "s", "time.time() - start", None, "Seconds since the sampler started."),
        Metric(
            "epoch",
            "",
            "Sampler.mark(epoch=...) (GPUMonitor: on_epoch_begin)",
            None,
            "Epoch running when the sample was taken (0-based); nan before the first mark.",
        ),
        Metric(
            "step",
            "",
            "Sampler.mark(step=...) (GPUMonitor: on_train_batch_begin)",
            None,
            "Batch index within the epoch whose execution began last (Keras `begin_step`); "
            "nan before the first mark.",
        ),
    )
}

# Epoch aggregates: (key suffix, source column, statistic); per GPU first, then host.
# Statistics: mean/max ignore NaN; "delta" is the last finite value minus the first (a
# cumulative counter's increase, NaN with fewer than two values or if it went back);
# "or" is the bitwise OR of the finite bitmasks, as a float.
_GPU_AGGREGATES = (
    ("util_pct_mean", "util_pct", "mean"),
    ("util_pct_max", "util_pct", "max"),
    ("mem_used_mib_mean", "mem_used_mib", "mean"),
    ("mem_used_mib_max", "mem_used_mib", "max"),
    ("power_w_mean", "power_w", "mean"),
    ("power_w_max", "power_w", "max"),
    ("sm_active_pct_mean", "sm_active_pct", "mean"),
    ("sm_occupancy_pct_mean", "sm_occupancy_pct", "mean"),
    ("tensor_active_pct_mean", "tensor_active_pct", "mean"),
    ("dram_active_pct_mean", "dram_active_pct", "mean"),
    ("pcie_tx_mib_s_mean", "pcie_tx_mib_s", "mean"),
    ("pcie_rx_mib_s_mean", "pcie_rx_mib_s", "mean"),
    ("energy_j", "energy_j", "delta"),
    ("power_limit_w_max", "power_limit_w", "max"),
    ("sm_clock_mhz_mean", "sm_clock_mhz", "mean"),
    ("throttle_reasons_any", "throttle_reasons", "or"),
)
_HOST_AGGREGATES = (
    ("host_cpu_pct_mean", "host_cpu_pct", "mean"),
    ("host_rss_mib_max", "host_rss_mib", "max"),
)


def timeline_columns(num_gpus: int) -> list[str]:
    """Returns the timeline's column names, in file order, for `num_gpus` sampled GPUs.

    Args:
        num_gpus: int, how many GPUs are sampled (`len(sampler.gpus)`).

    Returns:
        `time, elapsed_s, epoch, step`, the host columns, then `gpu{i}_<metric>` for each GPU.

    Example:

    >>> timeline_columns(1)[:8]
    ['time', 'elapsed_s', 'epoch', 'step', 'host_cpu_pct', 'host_rss_mib', 'host_mem_used_pct', 'gpu0_util_pct']
    """
    columns = [*BASE_METRICS, *HOST_METRICS]
    for i in range(num_gpus):
        columns.extend(f"gpu{i}_{name}" for name in GPU_METRICS)
    return columns


def aggregate_keys(num_gpus: int) -> list[str]:
    """Returns the keys of `Sampler.aggregate()`, in order.

    `GPUMonitor` puts the first six per GPU and the host ones into Keras `logs`, plus the
    GPM and energy figures where known (see `docs/metrics.md`).

    Args:
        num_gpus: int, how many GPUs are sampled.

    Returns:
        `gpu{i}_util_pct_mean`, `..._max`, `gpu{i}_mem_used_mib_mean/max`,
        `gpu{i}_power_w_mean/max`, `gpu{i}_sm_active_pct_mean`, `..._sm_occupancy_pct_mean`,
        `..._tensor_active_pct_mean`, `..._dram_active_pct_mean`, `..._pcie_tx_mib_s_mean`,
        `..._pcie_rx_mib_s_mean`, `gpu{i}_energy_j`, `gpu{i}_power_limit_w_max`,
        `gpu{i}_sm_clock_mhz_mean`, `gpu{i}_throttle_reasons_any` per GPU, then
        `host_cpu_pct_mean`, `host_rss_mib_max`.
    """
    keys = [f"gpu{i}_{suffix}" for i in range(num_gpus) for suffix, _, _ in _GPU_AGGREGATES]
    return keys + [key for key, _, _ in _HOST_AGGREGATES]


def _cluster(environ: Mapping[str, str]) -> Cluster | None:
    """This process's place in a multi-worker cluster, or None for a lone process.

    Reads `TF_CONFIG` (the cluster TensorFlow uses), else a Slurm job step with several
    tasks. A malformed value means a lone process: naming files must never fail.
    """
    try:
        cluster = resolve_cluster(environ, strict=False)
    except ValueError:
        return None
    if cluster.task_type is None or cluster.task_index is None:
        return None
    if cluster.source == "TF_CONFIG" and sum(map(len, cluster.spec.values())) <= 1:
        return None
    return cluster


def artifact_name(stem: str, suffix: str = ".csv", environ: Mapping[str, str] | None = None) -> str:
    """Returns a run-directory file name, carrying the worker's task in multi-worker runs.

    Args:
        stem: str, e.g. `"timeline"` or `"steps"`.
        suffix: str, the extension with its dot. Defaults to `".csv"`.
        environ: mapping or None, the environment to read `TF_CONFIG` / Slurm from.
            Defaults to `os.environ`.

    Returns:
        `"timeline.csv"` for a lone process; `"timeline-worker1.csv"` for worker 1 of a
        multi-worker cluster (`"timeline-chief0.csv"` for a chief).

    Example:

    >>> artifact_name("steps", environ={})
    'steps.csv'
    """
    task = _cluster(os.environ if environ is None else environ)
    return (
        f"{stem}{suffix}" if task is None else f"{stem}-{task.task_type}{task.task_index}{suffix}"
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
    """Checks a run directory, creates it if needed and proves it writable.

    Raises:
        TypeError: if it is not a path.
        ValueError: if it or a parent is a file (`tfgpu._checks.check_dir`), or it cannot be
            created or written.
    """
    path = check_dir(argument, log_dir)
    if path is None:  # pragma: no cover (allow_none is False)
        raise invalid_type(argument, log_dir, "a directory path")
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


def _can_continue(path: Path, header: bytes) -> bool:
    """Whether the CSV at `path` can be appended to: same header, last row complete.

    An empty file can be continued too (the caller writes the header). Reads bytes, so a
    damaged (binary) file is a "no", never an exception other than `OSError`.
    """
    with open(path, "rb") as f:
        first = f.readline()
        if not first:
            return True
        if first != header:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def open_csv(path: Path, header: str) -> tuple[Any, Path | None]:
    """Opens the run-directory CSV `path` for appending, never losing what it holds.

    Same header and a complete last row: appended to. Otherwise (other columns, a row cut
    by a crash, a damaged file) the old file is moved aside to `NAME.N.csv`
    (`tfgpu._files.rotate`) and a new one starts under the plain name.

    Args:
        path: Path, the file.
        header: str, the header line, with its newline.

    Returns:
        The open text file (positioned at its end, header written and flushed) and where an
        older file was moved to, or None.

    Raises:
        OSError: if the file cannot be read, moved or opened.
    """
    rotated = None
    if path.exists() and not _can_continue(path, header.encode()):
        rotated = _files.rotate(path)
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (the caller closes it)
    try:
        if f.tell() == 0:
            f.write(header)
            f.flush()
    except BaseException:
        f.close()
        raise
    return f, rotated


def _format(column: str, value: float) -> str:
    if value != value:  # NaN
        return "nan"
    if column in ("time", "elapsed_s"):
        return f"{value:.3f}"
    if column in ("epoch", "step") or column.endswith("throttle_reasons"):
        return str(int(value)) if math.isfinite(value) else repr(value)
    return repr(round(value, 3))


def _stat(values: Sequence[float], stat: str) -> float:
    finite = [v for v in values if v == v and not math.isinf(v)]
    if not finite:
        return _NAN
    if stat == "max":
        return max(finite)
    if stat == "delta":
        change = finite[-1] - finite[0]
        return change if len(finite) >= 2 and change >= 0 else _NAN
    if stat == "or":
        bits = 0
        for v in finite:
            bits |= int(v) if v >= 0 else 0
        return float(bits)
    return math.fsum(finite) / len(finite)


def _aggregate(columns: Mapping[str, Sequence[float]], num_gpus: int) -> dict[str, float]:
    """Pure: epoch aggregates (NaN-ignoring mean/max) of the given column values."""
    result: dict[str, float] = {}
    for i in range(num_gpus):
        for suffix, source, stat in _GPU_AGGREGATES:
            result[f"gpu{i}_{suffix}"] = _stat(columns.get(f"gpu{i}_{source}", ()), stat)
    for key, source, stat in _HOST_AGGREGATES:
        result[key] = _stat(columns.get(source, ()), stat)
    return result


class Sampler:
    """Samples this process's GPUs and the host in a background thread.

    Every `interval` seconds (and once at `start()` and once at `stop()`, so even a very
    short run has data) it reads, per GPU, the metrics of `tfgpu.monitor.METRICS`:
    utilization (`nvidia-smi --query-gpu=utilization.gpu`), memory-controller utilization,
    memory used and total, this process's own GPU memory, power draw and limit, temperature,
    SM clock and throttle reasons, and the counters utilization hides: SM activity and
    occupancy, tensor/FP16/FP32 pipe activity and DRAM bandwidth (GPM, Hopper and newer),
    PCIe TX/RX rates, cumulative energy and this process's SM share; and for the host, CPU %, this process's RSS and system
    memory %. A metric the GPU does not support is NaN. Without NVML (no driver), one warning
    is given per process and the host metrics are still recorded. NVML errors during the
    run (a lost GPU, any exception a binding raises) are logged once; sampling goes on.

    With `log_dir`, the sampler writes into that run directory: `run.json` (what was sampled)
    and `timeline.csv` (one row per sample, flushed at once; `timeline-worker{k}.csv` in a
    multi-worker cluster). Nothing an earlier run wrote is lost: a timeline with the same
    columns is appended to; one with other columns (another GPU count), or whose last row a
    crash cut short, is moved aside to `timeline.1.csv` (`.2`, ...) and the earlier
    session's `"timeline"` in `run.json` names where it went; `run.json` keeps earlier
    sessions under `"earlier_sessions"`. A failure to write (a full disk) is logged once and
    the samples stay in memory.

    Args:
        interval: float, seconds between samples, at least `MIN_INTERVAL` (0.01). NVML
            refreshes utilization every 1/6 s to 1 s depending on the GPU, so going much
            lower adds nothing. Defaults to `0.2`.
        gpus: list of int or None, which GPUs to sample, numbered as CUDA lists them to
            this process (after `CUDA_VISIBLE_DEVICES`; TensorFlow's `/GPU:i` unless
            `tf.config.set_visible_devices` hid some, which this TF-free module cannot see:
            `GPUMonitor` maps TensorFlow's numbering onto these positions). Defaults to
            `None`: all GPUs this process can use.
        log_dir: str, os.PathLike or None, the run directory to write to (created if missing).
            Defaults to `None`: keep samples in memory only.
        host: bool, whether to read host metrics (when False their columns are NaN).
            Defaults to `True`.

    Raises:
        ValueError: if `interval` is below 0.01 or not finite, a GPU index is negative or
            repeated or (when NVML is available) names no GPU this process can see, or
            `log_dir` is a file, under a file, or cannot be created or written.
        TypeError: if `interval` is not a number, `gpus` not a list of ints, `host` not a
            bool, or `log_dir` not a path.

    Example:

    ```python
    sampler = tfgpu.monitor.Sampler(interval=0.5, log_dir="runs/exp1")
    sampler.start()
    train()
    sampler.stop()
    print(sampler.aggregate())  # {'gpu0_util_pct_mean': 87.5, ...}
    ```
    """

    def __init__(
        self,
        *,
        interval: float = 0.2,
        gpus: Sequence[int] | None = None,
        log_dir: str | os.PathLike | None = None,
        host: bool = True,
    ) -> None:
        self._interval = check_interval(interval)
        requested = check_gpus(gpus)
        self._unchecked: list[int] | None = None  # `gpus` NVML was not there to check
        check_bool("host", host)
        self._dir = None if log_dir is None else check_log_dir(log_dir, "log_dir")
        self._host = host
        self._inventory = inventory()
        visible = visible_gpus(self._inventory.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if requested is None:
            self._gpus = visible
        elif not self._inventory.available:
            self._gpus = []  # cannot check without NVML; start() warns that GPUs are not read
            self._unchecked = requested
        else:
            unknown = [g for g in requested if g >= len(visible)]
            if unknown:
                valid = (
                    f"one of {list(range(len(visible)))}" if visible else "no index (it sees none)"
                )
                cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
                raise ValueError(
                    "Invalid value for argument `gpus`. "
                    f"Received: gpus={requested!r}. Expected indices below {len(visible)}: "
                    f"this process sees {len(visible)} GPU(s), so each index must be {valid}"
                    + (f" (CUDA_VISIBLE_DEVICES={cvd!r})." if cvd is not None else ".")
                )
            self._gpus = [visible[g] for g in requested]
        self._columns = timeline_columns(len(self._gpus))
        self._data: dict[str, array] = {c: array("d") for c in self._columns}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._file_failed = False
        self._sample_failed = False
        self._epoch = _NAN
        self._step = _NAN
        self._t0 = 0.0
        self._nv: Any = None
        self._readers: list[Any] = []
        self._host_reader: _HostReader | None = None
        self._watch: tuple[int, FrameType] | None = None
        # Seams for tests: the clock that schedules samples, the clock stamped on rows.
        self._monotonic = time.monotonic
        self._time = time.time
        self.timeline_path: Path | None = None

    # ------------------------------------------------------------------ properties
    @property
    def interval(self) -> float:
        """The seconds between samples."""
        return self._interval

    @property
    def gpus(self) -> list[GpuInfo]:
        """The GPUs being sampled; position `i` is `gpu{i}_*` in rows and aggregates."""
        return list(self._gpus)

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def samples(self) -> list[dict[str, float]]:
        """A copy of every row so far, oldest first, keyed by `timeline_columns`."""
        return self.samples_from(0)

    def samples_from(self, start: int) -> list[dict[str, float]]:
        """A copy of the rows from number `start` (0-based) on, e.g. those not yet seen.

        Args:
            start: int, the index of the first row to return.

        Returns:
            A list of row dicts, oldest first.
        """
        with self._lock:
            columns = {c: v[start:] for c, v in self._data.items()}
        n = len(columns["time"])
        return [{c: columns[c][k] for c in self._columns} for k in range(n)]

    # ------------------------------------------------------------------ control
    def mark(self, epoch: int | None = None, step: int | None = None) -> None:
        """Sets the epoch and/or step written on the rows that follow; None leaves it as is.

        Cheap (no NVML call), so it can run at every batch.

        Raises:
            TypeError: if `epoch` or `step` is neither None nor a number.
        """
        if epoch is not None:
            if not is_number(epoch):
                raise invalid_type("epoch", epoch, "an int or None")
            self._epoch = epoch
        if step is not None:
            if not is_number(step):
                raise invalid_type("step", step, "an int or None")
            self._step = step

    def start(self) -> Sampler:
        """Starts sampling (one sample now, then one per interval); a no-op if running.

        Returns:
            The sampler itself.
        """
        if self.running:
            return self
        if not self._gpus and not self._inventory.available:
            # A fact of the machine: said once per process, at the user's line.
            unchecked = (
                f" The GPU indices gpus={self._unchecked!r} could not be checked."
                if self._unchecked
                else ""
            )
            _warnings.warn_at_user_code(
                f"tfgpu.monitor records no GPU metrics: {self._inventory.error} "
                f"Host metrics are still recorded.{unchecked}",
                RuntimeWarning,
                once="tfgpu.monitor:no-nvml",
            )
        self._stop_event = threading.Event()  # a fresh one: a left-behind thread keeps its own
        self._t0 = self._time()
        if self._gpus:
            self._nv, self._readers = _open_readers(self._gpus, lambda: self._monotonic())
        self._host_reader = _HostReader() if self._host else None
        if self._dir is not None:
            self._open_files()
        self._sample()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop_event,), name="tfgpu-monitor", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Takes a last sample, stops the thread, closes the timeline. Idempotent."""
        self._stop_event.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(10.0, 5 * self._interval))
            if thread.is_alive():
                _log.warning(
                    "tfgpu.monitor: the sampler thread did not stop within %.0f s (a hung "
                    "NVML call?); it is a daemon and is left behind.",
                    max(10.0, 5 * self._interval),
                )

    def bind_to_frame(self, frame: FrameType, thread_id: int | None = None) -> None:
        """Stops sampling on its own once `frame` has left the stack of its thread.

        Lets a caller tie the sampler to a running function (Keras `fit`, a training loop):
        when that function returns or raises, the sampler stops within one interval, even if
        nobody calls `stop()`. `GPUMonitor` uses it because Keras does not call
        `on_train_end` when `fit` raises.

        Args:
            frame: the frame object of the running function (e.g. from `sys._getframe()`).
            thread_id: int or None, the thread running it. Defaults to the calling thread.
        """
        self._watch = (threading.get_ident() if thread_id is None else thread_id, frame)

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading
    def aggregate(self, since: float | None = None) -> dict[str, float]:
        """Returns the epoch-aggregate metrics over the rows with `time >= since`.

        If no row is that recent (an epoch shorter than the interval), the newest row stands
        in. Means and maxima ignore NaN; a metric with no value at all is NaN.

        Args:
            since: float or None, a unix time. Defaults to `None`: all rows.

        Returns:
            A dict keyed by `aggregate_keys(len(self.gpus))`.
        """
        with self._lock:
            times = self._data["time"]
            start = 0 if since is None else bisect.bisect_left(times, since)
            if start >= len(times) and len(times):
                start = len(times) - 1
            columns = {c: self._data[c][start:] for c in self._data}
        return _aggregate(columns, len(self._gpus))

    # ------------------------------------------------------------------ internals
    def _open_files(self) -> None:
        """Adds this session to run.json and opens the timeline; never raises."""
        if self._dir is None:
            return
        try:
            self._open_files_or_raise(self._dir)
        except Exception as e:  # OSError mostly (a full disk, a lost mount): never fatal
            self._file_failed = True
            _log.warning("tfgpu.monitor: cannot write to %s (%s); sampling goes on.", self._dir, e)

    def _open_files_or_raise(self, directory: Path) -> None:
        environ = os.environ
        task = _cluster(environ)
        info = {
            "tfgpu_version": _version(),
            "start_time": self._t0,
            "hostname": socket.gethostname(),
            "worker": None if task is None else task.task_index,
            "task_type": None if task is None else task.task_type,
            "pid": os.getpid(),
            "interval": self._interval,
            "timeline": artifact_name("timeline", ".csv", environ),
            "nvml_error": self._inventory.error,
            "driver_version": self._inventory.driver_version,
            "cuda_driver_version": self._inventory.cuda_driver_version,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "pci_bus_id": g.pci_bus_id,
                    "memory_total_mib": g.memory_total_mib,
                    "compute_capability": list(g.compute_capability)
                    if g.compute_capability
                    else None,
                }
                for g in self._gpus
            ],
        }
        header = ",".join(self._columns) + "\n"
        names = [artifact_name("run", ".json", environ)]
        if task is not None and task.is_chief:
            names.append("run.json")
        self.timeline_path = directory / artifact_name("timeline", ".csv", environ)
        self._file, rotated = open_csv(self.timeline_path, header)
        for name in names:
            if rotated is not None:
                _rename_timeline(directory / name, self.timeline_path.name, rotated.name)
            _files.add_session(directory / name, info)

    def _sample(self) -> None:
        """Takes one sample; never raises (side features never kill training)."""
        try:
            now = self._time()
            row = [now, now - self._t0, float(self._epoch), float(self._step)]
            if self._host_reader is not None:
                row.extend(self._host_reader.read())
            else:
                row.extend([_NAN] * len(HOST_METRICS))
            for position in range(len(self._gpus)):
                if position < len(self._readers):
                    row.extend(self._readers[position].read())
                else:
                    row.extend([_NAN] * len(GPU_METRICS))
            with self._lock:
                for column, value in zip(self._columns, row):
                    self._data[column].append(value)
            if self._file is not None:
                try:
                    line = ",".join(_format(c, v) for c, v in zip(self._columns, row))
                    self._file.write(line + "\n")
                    self._file.flush()
                except (OSError, ValueError) as e:
                    if not self._file_failed:
                        self._file_failed = True
                        _log.warning(
                            "tfgpu.monitor: writing the timeline failed (%s); samples stay in "
                            "memory.",
                            e,
                        )
        except Exception:
            if not self._sample_failed:
                self._sample_failed = True
                _log.exception("tfgpu.monitor: a sample failed; sampling goes on. (Logged once.)")

    def _watched_frame_gone(self) -> bool:
        if self._watch is None:
            return False
        thread_id, target = self._watch
        frame = sys._current_frames().get(thread_id)
        while frame is not None:
            if frame is target:
                return False
            frame = frame.f_back
        return True

    def _run(self, stop: threading.Event | None = None) -> None:
        stop = self._stop_event if stop is None else stop
        try:
            deadline = self._monotonic() + self._interval
            while not stop.wait(max(0.0, deadline - self._monotonic())):
                self._sample()
                deadline = _next_deadline(deadline, self._monotonic(), self._interval)
                if self._watched_frame_gone():
                    _log.debug("tfgpu.monitor: the watched function ended; stopping.")
                    break
            self._sample()
        except Exception:  # pragma: no cover (_sample never raises; a last line of defence)
            _log.exception("tfgpu.monitor: the sampler thread failed; sampling stops.")
        finally:
            self._close()

    def _close(self) -> None:
        self._watch = None  # drop the frame reference (it holds the caller's locals)
        if self._file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._file.close()
            self._file = None
        _close_readers(self._nv, self._readers)
        self._nv = None
        self._readers = []


def _next_deadline(deadline: float, now: float, interval: float) -> float:
    """Pure: when the next sample is due. Keeps the rhythm; after a stall (a sample that took
    longer than the interval) it waits at least a tenth of an interval, never busy-loops."""
    return max(deadline + interval, now + 0.1 * interval)


def _rename_timeline(record: Path, old: str, new: str) -> None:
    """Points the sessions of `record` (a run.json) that name timeline `old` to `new`.

    Called when the timeline was rotated, before the new session is added. A record that
    is missing or damaged is left to `_files.add_session` (which moves a damaged one aside).
    """
    try:
        data = _files.read_json_object(record)
    except (OSError, ValueError):
        return
    changed = False
    sessions = [data, *(data.get(_files.EARLIER_SESSIONS) or [])]
    for session in sessions:
        if isinstance(session, dict) and session.get("timeline") == old:
            session["timeline"] = new
            changed = True
    if changed:
        _files.write_text_atomic(record, json.dumps(data, indent=2, default=str) + "\n")


def _version() -> str:
    try:
        from tfgpu import __version__

        return __version__
    except ImportError:  # pragma: no cover
        return "unknown"


def record(
    log_dir: str | os.PathLike | None = None,
    *,
    interval: float = 0.2,
    gpus: Sequence[int] | None = None,
) -> Sampler:
    """Samples GPUs and host for the duration of a `with` block; works without Keras.

    The arguments are checked at the call, before the block runs.

    Args:
        log_dir: str, os.PathLike or None, the run directory for `run.json` and
            `timeline.csv`. Defaults to `None`: samples in memory only.
        interval: float, seconds between samples. Defaults to `0.2`.
        gpus: list of int or None, GPUs to sample, numbered after `CUDA_VISIBLE_DEVICES`
            (see `Sampler`). Defaults to `None`: all this process can use.

    Returns:
        A `Sampler`, checked but not started: `with` starts it and stops it on exit, also
        when the block raises.

    Raises:
        ValueError: for an `interval` below 0.01, an unknown GPU index (checked when NVML is
            available), a `log_dir` that is or lies under a file or cannot be written.
        TypeError: for arguments of the wrong type.

    Example:

    ```python
    with tfgpu.monitor.record("runs/exp1", interval=0.5) as run:
        for step, batch in enumerate(data):
            run.mark(step=step)
            train_step(batch)
    print(run.aggregate()["gpu0_util_pct_mean"])
    ```
    """
    return Sampler(interval=interval, gpus=gpus, log_dir=log_dir)
