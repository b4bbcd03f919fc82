"""`StepTimer`: train step time, throughput and MFU per epoch, into the Keras `logs`."""

from __future__ import annotations

import collections
import contextlib
import functools
import heapq
import logging
import os
import threading
import time
import weakref
from typing import Any

import keras

from tfgpu._internal.adapters import devices, keras_internals, model_state
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import check_int, check_number
from tfgpu._internal.helpers.files import RunCsv, writable_dir
from tfgpu.callbacks import _steps
from tfgpu.monitor import artifact_name

_log = logging.getLogger(__name__)
_NAN = float("nan")

# An epoch below this share of what `tune` measured for the model's settings is named.
TUNED_SHORTFALL = 0.8
# Keras's train functions that have run a whole epoch under a StepTimer: traced already.
_TRACED: weakref.WeakSet[Any] = weakref.WeakSet()
_Row = tuple[float, int, int, float, float]  # a steps.csv row: time, epoch, step, step time, rate


def _epoch_summary(
    executions: list[tuple[int, float]],
    batch_size: int | None,
    epoch_time: float,
    flops_per_step: float | None,
    peak_flops: float | None,
) -> dict[str, float]:
    """Pure: the epoch's StepTimer logs from its executions `(steps, seconds)`, in order."""
    first = executions[0][1] / executions[0][0] if executions else _NAN
    steady = executions[1:] or executions  # all but the first, unless it is the only one
    per_step = [seconds / steps for steps, seconds in steady]
    total_steps = sum(steps for steps, _ in steady)
    total_seconds = sum(seconds for _, seconds in steady)
    median = stats.median(per_step)
    rate = batch_size * total_steps / total_seconds if batch_size and total_seconds > 0 else _NAN
    logs = {
        "step_time_median_s": median,
        "step_time_p90_s": stats.percentile(per_step, 90),
        "first_step_time_s": first,
        "examples_per_s": rate,
        "epoch_time_s": epoch_time,
    }
    if flops_per_step is not None and peak_flops is not None:
        logs["mfu"] = flops_per_step / median / peak_flops if median > 0 else _NAN
    return logs


class StepTimer(keras.callbacks.Callback):
    """Measures train step time and throughput; per-epoch figures go into `logs`.

    Logs `step_time_median_s`, `step_time_p90_s`, `first_step_time_s`, `examples_per_s`,
    `epoch_time_s`, and `mfu` where the FLOPs per step and the peak are known; with `log_dir`,
    `steps.csv`, one row per execution. The batch hooks only note the time. The guide:
    docs/metrics.md, "Step timing" and "Arguments".

    Args:
        log_dir: str, os.PathLike or None, the run directory. Defaults to `None`: no file.
        batch_size: int or None, the global batch size. Defaults to `None`: read from `fit`.
        flops_per_step: float or None, FLOPs of one train step. Defaults to `None`: counted.
        peak_flops: float or None, the peak FLOP/s, summed over replicas. Defaults to `None`:
            looked up for this process's GPU.

    Raises:
        ValueError: for numbers <= 0 or not finite, or a `log_dir` that cannot be written.
        TypeError: for an argument of the wrong type (`batch_size=2.5`, `True`, `"32"`).

    Example:

    >>> timer = tfgpu.callbacks.StepTimer(log_dir="runs/exp1")
    >>> history = model.fit(dataset, epochs=3, callbacks=[timer])
    >>> history.history["examples_per_s"]
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None = None,
        *,
        batch_size: int | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = check_int(
            "batch_size", batch_size, allow_none=True, expected="an int >= 1 or None, e.g. 128"
        )
        self.flops_per_step = _check_positive_number("flops_per_step", flops_per_step, "1.2e12")
        self.peak_flops = _check_positive_number("peak_flops", peak_flops, "989e12")
        self.log_dir = None if log_dir is None else writable_dir(log_dir)
        # Seams for tests: the step clock, and the wall clock it is converted to.
        self._perf = time.perf_counter
        self._wall = time.time
        self.async_safe = True  # batch-end hook is thread-safe; lets Keras stay asynchronous
        self._lock = threading.Lock()  # guards everything but the two append-only deques
        self._csv: RunCsv | None = None
        self._closer: weakref.finalize | None = None
        self._fit_over: keras_internals.FitWatch | None = None
        self._batch_size: int | None = self.batch_size
        self._epoch = 0
        self._epochs_in_fit = 0  # epochs this fit has ended
        self._step_fn: Any = None  # Keras's train function of this fit
        self._judged_at = 0  # the epoch of this fit compared with what tune measured
        self._reported = self._mfu_noted = False
        self._flops, self._peak = self.flops_per_step, self.peak_flops
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        # Written by the batch hooks (any thread; deque appends are atomic), read by _drain.
        self._begins: collections.deque[tuple[int, float]] = collections.deque()
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()
        # Only under self._lock:
        self._ends: list[tuple[int, float]] = []  # heap of (end_step, perf) not yet matched
        self._prev_end: float | None = None
        self._executions: list[tuple[int, float]] = []
        self._rows: list[_Row] = []
        self._epoch_start = self._perf()
        self._to_unix = self._wall() - self._epoch_start  # perf + this = unix time
        self._synced_at = self._epoch_start
        self._optimizer_at_begin: int | None = None  # only when the epoch length is unknown

    def on_train_begin(self, logs=None):
        self.on_train_end()  # the rows and file of a previous fit that raised
        self._batch_size = self.batch_size or keras_internals.fit_batch_size(self.model)
        if self._batch_size is None:
            _log.warning(
                "StepTimer: the batch size is unknown (a dataset without a static batch "
                "dimension?), so examples_per_s is NaN. Pass StepTimer(batch_size=...)."
            )
        self._flops, self._peak = self._mfu_inputs()
        # A train function new to this fit traces in its first epoch: tune's claim is checked
        # on the first epoch that does not.
        self._step_fn = keras_internals.keras_train_function(
            keras_internals.train_function(self.model)
        )
        self._epochs_in_fit = 0
        try:
            self._judged_at = 0 if self._step_fn in _TRACED else 1
        except TypeError:  # not weak-referenceable: assume it traces
            self._judged_at = 1
        if self.log_dir is not None:
            try:
                path = self.log_dir / artifact_name("steps", ".csv")
                self._csv = RunCsv(
                    path,
                    _STEPS_HEADER,
                    log=_log,
                    who="StepTimer",
                    name="steps.csv",
                    kept="training goes on",
                )
                # Keras skips on_train_end when fit raises: close it when this callback goes.
                self._closer = weakref.finalize(self, self._csv.close)
            except (OSError, ValueError) as e:  # a full disk, a lost mount, a path it refuses
                _log.warning("StepTimer cannot write steps.csv (%s); training goes on.", e)
        # ... and write the rows as soon as fit is over, also when it raised.
        sync = functools.partial(_sync_after_fit, weakref.ref(self))
        self._fit_over = keras_internals.when_fit_ends(sync, __name__)

    def on_epoch_begin(self, epoch, logs=None):
        # An epoch of unknown length may end inside an execution: the optimizer will tell.
        unknown = _steps.known_epoch_steps(self.params) is None
        at_begin = _steps.optimizer_steps(self.model) if unknown else None
        with self._lock:
            self._epoch = epoch
            self._reset_epoch()
            self._optimizer_at_begin = at_begin

    # The batch hooks only note the time (one append, no lock, no I/O): work in the batch-end
    # hook, run in Keras's thread pool, costs a tiny step several percent in GIL hand-offs.
    def on_train_batch_begin(self, batch, logs=None):
        self._begins.append((batch, self._perf()))

    def on_train_batch_end(self, batch, logs=None):
        now = self._perf()
        self._arrivals.append((batch, now))
        if now - self._synced_at >= _SYNC_EVERY_S:
            self._sync(final=False, timeout=0)  # a thread already at it: leave it the work

    def on_epoch_end(self, epoch, logs=None):
        # Keras has waited for every asynchronous batch-end hook before calling this.
        summary = self._sync(final=True, epoch_end=True)
        if logs is not None and summary is not None:
            logs.update(summary)

    def on_train_end(self, logs=None):
        if self._fit_over is not None:  # the watch on this fit (the next fit has its own)
            self._fit_over.cancel()
            self._fit_over = None
        self._sync(final=True)
        if self._closer is not None:
            self._closer()  # closes the file, once
            self._closer = None
        self._csv = None

    def _mfu_inputs(self) -> tuple[float | None, float | None]:
        """FLOPs per step and peak FLOP/s: as given, else worked out; never raises."""
        flops, peak = self.flops_per_step, self.peak_flops
        try:
            if peak is None:
                peak = _auto_peak_flops(self.model)
            if peak is not None and flops is None:
                if not self._batch_size:
                    self._note_mfu("the batch size is unknown")
                    return None, peak
                from tfgpu.flops import train_step_flops

                flops = train_step_flops(self.model, int(self._batch_size))
        except Exception as e:  # counting a model's FLOPs may fail anyway: never kills training
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

    def _sync(
        self, final: bool, timeout: float | None = None, epoch_end: bool = False
    ) -> dict[str, float] | None:
        """Turns the noted times into rows and writes them (and returns the epoch's logs at
        `epoch_end`); never raises. `final`: a begin without an end is dropped; `timeout`: None
        waits for a thread already at it."""
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return None
        try:
            self._synced_at = self._perf()
            self._drain(final=final)
            if epoch_end:
                self._correct_last_execution()
            self._flush(final=final)
            if epoch_end:
                summary = _epoch_summary(
                    self._executions,
                    self._batch_size,
                    self._perf() - self._epoch_start,
                    self._flops,
                    self._peak,
                )
                self._against_tune(summary)
                self._epochs_in_fit += 1
                with contextlib.suppress(TypeError):  # not weak-referenceable
                    _TRACED.add(self._step_fn)
                return summary
        except Exception as e:  # the boundary of every hook's work on the steps: `fit` goes on
            self._report(e)
        finally:
            self._lock.release()
        return None

    def _against_tune(self, summary: dict[str, float]) -> None:
        """Adds what `tune` measured (`TuneResult.apply`); warns if the fit's first epoch that
        traces no step (the first, or the second where the first traced) is a fifth short."""
        tuned = model_state.tuned_examples_per_s(self.model)
        if tuned is None:
            return
        summary["tuned_examples_per_s"] = tuned
        reached = summary["examples_per_s"] / tuned
        if self._epochs_in_fit == self._judged_at and reached < TUNED_SHORTFALL:
            which = "the first epoch" if self._judged_at == 0 else "the first epoch after tracing"
            _log.warning(
                "StepTimer: %s examples/s in %s (epoch %d), %.0f%% of the %s tune measured "
                "for these settings (train on result.dataset; a loaded machine, another batch "
                "size or a cache still filling also explain it).",
                f"{summary['examples_per_s']:,.0f}",
                which,
                self._epoch + 1,
                100 * reached,
                f"{tuned:,.0f}",
            )

    def _drain(self, final: bool) -> None:
        """Matches batch ends to begins in step order; records executions and rows."""
        arrivals = self._arrivals
        while arrivals:  # ends in any order (several pool threads): a heap sorts them
            heapq.heappush(self._ends, arrivals.popleft())
        total = _steps.known_epoch_steps(self.params)
        last_step = None if total is None else total - 1
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
            # The step that really ran last, not Keras's begin + steps_per_execution - 1.
            self._rows.append(self._row(self._to_unix + t_end, begin_step, steps, seconds))

    def _row(self, wall: float, begin_step: int, steps: int, seconds: float) -> _Row:
        rate = self._batch_size * steps / seconds if self._batch_size and seconds else _NAN
        return (wall, self._epoch, begin_step + steps - 1, seconds / steps, rate)

    def _correct_last_execution(self) -> None:
        """An epoch of unknown length: its last execution's true steps, from the optimizer (its
        row was held back by `_flush`, so steps.csv never holds the wrong count)."""
        if self._optimizer_at_begin is None or not self._executions:
            return
        end = _steps.optimizer_steps(self.model)
        true_total = _steps.steps_between(self._optimizer_at_begin, end)
        last = _steps.true_last_steps([steps for steps, _ in self._executions], true_total)
        if last is None:
            return
        steps, seconds = self._executions[-1]
        self._executions[-1] = (last, seconds)
        if self._rows:
            wall, _, end_step, _, _ = self._rows[-1]
            self._rows[-1] = self._row(wall, end_step - steps + 1, last, seconds)

    def _flush(self, final: bool) -> None:
        """Writes the rows made so far; a write that is not `final`, in an epoch of unknown length,
        holds back the newest, which `_correct_last_execution` may still correct."""
        unknown = _steps.known_epoch_steps(self.params) is None
        held = self._rows[-1:] if not final and unknown else []
        rows = self._rows[: len(self._rows) - len(held)]
        self._rows = held
        if self._csv is None or not rows:
            return
        self._csv.write("".join(f"{w:.3f},{e},{s},{t:.6g},{r:.6g}\n" for w, e, s, t, r in rows))


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


def _trains_on_gpu() -> bool:
    """Whether TensorFlow places this process's ops on a GPU (after `fit` started it)."""
    try:
        import tensorflow as tf
    except ImportError:  # another Keras backend, without TensorFlow
        return False
    try:
        return bool(tf.config.list_logical_devices("GPU"))
    except (RuntimeError, tf.errors.OpError):  # a runtime that failed to start its devices
        return False


def _auto_peak_flops(model: Any) -> float | None:
    """Peak FLOP/s of `/GPU:0` for the model's dtype policy times the strategy's replicas (one
    GPU each, assumed alike), or None off the GPU or if unknown (docs/metrics.md, `mfu`)."""
    if not _trains_on_gpu():
        return None
    from tfgpu.flops import peak_flops

    gpu = devices.gpu_record(0)
    if gpu is None or gpu.name is None:
        return None
    policy = getattr(getattr(model, "dtype_policy", None), "name", None)
    policy = str(policy or keras.config.dtype_policy().name)  # the model's, else the global one
    precision = devices.peak_precision(policy, gpu.compute_capability)
    peak = None if precision is None else peak_flops(gpu.name, precision)
    if peak is None:
        return None
    strategy = getattr(model, "distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    return peak * (replicas if isinstance(replicas, int) and replicas > 0 else 1)


def _sync_after_fit(timer: weakref.ref[StepTimer]) -> None:
    """Writes the rows of a `fit` that is over (called from the watcher thread)."""
    alive = timer()
    if alive is not None:
        alive._sync(final=True, timeout=1.0)
