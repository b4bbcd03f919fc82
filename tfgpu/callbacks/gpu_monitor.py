"""`GPUMonitor`: GPU and host metrics during `fit`, epoch aggregates into the Keras `logs`."""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import keras

from tfgpu._internal.adapters import devices, keras_internals
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import (
    check_bool,
    check_dir,
    check_gpus,
    check_interval,
    invalid_type,
    invalid_value,
)
from tfgpu._internal.helpers.files import writable_dir
from tfgpu.callbacks._steps import known_epoch_steps, optimizer_steps, steps_between
from tfgpu.monitor.sampler import Sampler

_log = logging.getLogger(__name__)
_NAN = float("nan")


class GPUMonitor(keras.callbacks.Callback):
    """Records GPU and host metrics during `fit`; epoch aggregates go into `logs`.

    A `tfgpu.monitor.Sampler` thread samples during `fit` (never the training thread). Logs
    `gpu_util_pct_mean`, `gpu_util_pct_min`, `gpu_mem_used_mib_max`, `gpu_power_w_total`,
    `gpu_sm_active_pct_mean`, `gpu_tensor_active_pct_mean`, `gpu_pcie_mib_per_step`,
    `joules_per_example`, `host_cpu_pct_mean`, `host_rss_mib_max` (some only where known);
    with `per_gpu_logs`, `gpu{i}_util_pct_mean`, ..., `gpu{i}_sm_active_pct_mean`,
    `gpu{i}_tensor_active_pct_mean`, `gpu{i}_pcie_mib_per_step`. List it before the callbacks
    that read `logs`. The guide: docs/metrics.md, "In the Keras logs" and "Arguments".

    Args:
        log_dir: str, os.PathLike or None, the run directory. Defaults to `None`: `logs` only.
        interval: float, seconds between samples, at least 0.01. Defaults to `0.2`.
        gpus: list of int or None, the GPUs to sample, as `/GPU:i`. Defaults to `None`: all.
        tensorboard: bool or path, also write TensorBoard scalars: `True` into
            `<log_dir>/tensorboard`, a path there. Defaults to `False`.
        host: bool, whether to read the host's CPU and memory. Defaults to `True`.
        per_gpu_logs: bool, whether to log every GPU's keys too. Defaults to `False`.

    Raises:
        ValueError: for an `interval` below 0.01, an unseen or repeated GPU, a bad `log_dir`,
            or `tensorboard=True` without `log_dir`.
        TypeError: for an argument of the wrong type (`per_gpu_logs="yes"`).

    Warns:
        RuntimeWarning: when `gpus` is given and NVML is not available to check it.

    Example:

    >>> monitor = tfgpu.callbacks.GPUMonitor("runs/exp1")
    >>> history = model.fit(x, y, epochs=3, callbacks=[monitor])
    >>> history.history["host_cpu_pct_mean"]  # one value per epoch
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None = None,
        *,
        interval: float = 0.2,
        gpus: list[int] | None = None,
        tensorboard: bool | str | os.PathLike = False,
        host: bool = True,
        per_gpu_logs: bool = False,
    ) -> None:
        super().__init__()
        check_bool("per_gpu_logs", per_gpu_logs)
        if isinstance(tensorboard, bytes) or not isinstance(tensorboard, (bool, str, os.PathLike)):
            raise invalid_type("tensorboard", tensorboard, "a bool or a directory path")
        if tensorboard is True and log_dir is None:
            raise invalid_value(
                "tensorboard",
                tensorboard,
                "a `log_dir` to write `<log_dir>/tensorboard` into, or a directory path as "
                "`tensorboard`",
                received="tensorboard=True with log_dir=None",
            )
        interval = check_interval(interval)
        self._gpus = check_gpus(gpus)
        path = None if log_dir is None else writable_dir(log_dir, "log_dir")
        self._tb_dir: Path | None = None
        if tensorboard is True and path is not None:  # path is None: refused above
            self._tb_dir = check_dir("tensorboard", path / "tensorboard")
        elif tensorboard is not False:
            self._tb_dir = writable_dir(tensorboard, "tensorboard")
        self._new_sampler = functools.partial(Sampler, interval=interval, log_dir=path, host=host)
        self._sampled = devices.cuda_indices(self._gpus)  # TensorFlow's numbering
        self.sampler = self._new_sampler(gpus=self._sampled)  # validates the rest now
        self.log_dir = path
        self.per_gpu_logs = per_gpu_logs
        self.async_safe = True  # no batch-end hook; never forces Keras to sync per batch
        self._used = False
        self._epoch_start: float | None = None
        self._epoch_batches = 0
        self._optimizer_at_begin: int | None = None
        self._batch_size: int | None = None
        self._tb_writer: Any = None
        self._tb_t0: float | None = None
        self._tb_written = 0
        self._reported: set[str] = set()
        self._watch: keras_internals.FitWatch | None = None  # the fit being monitored

    def on_train_begin(self, logs=None):
        watch = self._watch
        if watch is not None and watch.thread_id != threading.get_ident() and watch.running():
            raise RuntimeError(
                "GPUMonitor: this callback is already monitoring a `fit` running in another "
                "thread; its samples would stop when the first one ends. Give each `fit` that "
                "runs at the same time its own GPUMonitor(...)."
            )
        try:
            if self.sampler.running:  # a previous fit that raised, or another model's fit
                self.sampler.stop()
            self._write_tensorboard()
            # TensorFlow's visible GPUs may have changed since construction (configure()).
            sampled = devices.cuda_indices(self._gpus)
            if self._used or sampled != self._sampled:
                self._sampled = sampled
                self.sampler = self._new_sampler(gpus=sampled)
                self._tb_written = 0
            self._used = True
            self._batch_size = keras_internals.fit_batch_size(self.model)
            self.sampler.start()  # warns (once, at the user's fit line) when NVML is missing
            # A `fit` that raises skips on_train_end: stop when the loop driving the hooks returns.
            self._watch = keras_internals.when_fit_ends(self.sampler.stop, __name__)
        except Warning:
            raise  # the user's warning filters made the NVML warning an error
        except Exception as e:  # side features never kill training
            self._report("could not start sampling", e)
        if self._tb_t0 is None:
            self._tb_t0 = time.time()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.time()
        self._epoch_batches = 0
        # An epoch of unknown length: the optimizer counts the steps that really ran.
        unknown = known_epoch_steps(self.params) is None
        self._optimizer_at_begin = optimizer_steps(self.model) if unknown else None
        self._mark(epoch=epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self._epoch_batches = batch + 1 if isinstance(batch, int) else self._epoch_batches
        self._mark(step=batch)

    def _mark(self, **label: Any) -> None:
        try:
            self.sampler.mark(**label)
        except TypeError as e:  # a custom loop passing a label that is not a number
            self._report("could not label the samples", e)

    def on_epoch_end(self, epoch, logs=None):
        try:
            agg = self.sampler.aggregate(since=self._epoch_start)
            seconds = time.time() - self._epoch_start if self._epoch_start else _NAN
            gpus, steps = len(self.sampler.gpus), self._epoch_steps()
            keys = _epoch_logs(agg, gpus, seconds, steps, self._batch_size, self.per_gpu_logs)
        except Exception as e:  # the hook's boundary: side features never kill training
            self._report("could not aggregate the samples", e)
            keys = {}
        if logs is not None:
            logs.update(keys)
        self._write_tensorboard()

    def on_train_end(self, logs=None):
        try:
            self.sampler.stop()
        except RuntimeError as e:  # a sampler thread that never started cannot be joined
            self._report("could not stop sampling", e)
        self._write_tensorboard()
        if self._tb_writer is not None:
            import tensorflow as tf  # loaded already: it made the writer

            try:
                self._tb_writer.flush()
            except tf.errors.OpError as e:  # e.g. a log directory gone or full
                self._report("could not flush TensorBoard", e)

    def _epoch_steps(self) -> int:
        """The steps the epoch ran: Keras's length, else the optimizer's count, else the batches."""
        steps = known_epoch_steps(self.params)
        if steps is None and self._optimizer_at_begin is not None:
            steps = steps_between(self._optimizer_at_begin, optimizer_steps(self.model))
        return steps or self._epoch_batches  # none counted: the batches begun

    def _report(self, what: str, error: Exception) -> None:
        """Logs a failure of this side feature once per kind; training goes on."""
        if what not in self._reported:
            self._reported.add(what)
            _log.warning("GPUMonitor %s (%r); training goes on. (Logged once.)", what, error)

    def _write_tensorboard(self) -> None:
        if self._tb_dir is None:
            return
        try:
            import tensorflow as tf

            if self._tb_writer is None:
                self._tb_writer = tf.summary.create_file_writer(str(self._tb_dir))
            rows = self.sampler.samples_from(self._tb_written)
            t0 = self._tb_t0 if self._tb_t0 is not None else time.time()
            # What tf.summary.scalar writes, without needing the tensorboard package.
            scalar = tf.compat.v1.SummaryMetadata(
                plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
            ).SerializeToString()
            with self._tb_writer.as_default():
                for row in rows:
                    step = round((row["time"] - t0) * 1000)
                    for key, value in row.items():
                        if key not in ("time", "elapsed_s", "epoch", "step") and value == value:
                            tensor = tf.constant(value, tf.float32)
                            tf.summary.write(f"monitor/{key}", tensor, step=step, metadata=scalar)
            self._tb_written += len(rows)
        except Exception as e:  # the TensorBoard side feature's boundary: never kills training
            _log.warning("GPUMonitor: TensorBoard scalars disabled (%s).", e)
            self._tb_dir = None


# Per-GPU keys, with `per_gpu_logs=True`: always these ...
_PER_GPU = (
    "util_pct_mean", "util_pct_max", "mem_used_mib_mean", "mem_used_mib_max", "power_w_mean",
    "power_w_max",
)  # fmt: skip
# ... and these where at least one GPU has a value (GPM: Hopper or newer).
_PER_GPU_WHERE_KNOWN = ("sm_active_pct_mean", "tensor_active_pct_mean")
_HOST = ("host_cpu_pct_mean", "host_rss_mib_max")

_SUMMARY_KEYS = (
    "gpu_util_pct_mean", "gpu_util_pct_min", "gpu_mem_used_mib_max", "gpu_power_w_total",
    "gpu_sm_active_pct_mean", "gpu_tensor_active_pct_mean", "gpu_pcie_mib_per_step",
    "joules_per_example", *_HOST,
)  # fmt: skip
"""Every key `GPUMonitor` may log by default, in order (some only where known)."""


def _epoch_logs(
    aggregates: dict[str, float],
    num_gpus: int,
    seconds: float,
    steps: int,
    batch_size: int | None,
    per_gpu: bool = False,
) -> dict[str, float]:
    """Pure: what `GPUMonitor` logs from the epoch's aggregates (which, when: docs/metrics.md)."""
    gpus = range(num_gpus)

    def column(key: str) -> list[float]:
        return [aggregates.get(f"gpu{i}_{key}", _NAN) for i in gpus]

    timed = steps > 0 and seconds == seconds and seconds > 0
    traffic = zip(column("pcie_tx_mib_s_mean"), column("pcie_rx_mib_s_mean"))
    pcie = [(tx + rx) * seconds / steps if timed else _NAN for tx, rx in traffic]
    known = {key: column(key) for key in _PER_GPU_WHERE_KNOWN}
    known = {k: v for k, v in {**known, "pcie_mib_per_step": pcie}.items() if stats.finite(v)}
    logs: dict[str, float] = {}
    if num_gpus:
        util = column("util_pct_mean")
        logs["gpu_util_pct_mean"] = stats.mean(util)
        if num_gpus > 1:
            logs["gpu_util_pct_min"] = min(stats.finite(util), default=_NAN)
        logs["gpu_mem_used_mib_max"] = max(stats.finite(column("mem_used_mib_max")), default=_NAN)
        # A total is only a total over every GPU: one without a power reading makes it NaN.
        power = stats.finite(column("power_w_mean"))
        logs["gpu_power_w_total"] = math.fsum(power) if len(power) == num_gpus else _NAN
        for key, values in known.items():  # PCIe: all GPUs' traffic; the others a mean
            total = key == "pcie_mib_per_step"
            logs[f"gpu_{key}"] = math.fsum(stats.finite(values)) if total else stats.mean(values)
    energy = column("energy_j")
    if batch_size and steps > 0 and energy and all(e == e for e in energy):
        logs["joules_per_example"] = math.fsum(energy) / (batch_size * steps)
    if per_gpu:
        logs.update({f"gpu{i}_{key}": column(key)[i] for i in gpus for key in _PER_GPU})
        logs.update({f"gpu{i}_{key}": values[i] for key, values in known.items() for i in gpus})
    logs.update({key: aggregates.get(key, _NAN) for key in _HOST})
    return logs
