"""Keras 3 callbacks: `GPUMonitor`, `StepTimer` and `BackupAndRestore`.

`GPUMonitor` runs `tfgpu.monitor.Sampler` during `fit` and puts epoch aggregates into the
Keras `logs`; `StepTimer` measures step time and throughput. Both are backend-agnostic
(`keras.callbacks.Callback`, no TensorFlow op on the training path) and list the keys they
log; `docs/metrics.md` is the one table of all keys.

Place them before callbacks that read `logs` (`CSVLogger`, `TensorBoard`, `EarlyStopping`):
Keras hands the same `logs` dict to the callbacks in list order (`History` always comes last).
"""

from __future__ import annotations

import collections
import heapq
import logging
import math
import numbers
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from types import FrameType
from typing import Any, TypedDict

import keras

from tfgpu._checks import check_dir, check_int, check_number, invalid_type
from tfgpu.monitor.sampler import (
    Sampler,
    artifact_name,
    check_gpus,
    check_interval,
    check_log_dir,
    open_csv,
)

__all__ = ["BackupAndRestore", "GPUMonitor", "StepTimer"]  # noqa: F822 (lazy)

_log = logging.getLogger("tfgpu.callbacks")
_NAN = float("nan")


class _SamplerConfig(TypedDict):
    """`GPUMonitor`'s `Sampler` arguments other than `gpus`."""

    interval: float
    path: str | os.PathLike | None
    host: bool


def __getattr__(name: str):
    # BackupAndRestore lives with the distributed-training code; loaded on first use.
    if name == "BackupAndRestore":
        from tfgpu._backup import BackupAndRestore

        return BackupAndRestore
    raise AttributeError(f"module 'tfgpu.callbacks' has no attribute {name!r}")


def _training_frame() -> FrameType | None:
    """The frame of the function driving the callbacks: Keras `fit`, or a custom loop.

    The first frame, going outwards, that belongs neither to this module nor to
    `keras.src.callbacks` (the `CallbackList` dispatching the hook).
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and not module.startswith("keras.src.callbacks"):
            return frame
        frame = frame.f_back
    return None


def _infer_batch_size() -> int | None:
    """The batch size of the running `fit`, read from its `epoch_iterator`'s data adapter."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if "epoch_iterator" in frame.f_code.co_varnames:
            iterator = frame.f_locals.get("epoch_iterator")
            adapter = getattr(iterator, "data_adapter", None)
            try:
                size = adapter.batch_size if adapter is not None else None
            except Exception:  # an adapter that cannot tell
                size = None
            if isinstance(size, numbers.Integral) and int(size) > 0:
                return int(size)
            return None
        frame = frame.f_back
    return None


def _tf_gpu_positions() -> list[int] | None:
    """Where TensorFlow's GPUs are among the CUDA-visible ones: `/GPU:i` is at entry `i`.

    `tf.config.set_visible_devices` (which `tfgpu.configure(gpus=...)` calls) hides physical
    GPUs from TensorFlow without changing `CUDA_VISIBLE_DEVICES`, which is all NVML knows
    about. None when TensorFlow is not loaded (this module never imports it for that) or
    lists no GPU: then there is nothing to map. Never raises.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        physical = [d.name for d in tf.config.list_physical_devices("GPU")]
        if not physical:
            return None
        visible = [d.name for d in tf.config.get_visible_devices("GPU")]
    except Exception:  # a TensorFlow without tf.config (a stub), a broken runtime
        return None
    return [physical.index(name) for name in visible if name in physical]


def _sampler_gpus(requested: list[int] | None, positions: list[int] | None) -> list[int] | None:
    """The CUDA-visible positions to sample for GPUs numbered as TensorFlow does. Pure.

    Args:
        requested: list of int or None, the user's `gpus` (`/GPU:i` indices), None for all.
        positions: list of int or None, from `_tf_gpu_positions`; None: no mapping.

    Returns:
        The `gpus` argument for `tfgpu.monitor.Sampler`.

    Raises:
        ValueError: if an index names no GPU TensorFlow uses.
    """
    if positions is None:
        return requested
    if requested is None:
        return list(positions)
    unknown = [g for g in requested if isinstance(g, int) and not 0 <= g < len(positions)]
    if unknown:
        raise ValueError(
            f"Invalid value for argument `gpus`. Received: gpus={list(requested)!r}. Expected "
            f"indices below {len(positions)}: TensorFlow uses {len(positions)} GPU(s) "
            "(`tf.config.set_visible_devices` / `tfgpu.configure(gpus=...)`), and `gpus` "
            "numbers them as TensorFlow does (`/GPU:0` is 0)."
        )
    return [positions[g] for g in requested]


class GPUMonitor(keras.callbacks.Callback):
    """Records GPU and host metrics during `fit`; epoch aggregates go into `logs`.

    A `tfgpu.monitor.Sampler` thread starts at `on_train_begin` and samples every
    `interval` seconds, without any NVML call on the training thread (batch hooks only set
    the epoch/step labels). It stops at `on_train_end`, and also when `fit` raises (Keras
    then skips `on_train_end`): the sampler watches `fit`'s frame and stops within one
    interval of `fit` leaving the stack, so failing retries in a notebook never pile up
    threads.

    Logs at `on_epoch_end` (NaN-ignoring, over the samples taken during the epoch), per
    sampled GPU `i`: `gpu{i}_util_pct_mean`, `gpu{i}_util_pct_max`,
    `gpu{i}_mem_used_mib_mean`, `gpu{i}_mem_used_mib_max`, `gpu{i}_power_w_mean`,
    `gpu{i}_power_w_max`; and for the host: `host_cpu_pct_mean`, `host_rss_mib_max`. Where
    known (left out when NaN for every GPU, so GPUs without GPM get no clutter):
    `gpu{i}_sm_active_pct_mean` and `gpu{i}_tensor_active_pct_mean` (GPM, Hopper and
    newer), `gpu{i}_pcie_mib_per_step` (PCIe TX+RX MiB per training step) and
    `joules_per_example` (all sampled GPUs' energy over the epoch / examples trained; needs
    the batch size, read from `fit` as `StepTimer` does).
    `History`, `CSVLogger` and Keras's `TensorBoard` see them (list `GPUMonitor` before the
    latter two). Sources and units: `docs/metrics.md`.

    With `log_dir`, writes there `run.json` and `timeline.csv`, one row per sample with its
    epoch and step, flushed as written (a SIGKILL loses at most the last interval). In a
    multi-worker cluster (`TF_CONFIG`) each worker records its own GPUs to
    `timeline-worker{k}.csv` (`run-worker{k}.json`). A later `fit` (or run) appends to the
    timeline; a timeline with other columns (another GPU count) is moved aside to
    `timeline.1.csv` (`.2`, ...), never truncated, and `run.json` keeps earlier sessions
    under `"earlier_sessions"`.

    Monitoring never stops training: a failure to sample, to write (a full disk) or to
    reach NVML is logged once, recorded as NaN or kept in memory, and `fit` goes on. Without
    NVML, one `RuntimeWarning` per process, at the user's `fit` line (scripts, `python -c`,
    standard input, IPython and Jupyter alike).

    Args:
        log_dir: str, os.PathLike or None, the run directory (created if missing).
            Defaults to `None`: aggregates into `logs` only, no files.
        interval: float, seconds between samples, at least 0.01. Defaults to `0.2`.
        gpus: list of int or None, GPUs to sample as TensorFlow numbers them (`/GPU:i`,
            after `CUDA_VISIBLE_DEVICES` and `tf.config.set_visible_devices` /
            `tfgpu.configure(gpus=...)`). Defaults to `None`: all GPUs TensorFlow uses (all
            CUDA-visible GPUs when TensorFlow is not loaded or lists none).
        tensorboard: bool or path, also write every sample as TensorBoard scalars (tags
            `monitor/<column>`, step = milliseconds since the first `fit` began), at each
            epoch end: `True` writes to `<log_dir>/tensorboard`, a path writes there.
            Needs TensorFlow. Defaults to `False`.
        host: bool, whether to record host CPU and memory. Defaults to `True`.

    Raises:
        ValueError: for an `interval` below 0.01, a negative or repeated GPU index or
            (when NVML is available) one this process does not see, a `log_dir` that is or
            lies under a file or cannot be written, or `tensorboard=True` without `log_dir`; at
            construction, before any training.
        TypeError: for arguments of the wrong type.

    Example:

    ```python
    history = model.fit(x, y, epochs=3, callbacks=[tfgpu.callbacks.GPUMonitor("runs/exp1")])
    history.history["gpu0_util_pct_mean"]   # one value per epoch
    ```
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None = None,
        interval: float = 0.2,
        gpus: list[int] | None = None,
        tensorboard: bool | str | os.PathLike = False,
        host: bool = True,
    ):
        super().__init__()
        if isinstance(tensorboard, bytes) or not isinstance(tensorboard, (bool, str, os.PathLike)):
            raise invalid_type("tensorboard", tensorboard, "a bool or a directory path")
        if tensorboard is True and log_dir is None:
            raise ValueError(
                "Invalid value for argument `tensorboard`. Received: tensorboard=True with "
                "log_dir=None. Expected a `log_dir` to write `<log_dir>/tensorboard` into, "
                "or a directory path as `tensorboard`."
            )
        interval = check_interval(interval)
        self._gpus = check_gpus(gpus)
        path = None if log_dir is None else check_log_dir(log_dir, "log_dir")
        if tensorboard is True:
            if path is None:  # rejected above; narrows the type
                raise AssertionError("tensorboard=True needs log_dir")
            self._tb_dir: Path | None = check_dir("tensorboard", path / "tensorboard")
        elif tensorboard is False:
            self._tb_dir = None
        else:
            self._tb_dir = check_log_dir(tensorboard, "tensorboard")
        self._config: _SamplerConfig = {"interval": interval, "path": path, "host": host}
        self._sampled = _sampler_gpus(self._gpus, _tf_gpu_positions())  # TensorFlow's numbering
        self.sampler = Sampler(**self._config, gpus=self._sampled)  # validates the rest now
        self.log_dir = path
        self.async_safe = True  # no batch-end hook; never forces Keras to sync per batch
        self._used = False
        self._epoch_start: float | None = None
        self._epoch_batches = 0
        self._batch_size: int | None = None
        self._tb_writer: Any = None
        self._tb_t0: float | None = None
        self._tb_written = 0
        self._reported: set[str] = set()

    # Keras hooks ---------------------------------------------------------------
    def on_train_begin(self, logs=None):
        try:
            if self.sampler.running:  # a previous fit that raised, or another model's fit
                self.sampler.stop()
            self._write_tensorboard()
            # TensorFlow's visible GPUs may have changed since construction (configure()).
            sampled = _sampler_gpus(self._gpus, _tf_gpu_positions())
            if self._used or sampled != self._sampled:
                self._sampled = sampled
                self.sampler = Sampler(**self._config, gpus=sampled)
                self._tb_written = 0
            self._used = True
            self._batch_size = _infer_batch_size()
            self.sampler.start()  # warns (once, at the user's fit line) when NVML is missing
            frame = _training_frame()
            if frame is not None:
                self.sampler.bind_to_frame(frame)
        except Warning:
            raise  # the user's warning filters made the NVML warning an error
        except Exception as e:  # side features never kill training
            self._report("could not start sampling", e)
        if self._tb_t0 is None:
            self._tb_t0 = time.time()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.time()
        self._epoch_batches = 0
        try:
            self.sampler.mark(epoch=epoch)
        except Exception as e:
            self._report("could not label the samples", e)

    def on_train_batch_begin(self, batch, logs=None):
        self._epoch_batches = batch + 1 if isinstance(batch, int) else self._epoch_batches
        try:
            self.sampler.mark(step=batch)
        except Exception as e:
            self._report("could not label the samples", e)

    def on_epoch_end(self, epoch, logs=None):
        try:
            aggregates = self.sampler.aggregate(since=self._epoch_start)
            steps = self.params.get("steps") if isinstance(self.params, dict) else None
            if not (isinstance(steps, int) and steps > 0):
                steps = self._epoch_batches  # an unknown epoch length: the batches begun
            seconds = time.time() - self._epoch_start if self._epoch_start else _NAN
            aggregates = _epoch_logs(
                aggregates, len(self.sampler.gpus), seconds, steps, self._batch_size
            )
        except Exception as e:
            self._report("could not aggregate the samples", e)
            aggregates = {}
        if logs is not None:
            logs.update(aggregates)
        self._write_tensorboard()

    def on_train_end(self, logs=None):
        try:
            self.sampler.stop()
        except Exception as e:
            self._report("could not stop sampling", e)
        self._write_tensorboard()
        if self._tb_writer is not None:
            try:
                self._tb_writer.flush()
            except Exception as e:
                self._report("could not flush TensorBoard", e)

    def _report(self, what: str, error: Exception) -> None:
        """Logs a failure of this side feature once per kind; training goes on."""
        if what not in self._reported:
            self._reported.add(what)
            _log.warning("GPUMonitor %s (%r); training goes on. (Logged once.)", what, error)

    # TensorBoard -----------------------------------------------------------------
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
        except Exception as e:  # side features never kill training
            _log.warning("GPUMonitor: TensorBoard scalars disabled (%s).", e)
            self._tb_dir = None


_LOGGED = (
    "util_pct_mean",
    "util_pct_max",
    "mem_used_mib_mean",
    "mem_used_mib_max",
    "power_w_mean",
    "power_w_max",
)
_LOGGED_WHERE_KNOWN = ("sm_active_pct_mean", "tensor_active_pct_mean")


def _epoch_logs(
    aggregates: dict[str, float],
    num_gpus: int,
    seconds: float,
    steps: int,
    batch_size: int | None,
) -> dict[str, float]:
    """Pure: the keys `GPUMonitor` logs, from `Sampler.aggregate()` of the epoch.

    The six classic per-GPU keys and the host ones always; `gpu{i}_sm_active_pct_mean`,
    `gpu{i}_tensor_active_pct_mean`, `gpu{i}_pcie_mib_per_step` and `joules_per_example`
    only where at least one GPU has a value (NaN for the others).
    """
    gpus = range(num_gpus)
    logs = {f"gpu{i}_{key}": aggregates.get(f"gpu{i}_{key}", _NAN) for i in gpus for key in _LOGGED}
    for key in _LOGGED_WHERE_KNOWN:
        values = {f"gpu{i}_{key}": aggregates.get(f"gpu{i}_{key}", _NAN) for i in gpus}
        if any(v == v for v in values.values()):
            logs.update(values)
    if steps > 0 and seconds == seconds and seconds > 0:
        per_step = {
            f"gpu{i}_pcie_mib_per_step": (
                aggregates.get(f"gpu{i}_pcie_tx_mib_s_mean", _NAN)
                + aggregates.get(f"gpu{i}_pcie_rx_mib_s_mean", _NAN)
            )
            * seconds
            / steps
            for i in gpus
        }
        if any(v == v for v in per_step.values()):
            logs.update(per_step)
    energy = [aggregates.get(f"gpu{i}_energy_j", _NAN) for i in gpus]
    if batch_size and steps > 0 and energy and all(e == e for e in energy):
        logs["joules_per_example"] = math.fsum(energy) / (batch_size * steps)
    logs.update({k: v for k, v in aggregates.items() if k.startswith("host_")})
    return logs


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default); NaN for no values."""
    if not values:
        return _NAN
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _epoch_summary(
    executions: list[tuple[int, float]],
    batch_size: int | None,
    epoch_time: float,
    flops_per_step: float | None,
    peak_flops: float | None,
) -> dict[str, float]:
    """Pure: the epoch's StepTimer logs from its executions `(steps, seconds)`, in order."""
    if executions:
        steps0, seconds0 = executions[0]
        first = seconds0 / steps0
        steady = executions[1:] or executions
    else:
        first, steady = _NAN, []
    per_step = [seconds / steps for steps, seconds in steady]
    total_steps = sum(steps for steps, _ in steady)
    total_seconds = sum(seconds for _, seconds in steady)
    median = _percentile(per_step, 50)
    logs = {
        "step_time_median_s": median,
        "step_time_p90_s": _percentile(per_step, 90),
        "first_step_time_s": first,
        "examples_per_s": batch_size * total_steps / total_seconds
        if batch_size and total_seconds > 0
        else _NAN,
        "epoch_time_s": epoch_time,
    }
    if flops_per_step is not None and peak_flops is not None:
        logs["mfu"] = flops_per_step / median / peak_flops if median > 0 else _NAN
    return logs


def _trains_on_gpu() -> bool:
    """Whether TensorFlow places this process's ops on a GPU (after `fit` started it)."""
    try:
        import tensorflow as tf

        return bool(tf.config.list_logical_devices("GPU"))
    except Exception:
        return False


def _tf32_enabled() -> bool:
    try:
        import tensorflow as tf

        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    except Exception:
        return True  # TensorFlow's default


def _peak_precision(
    policy: str, compute_capability: tuple[int, int] | None, tf32: bool = True
) -> str | None:
    """The `tfgpu.flops.peak_flops` precision a Keras dtype policy runs at (pure).

    float32 runs its matmuls in TF32 on compute capability >= 8.0 (TensorFlow's default);
    the mixed policies run at their 16-bit tensor-core rate. None for other policies.
    """
    if policy in ("mixed_bfloat16", "bfloat16"):
        return "bfloat16"
    if policy in ("mixed_float16", "float16"):
        return "float16"
    if policy == "float32":
        cc = tuple(compute_capability) if compute_capability else None
        return "tf32" if tf32 and cc is not None and cc >= (8, 0) else "float32"
    return None


def _auto_peak_flops(model: Any) -> float | None:
    """Peak FLOP/s of the replicas `model` trains on, or None off the GPU or if unknown.

    Reads TensorFlow's first GPU (`/GPU:0`, after `CUDA_VISIBLE_DEVICES` and
    `tf.config.set_visible_devices`) from NVML, the model's dtype policy, and multiplies by
    the strategy's replicas (one GPU each).
    """
    if not _trains_on_gpu():
        return None
    from tfgpu.flops import peak_flops
    from tfgpu.monitor.nvml import inventory, visible_gpus

    inv = inventory()
    gpus = visible_gpus(inv.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")) if inv.available else []
    positions = _tf_gpu_positions()
    if positions:
        gpus = [gpus[p] for p in positions if p < len(gpus)]
    if not gpus:
        return None
    policy = getattr(getattr(model, "dtype_policy", None), "name", None)
    precision = _peak_precision(
        str(policy or keras.config.dtype_policy().name), gpus[0].compute_capability, _tf32_enabled()
    )
    peak = None if precision is None else peak_flops(gpus[0].name, precision)
    if peak is None:
        return None
    strategy = getattr(model, "distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    return peak * (replicas if isinstance(replicas, int) and replicas > 0 else 1)


class StepTimer(keras.callbacks.Callback):
    """Measures train step time and throughput; per-epoch figures go into `logs`.

    Times each step with `time.perf_counter` from `on_train_batch_begin` to
    `on_train_batch_end`; when Keras dispatches asynchronously (it calls batch-end hooks in
    a thread pool once a step's results are ready, which this callback allows) a step is
    timed from the later of its begin and the previous step's end, so queued steps are not
    double counted. Under `steps_per_execution=k`, Keras calls the batch hooks once per
    execution of `k` steps: each is timed as a whole and divided by its number of steps
    (the epoch's last execution may hold fewer).

    The batch hooks only note the time (one append each, no lock, no I/O): everything else
    is done in bulk, at most once a second and at epoch end. Work and writes in the batch-end
    hook at every step cost a tiny step several percent more than they took themselves (the
    hook runs in Keras's thread pool and hands the GIL to and from the training thread);
    `benchmarks/monitor_overhead.py` measures it.

    Logs at `on_epoch_end`:
    - `step_time_median_s`, `step_time_p90_s`: seconds per step over the epoch's steps
      except its first execution (all of them if there is only one);
    - `first_step_time_s`: the epoch's first step (first execution / its steps): in epoch 0
      it includes tracing and compilation, in later epochs iterator start-up;
    - `examples_per_s`: batch size x steps / time over the same steps as the median (NaN
      when the batch size is neither given nor inferable; partial last batches count full);
    - `epoch_time_s`: wall time from `on_epoch_begin` to `on_epoch_end` (includes
      validation);
    - `mfu`: `flops_per_step / step_time_median_s / peak_flops` (see `tfgpu.flops`), when
      both numbers are known: given, or worked out at `on_train_begin`. A missing
      `peak_flops` comes from this process's first GPU (NVML name, the model's dtype policy:
      float32 counts as TF32 on compute capability >= 8.0) times the strategy's replicas,
      only while TensorFlow trains on a GPU; a missing `flops_per_step` is
      `tfgpu.flops.train_step_flops(model, batch_size)` when the batch size is known. No
      GPU (or a GPU missing from the peak table): no `mfu` key.

    With `log_dir`, writes `steps.csv` (`steps-worker{k}.csv` in a multi-worker cluster):
    `time,epoch,step,step_time_s,examples_per_s`, one row per batch hook (per execution).
    Rows are written and flushed at the first batch end a second or more after the last
    write (a SIGKILL loses at most the last second), at each epoch end, at train end, and
    as soon as `fit` is over even when it raises (Keras then skips `on_train_end`; the
    callback list `fit` made is released with its frame, which flushes), so a `fit` that
    raises leaves every step that ran on disk. The file is closed at train end, at the
    next `fit`, or when the callback is garbage-collected. A later `fit` appends to it; a
    file with another header, or whose last row a crash cut short, is moved aside to
    `steps.1.csv` (`.2`, ...), never truncated.

    Args:
        batch_size: int or None, the global batch size. Defaults to `None`: read from the
            data `fit` was given (a `tf.data` dataset batched with a static size, or arrays).
        log_dir: str, os.PathLike or None, the run directory. Defaults to `None`: no file.
        flops_per_step: float or None, FLOPs of one train step (e.g.
            `tfgpu.flops.train_step_flops(model, batch_size)`). Defaults to `None`: counted
            from the model when `fit` starts, if the peak is known.
        peak_flops: float or None, the hardware's peak FLOP/s for the precision used (e.g.
            `tfgpu.flops.peak_flops(gpu_name, "mixed_bfloat16")`), summed over replicas.
            Defaults to `None`: looked up for this process's GPU when `fit` starts.

    Raises:
        ValueError: for numbers <= 0 or not finite, or a `log_dir` that is or lies under a
            file or cannot be written.
        TypeError: for a `batch_size` that is not an int (2.5, True, "32"), a FLOPs
            figure that is not a number, a `log_dir` that is not a path.

    Example:

    ```python
    timer = tfgpu.callbacks.StepTimer(log_dir="runs/exp1")
    history = model.fit(dataset, epochs=3, callbacks=[timer])
    history.history["examples_per_s"]
    ```
    """

    def __init__(
        self,
        batch_size: int | None = None,
        log_dir: str | os.PathLike | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
    ):
        super().__init__()
        self.batch_size = check_int(
            "batch_size", batch_size, allow_none=True, expected="an int >= 1 or None, e.g. 128"
        )
        self.flops_per_step = _check_positive_number("flops_per_step", flops_per_step, "1.2e12")
        self.peak_flops = _check_positive_number("peak_flops", peak_flops, "989e12")
        self.log_dir = None if log_dir is None else check_log_dir(log_dir)
        # Seams for tests: the step clock, and the wall clock it is converted to.
        self._perf = time.perf_counter
        self._wall = time.time
        self.async_safe = True  # batch-end hook is thread-safe; lets Keras stay asynchronous
        self._lock = threading.Lock()  # guards everything but the two append-only deques
        self._file: Any = None
        self._closer: weakref.finalize | None = None
        self._fit_over: weakref.finalize | None = None
        self._batch_size: int | None = self.batch_size
        self._epoch = 0
        self._reported = False
        self._mfu_noted = False
        self._flops: float | None = self.flops_per_step
        self._peak: float | None = self.peak_flops
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        # Written by the batch hooks (any thread; deque appends are atomic), read by _drain.
        self._begins: collections.deque[tuple[int, float]] = collections.deque()
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()
        # Only under self._lock:
        self._ends: list[tuple[int, float]] = []  # heap of (end_step, perf) not yet matched
        self._prev_end: float | None = None
        self._executions: list[tuple[int, float]] = []
        self._rows: list[tuple[float, int, int, float, float]] = []
        self._epoch_start = self._perf()
        self._clock = (self._wall() - self._epoch_start, self._epoch_start)  # perf -> unix
        self._synced_at = self._epoch_start

    # Keras hooks ---------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._forget_fit()
        self._sync(final=True)  # rows of a previous fit that raised
        self._close_file()
        self._batch_size = self.batch_size or _infer_batch_size()
        if self._batch_size is None:
            _log.warning(
                "StepTimer: the batch size is unknown (a dataset without a static batch "
                "dimension?), so examples_per_s is NaN. Pass StepTimer(batch_size=...)."
            )
        self._flops, self._peak = self._mfu_inputs()
        if self.log_dir is not None:
            try:
                path = self.log_dir / artifact_name("steps", ".csv")
                # Same header: appended to; other columns or a cut last row: moved aside.
                self._file, _ = open_csv(path, _STEPS_HEADER)
                # Keras skips on_train_end when fit raises: close it when this callback goes.
                self._closer = weakref.finalize(self, _close_quietly, self._file)
            except Exception as e:  # side features never kill training
                _log.warning("StepTimer cannot write steps.csv (%s); training goes on.", e)
        # ... and write the rows when fit is over: its CallbackList goes with fit's frame.
        callback_list = _calling_callback_list()
        if callback_list is not None:
            self._fit_over = weakref.finalize(callback_list, _sync_after_fit, weakref.ref(self))

    def on_epoch_begin(self, epoch, logs=None):
        with self._lock:
            self._epoch = epoch
            self._reset_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        self._begins.append((batch, self._perf()))

    def on_train_batch_end(self, batch, logs=None):
        now = self._perf()
        self._arrivals.append((batch, now))
        if now - self._synced_at >= _SYNC_EVERY_S:
            self._sync(final=False, timeout=0)  # a thread already at it: leave it the work

    def on_epoch_end(self, epoch, logs=None):
        # Keras has waited for every asynchronous batch-end hook before calling this.
        try:
            with self._lock:
                self._drain(final=True)
                self._flush()
                summary = _epoch_summary(
                    self._executions,
                    self._batch_size,
                    self._perf() - self._epoch_start,
                    self._flops,
                    self._peak,
                )
        except Exception as e:  # side features never kill training
            self._report(e)
            return
        if logs is not None:
            logs.update(summary)

    def on_train_end(self, logs=None):
        self._forget_fit()
        self._sync(final=True)
        self._close_file()

    # internals -----------------------------------------------------------------
    def _mfu_inputs(self) -> tuple[float | None, float | None]:
        """FLOPs per step and peak FLOP/s: as given, else worked out; never raises."""
        flops, peak = self.flops_per_step, self.peak_flops
        if flops is not None and peak is not None:
            return flops, peak
        try:
            if peak is None:
                peak = _auto_peak_flops(self.model)
            if peak is not None and flops is None:
                if not self._batch_size:
                    self._note_mfu("the batch size is unknown")
                    return None, peak
                from tfgpu.flops import train_step_flops

                flops = train_step_flops(self.model, int(self._batch_size))
        except Exception as e:  # side features never kill training
            self._note_mfu(f"{type(e).__name__}: {e}")
            return self.flops_per_step, self.peak_flops
        return flops, peak

    def _note_mfu(self, why: str) -> None:
        if not self._mfu_noted:
            self._mfu_noted = True
            _log.warning("StepTimer: no mfu (%s); pass flops_per_step= and peak_flops=.", why)

    def _report(self, error: Exception) -> None:
        if not self._reported:
            self._reported = True
            _log.warning("StepTimer failed (%r); training goes on. (Logged once.)", error)

    def _forget_fit(self) -> None:
        """Drops the watch on the previous `fit`'s callback list (this fit has its own)."""
        if self._fit_over is not None:
            self._fit_over.detach()
            self._fit_over = None

    def _sync(self, final: bool, timeout: float | None = None) -> None:
        """Turns the noted times into rows and writes them; never raises.

        Args:
            final: bool, whether the epoch's batches are over (begins without an end are
                dropped instead of waited for).
            timeout: float or None, how long to wait for another thread doing the same
                before leaving the work to it (0: not at all). Defaults to `None`: wait.
        """
        acquired = (
            self._lock.acquire()
            if timeout is None
            else self._lock.acquire(blocking=timeout > 0, timeout=timeout if timeout > 0 else -1)
        )
        if not acquired:
            return
        try:
            self._synced_at = self._perf()
            self._drain(final=final)
            self._flush()
        except Exception as e:  # may run in Keras's thread pool: never let it fail `fit`
            self._report(e)
        finally:
            self._lock.release()

    def _drain(self, final: bool) -> None:
        """Matches batch ends to begins in step order; records executions and rows."""
        arrivals = self._arrivals
        while arrivals:  # ends in any order (several pool threads): a heap sorts them
            heapq.heappush(self._ends, arrivals.popleft())
        total = (self.params or {}).get("steps")
        last_step = total - 1 if isinstance(total, int) and total > 0 else None
        offset = self._clock[0]
        while self._ends and self._begins:
            end_step, t_end = self._ends[0]
            begin_step, t_begin = self._begins[0]
            if end_step < begin_step:  # an end without a begin: ignore it
                heapq.heappop(self._ends)
                continue
            if len(self._begins) > 1 and self._begins[1][0] <= end_step:
                if not final:
                    break  # this begin's end is still on its way (async dispatch)
                self._begins.popleft()  # its end never came
                continue
            heapq.heappop(self._ends)
            self._begins.popleft()
            last = end_step if last_step is None else min(end_step, last_step)
            steps = max(1, last - begin_step + 1)
            start = t_begin if self._prev_end is None else max(t_begin, self._prev_end)
            seconds = max(t_end - start, 0.0)
            self._prev_end = t_end
            self._executions.append((steps, seconds))
            per_step = seconds / steps
            rate = self._batch_size * steps / seconds if self._batch_size and seconds else _NAN
            self._rows.append((offset + t_end, self._epoch, end_step, per_step, rate))

    def _flush(self) -> None:
        if self._file is None or not self._rows:
            self._rows = []
            return
        try:
            self._file.write(
                "".join(f"{w:.3f},{e},{s},{t:.6g},{r:.6g}\n" for w, e, s, t, r in self._rows)
            )
            self._file.flush()
        except (OSError, ValueError) as e:
            _log.warning("StepTimer: writing steps.csv failed (%s); training goes on.", e)
            self._file = None
        self._rows = []

    def _close_file(self) -> None:
        if self._closer is not None:
            self._closer()  # closes the file, once
            self._closer = None
        self._file = None


_SYNC_EVERY_S = 1.0  # StepTimer turns noted times into steps.csv rows at most this often
_STEPS_HEADER = "time,epoch,step,step_time_s,examples_per_s\n"


def _check_positive_number(name: str, value: Any, example: str) -> float | None:
    return check_number(
        name,
        value,
        minimum=0,
        exclusive_minimum=True,
        allow_none=True,
        expected=f"a finite number > 0 or None, e.g. {example}",
    )


def _calling_callback_list() -> keras.callbacks.CallbackList | None:
    """The `CallbackList` calling the hook that called this, e.g. the one `fit` made."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList):
            return owner
        frame = frame.f_back
    return None


def _sync_after_fit(timer: weakref.ref[StepTimer]) -> None:
    """Writes the rows of a `fit` that is over: its callback list was just released."""
    alive = timer()
    if alive is not None:  # may run inside a GC in any thread, even one holding the lock
        alive._sync(final=True, timeout=1.0)


def _close_quietly(file: Any) -> None:
    try:
        file.close()
    except (OSError, ValueError):
        pass
