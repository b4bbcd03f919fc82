"""`Sampler` and `record`: a background thread that records GPU and host metrics at an interval."""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers import warn
from tfgpu._internal.helpers.checks import (
    check_bool,
    check_gpus,
    check_interval,
    invalid_type,
    invalid_value,
    is_number,
)
from tfgpu._internal.helpers.files import RunCsv, writable_dir
from tfgpu.monitor._gpu_reader import GpuReader, close_readers, open_readers
from tfgpu.monitor._metrics import HOST_METRICS, aggregate_columns, timeline_columns
from tfgpu.monitor._run_files import add_session, format_row, session_record
from tfgpu.monitor.host import HostReader
from tfgpu.monitor.nvml import GpuInfo, inventory, visible_gpus

_log = logging.getLogger(__name__)
_NAN = float("nan")
# A rate from two counter readings needs a window of this share of an interval (docs/metrics.md).
_RATE_MIN_SHARE = 0.5


class Sampler:
    """Samples this process's GPUs and the host in a background thread.

    A row of `tfgpu.monitor.METRICS` as it starts, every `interval` seconds and at `stop()`,
    NaN where a GPU or NVML gives nothing; with `log_dir`, `run.json` and `timeline.csv` there.
    The guide: docs/metrics.md, "Arguments" (the sampler) and "Timeline columns".

    Args:
        interval: float, seconds between samples, at least 0.01. Defaults to `0.2`.
        gpus: list of int or None, the GPUs to sample, as CUDA numbers them. Defaults to `None`.
        log_dir: str, os.PathLike or None, the run directory. Defaults to `None`: in memory.
        host: bool, whether to read host metrics (else NaN). Defaults to `True`.

    Raises:
        ValueError: for an `interval` below 0.01, an unseen or repeated GPU, a bad `log_dir`.
        TypeError: for an argument of the wrong type.

    Warns:
        RuntimeWarning: when `gpus` is given and NVML is not available to check it.

    Example:

    >>> sampler = tfgpu.monitor.Sampler(interval=0.5, log_dir="runs/exp1").start()
    >>> train()
    >>> sampler.stop()
    >>> sampler.aggregate()["gpu0_util_pct_mean"]  # 87.5
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
        check_bool("host", host)
        self._dir = None if log_dir is None else writable_dir(log_dir, "log_dir")
        self._host = host
        self._inventory = inventory()
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = visible_gpus(self._inventory.gpus, cvd)
        if requested is None:
            self._gpus = visible
        elif not self._inventory.available:
            self._gpus = []  # nothing to sample, and nothing to check the indices against
            warn.warn_at_user_code(
                f"Argument `gpus` cannot be checked: NVML is not available. Received: "
                f"gpus={requested!r}. No GPU is sampled. {self._inventory.error}",
                RuntimeWarning,
            )
        elif any(g >= len(visible) for g in requested):
            n = len(visible)
            valid = f"one of {list(range(n))}" if visible else "no index (it sees none)"
            where = f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""
            raise invalid_value(
                "gpus",
                requested,
                f"indices below {n}: this process sees {n} GPU(s), so each index must be "
                f"{valid}{where}",
            )
        else:
            self._gpus = [visible[g] for g in requested]
        self._columns = timeline_columns(len(self._gpus))
        # A column store of doubles: about 8 bytes per value, however long the run.
        self._data: dict[str, array] = {c: array("d") for c in self._columns}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._first_row = threading.Event()  # set by the thread once its first row is in
        self._thread: threading.Thread | None = None
        self._csv: RunCsv | None = None
        self._sample_failed = False
        self._epoch = self._step = _NAN
        self._t0 = 0.0
        self._nv: Any = None
        self._readers: list[GpuReader] = []
        self._host_reader: HostReader | None = None
        # Seams for tests: the clock that schedules samples, the clock stamped on rows.
        self._monotonic = time.monotonic
        self._time = time.time
        self.timeline_path: Path | None = None

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
        """A copy of the rows from number `start` (0-based) on, e.g. those not yet seen."""
        with self._lock:
            columns = {c: v[start:] for c, v in self._data.items()}
        return [{c: columns[c][k] for c in self._columns} for k in range(len(columns["time"]))]

    def mark(self, epoch: int | None = None, step: int | None = None) -> None:
        """Sets the epoch and/or step written on the rows that follow; None leaves it as is.

        Raises:
            TypeError: for a label that is neither None nor a number.
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
        """Starts the thread (a no-op if running) and returns the sampler, without waiting on
        NVML: the thread takes the first row."""
        if self.running:
            return self
        if not self._gpus and not self._inventory.available:
            warn.warn_at_user_code(  # a fact of the machine: once per process
                f"tfgpu.monitor records no GPU metrics: {self._inventory.error} "
                "Host metrics are still recorded.",
                RuntimeWarning,
                once="tfgpu.monitor:no-nvml",
            )
        self._stop_event = threading.Event()  # a fresh one: a left-behind thread keeps its own
        self._first_row = threading.Event()
        self._t0 = self._time()
        self._open_files()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop_event,), name="tfgpu-monitor", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Takes a last sample, stops the thread, closes the timeline. Idempotent."""
        self._stop_event.set()
        thread, wait = self._thread, max(10.0, 5 * self._interval)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=wait)
            if thread.is_alive():
                _log.warning(
                    "tfgpu.monitor: the sampler thread did not stop within %.0f s (a hung "
                    "NVML call?); it is a daemon and is left behind.",
                    wait,
                )

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def aggregate(self, since: float | None = None) -> dict[str, float]:
        """Returns the epoch aggregates (docs/metrics.md) over the rows with `time >= since`.

        Args:
            since: float or None, a unix time (the newest row if none is that recent).
                Defaults to `None`: all rows.

        Returns:
            A dict keyed by `aggregate_keys(len(self.gpus))`.
        """
        with self._lock:
            times = self._data["time"]
            start = 0 if since is None else bisect.bisect_left(times, since)
            if start >= len(times) and len(times):
                start = len(times) - 1
            columns = {c: self._data[c][start:] for c in self._data}
        return aggregate_columns(columns, len(self._gpus))

    def _open_files(self) -> None:
        """Adds this session to run.json and opens the timeline; never raises."""
        directory, environ = self._dir, os.environ
        if directory is None:
            return
        try:
            info = session_record(self._t0, self._interval, self._inventory, self._gpus, environ)
            self.timeline_path = directory / info["timeline"]

            def restart() -> str:
                """The run directory was removed: this session again, and its rows so far."""
                add_session(directory, info, None, environ)
                with self._lock:
                    rows = list(zip(*(self._data[c] for c in self._columns)))[:-1]
                return "".join(format_row(self._columns, row) + "\n" for row in rows)

            self._csv = RunCsv(
                self.timeline_path,
                ",".join(self._columns) + "\n",
                log=_log,
                who="tfgpu.monitor",
                name="the timeline",
                kept="samples stay in memory",
                restart=restart,
            )
            add_session(directory, info, self._csv.rotated, environ)
        # A full disk, a lost mount; a damaged run.json, Slurm variables that are not numbers.
        except (OSError, ValueError, TypeError) as e:
            _log.warning("tfgpu.monitor: cannot write to %s (%s); sampling goes on.", directory, e)

    def _sample(self) -> None:
        """Takes one sample; never raises (side features never kill training)."""
        try:
            now = self._time()
            row = [now, now - self._t0, float(self._epoch), float(self._step)]
            host = self._host_reader
            row.extend(host.read() if host is not None else [_NAN] * len(HOST_METRICS))
            for reader in self._readers:
                row.extend(reader.read())
            row.extend([_NAN] * (len(self._columns) - len(row)))  # GPUs without NVML: NaN
            with self._lock:
                for column, value in zip(self._columns, row):
                    self._data[column].append(value)
            if self._csv is not None:
                self._csv.write(format_row(self._columns, row) + "\n")
        except Exception:  # the tick's boundary: a failed sample never stops sampling or training
            if not self._sample_failed:
                self._sample_failed = True
                _log.exception("tfgpu.monitor: a sample failed; sampling goes on. (Logged once.)")

    def _run(self, stop: threading.Event) -> None:
        """The sampler thread: a row at once, one per interval until `stop` is set, a last one."""
        try:  # _sample never raises: it is the boundary of each tick
            clock, window = (lambda: self._monotonic()), self._interval * _RATE_MIN_SHARE
            self._nv, self._readers = open_readers(self._gpus, clock, window)
            self._host_reader = HostReader(clock, window) if self._host else None
            self._sample()
            self._first_row.set()
            deadline = self._monotonic() + self._interval
            while not stop.wait(max(0.0, deadline - self._monotonic())):
                self._sample()
                deadline = _next_deadline(deadline, self._monotonic(), self._interval)
            self._sample()
        finally:
            self._close()

    def _close(self) -> None:
        if self._csv is not None:
            self._csv.close()
            self._csv = None
        close_readers(self._nv, self._readers)
        self._nv, self._readers, self._host_reader = None, [], None


def _next_deadline(deadline: float, now: float, interval: float) -> float:
    """When the next sample is due: on the rhythm, after a stall a tenth of an interval away."""
    return max(deadline + interval, now + 0.1 * interval)


def record(
    log_dir: str | os.PathLike | None = None,
    *,
    interval: float = 0.2,
    gpus: Sequence[int] | None = None,
) -> Sampler:
    """Samples GPUs and host for the duration of a `with` block (docs/metrics.md, "Arguments").

    Args:
        log_dir: str, os.PathLike or None, the run directory. Defaults to `None`: in memory.
        interval: float, seconds between samples. Defaults to `0.2`.
        gpus: list of int or None, as `Sampler`'s. Defaults to `None`: all this process uses.

    Returns:
        A `Sampler`, checked but not started: `with` starts it and stops it on exit.

    Raises:
        ValueError: for an `interval` below 0.01, an unseen or repeated GPU, a bad `log_dir`.
        TypeError: for an argument of the wrong type.

    Example:

    >>> with tfgpu.monitor.record("runs/exp1", interval=0.5) as run:
    ...     train()  # any code; run.mark(step=...) labels the rows that follow
    >>> run.aggregate()["gpu0_util_pct_mean"]
    """
    return Sampler(interval=interval, gpus=gpus, log_dir=log_dir)
