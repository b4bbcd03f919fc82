"""tfgpu.callbacks.GPUMonitor and StepTimer in real Keras `fit` runs on the CPU.

NVML is the scripted fake (`tests/fake_pynvml.py`, two GPUs); psutil is real.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

from tests import fake_pynvml
from tests.conftest import FullDisk
from tfgpu import flops, monitor
from tfgpu._internal.adapters import devices, keras_internals
from tfgpu._internal.helpers import warn
from tfgpu.callbacks import GPUMonitor, StepTimer, _steps, step_timer
from tfgpu.callbacks.gpu_monitor import _SUMMARY_KEYS, _epoch_logs
from tfgpu.callbacks.step_timer import _epoch_summary

REPO = Path(__file__).resolve().parent.parent
STEP_KEYS = {
    "step_time_median_s",
    "step_time_p90_s",
    "first_step_time_s",
    "examples_per_s",
    "epoch_time_s",
}


@pytest.fixture
def fake(monkeypatch):
    module = fake_pynvml.make()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    for name in ("CUDA_VISIBLE_DEVICES", "TF_CONFIG", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    return module


@pytest.fixture(autouse=True)
def _fresh_once_warnings():
    """Each test sees the once-per-process warnings (no NVML) as a new process would."""
    warn.forget()
    yield
    warn.forget()


def _model(steps_per_execution: int = 1) -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    return model


def _data(n: int = 256):
    rng = np.random.default_rng(0)
    return rng.random((n, 8), dtype="float32"), rng.random((n, 1), dtype="float32")


class _SlowBatches(keras.callbacks.Callback):
    """Makes each batch take >= `seconds` (a begin hook, so Keras stays asynchronous)."""

    def __init__(self, seconds: float = 0.01):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_begin(self, batch, logs=None):
        time.sleep(self.seconds)


class _Boom(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            raise RuntimeError("boom inside fit")


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tfgpu-monitor"]


def _join_monitor_threads() -> bool:
    """Waits for the sampler threads to end (they stop at their next wake-up).

    The timeout only turns a hang into a failure; it is no claim about speed.
    """
    for thread in _monitor_threads():
        thread.join(timeout=120)
    return not _monitor_threads()


class _FirstRow(keras.callbacks.Callback):
    """Waits, when `fit` begins, for the first row of the sampler (taken by its thread as it
    starts): that row comes before the first epoch, and rows taken by hand come after it.
    List it after the `GPUMonitor`. The timeout only turns a hang into a failure."""

    def __init__(self, gpu_monitor: GPUMonitor):
        super().__init__()
        self.gpu_monitor = gpu_monitor

    def on_train_begin(self, logs=None):
        assert self.gpu_monitor.sampler._first_row.wait(timeout=120)


class _SampleAt(_FirstRow):
    """Takes a sample at a given batch of every epoch: labelled rows, no timing.

    In a thread of its own, as the sampler thread would: the training thread makes no
    NVML call.
    """

    def __init__(self, gpu_monitor: GPUMonitor, batch: int = 3):
        super().__init__(gpu_monitor)
        self.batch = batch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            thread = threading.Thread(target=self.gpu_monitor.sampler._sample)
            thread.start()
            thread.join()


def _ticking(fake, seconds: float = 60.0) -> None:
    """NVML's timestamps (on the PCIe byte counters) move `seconds` at each reading, so every
    rate spans more than the sampler's minimum window, however close the rows come."""
    fake.clock = itertools.count(1000.0, seconds).__next__


def _csv(path: Path) -> tuple[list[str], list[dict[str, float]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    for row in rows[1:]:
        assert len(row) == len(header), row
    return header, [{k: float(v) for k, v in zip(header, row)} for row in rows[1:]]


def test_fit_with_both_callbacks_logs_every_key_and_writes_the_run_dir(fake, tmp_path):
    x, y = _data()  # 8 batches of 32
    _ticking(fake)
    main = threading.get_ident()
    window = {}

    class _Window(keras.callbacks.Callback):  # the span of batches, in NVML call counts
        def on_train_batch_begin(self, batch, logs=None):
            window.setdefault("start", len(fake.calls))

        def on_epoch_end(self, epoch, logs=None):
            window["end"] = len(fake.calls)

    gpu_monitor = GPUMonitor(tmp_path, interval=0.02, per_gpu_logs=True)
    timer = StepTimer(log_dir=tmp_path)
    csv_logger = keras.callbacks.CSVLogger(str(tmp_path / "epochs.csv"))
    history = _model().fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        verbose=0,
        callbacks=[_Window(), gpu_monitor, _SampleAt(gpu_monitor), timer, csv_logger],
    )
    # on_train_end stopped the thread (no waiting needed)
    assert not gpu_monitor.sampler.running and not _monitor_threads()

    # on_epoch_end: the logs carry every key, once per epoch
    logged = history.history
    logged_keys = [k for k in monitor.aggregate_keys(2) if k.endswith(_CLASSIC)]
    for key in [*logged_keys, *STEP_KEYS]:
        assert len(logged[key]) == 2, key
    assert "mfu" not in logged
    # no GPM on the fake A100/V100: those keys stay out rather than logging NaN
    assert not [k for k in logged if "sm_active" in k or "tensor_active" in k]
    assert logged["gpu0_pcie_mib_per_step"] == [0.0, 0.0]
    assert logged["gpu0_util_pct_mean"] == [50.0, 50.0]
    assert logged["gpu1_util_pct_max"] == [10.0, 10.0]
    assert all(math.isnan(v) for v in logged["gpu1_power_w_mean"])  # V100: NotSupported
    # the summary comes with the per-GPU keys: A100 at 50%, V100 at 10%
    assert logged["gpu_util_pct_mean"] == [30.0, 30.0]
    assert logged["gpu_util_pct_min"] == [10.0, 10.0]
    assert logged["gpu_mem_used_mib_max"] == [1024.0, 1024.0]
    assert all(math.isnan(v) for v in logged["gpu_power_w_total"])  # the V100 has no reading
    assert all(v > 0 for v in logged["host_rss_mib_max"])
    assert all(v > 0 for v in logged["epoch_time_s"])
    assert all(v > 0 for v in logged["step_time_median_s"])
    assert all(v > 0 for v in logged["examples_per_s"])
    with open(tmp_path / "epochs.csv") as f:
        header = f.readline()  # CSVLogger, listed after, saw them
        assert "gpu0_util_pct_mean" in header and "gpu_util_pct_mean" in header

    # on_train_begin wrote run.json; the timeline has rows labelled by the epoch/step hooks
    assert json.loads((tmp_path / "run.json").read_text())["interval"] == 0.02
    header, rows = _csv(tmp_path / "timeline.csv")
    assert header == monitor.timeline_columns(2)
    assert len(rows) >= 4  # start, one by hand per epoch, stop
    assert {r["epoch"] for r in rows if r["epoch"] == r["epoch"]} == {0.0, 1.0}
    assert {r["step"] for r in rows if r["step"] == r["step"]} <= set(range(8))
    assert {(r["epoch"], r["step"]) for r in rows} >= {(0.0, 3.0), (1.0, 3.0)}
    assert all(r["gpu0_util_pct"] == 50.0 for r in rows)

    # StepTimer: one row per batch, batch size inferred from fit (32)
    header, steps = _csv(tmp_path / "steps.csv")
    assert header == ["time", "epoch", "step", "step_time_s", "examples_per_s"]
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, s) for e in (0, 1) for s in range(8)]
    for r in steps:
        assert r["step_time_s"] > 0
        assert r["examples_per_s"] * r["step_time_s"] == pytest.approx(32, rel=1e-3)

    # no NVML call on the training thread while batches ran; other threads did call
    during = fake.calls[window["start"] : window["end"]]
    assert during and all(thread != main for _, thread in during)


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_the_sampler_thread_is_gone_after_fit_raises_and_retries_do_not_pile_up(fake, tmp_path):
    x, y = _data()
    model = _model()
    gpu_monitor = GPUMonitor(tmp_path, interval=0.02)
    timer = StepTimer(log_dir=tmp_path)
    most = 0
    for _ in range(3):
        with pytest.raises(RuntimeError, match="boom inside fit"):
            model.fit(
                x, y, batch_size=32, epochs=1, verbose=0, callbacks=[gpu_monitor, timer, _Boom()]
            )
        most = max(most, len(_monitor_threads()))
        assert _join_monitor_threads(), "sampler still running after fit raised"
    assert most <= 1
    _, rows = _csv(tmp_path / "timeline.csv")
    assert len(rows) >= 6  # each failed fit sampled at start and at its end
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[timer])
    _, steps = _csv(tmp_path / "steps.csv")  # rows of the failed fits were kept
    assert len(steps) >= 8 + 3


@pytest.mark.slow
def test_a_sigkill_during_fit_leaves_a_timeline_whose_rows_all_parse(tmp_path):
    code = f"""
import sys, time
from tests import fake_pynvml
sys.modules["pynvml"] = fake_pynvml.make()
import keras, numpy as np
from tfgpu.callbacks import GPUMonitor

class Slow(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        time.sleep(0.002)

x, y = np.zeros((64, 4), "float32"), np.zeros((64, 1), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(x, y, batch_size=8, epochs=100000, verbose=0,
          callbacks=[GPUMonitor({str(tmp_path)!r}, interval=0.01), Slow()])
"""
    timeline = tmp_path / "timeline.csv"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 200
            while time.monotonic() < deadline:
                if timeline.exists() and timeline.read_text().count("\n") > 40:
                    break
                assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    header, rows = _csv(timeline)  # every row complete and numeric
    assert header == monitor.timeline_columns(2)
    assert len(rows) >= 40
    assert rows[-1]["epoch"] >= 0 and rows[-1]["gpu0_util_pct"] == 50.0
    # (that each row is on disk as soon as it is taken: test_monitor, without timing)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda d: GPUMonitor(interval=0), ValueError, r"`interval`. Received: interval=0"),
        (lambda d: GPUMonitor(interval=-0.5), ValueError, r"Expected a number of seconds >= 0.01"),
        (lambda d: GPUMonitor(interval=1e-9), ValueError, r"interval=1e-09.*>= 0.01"),
        (lambda d: GPUMonitor(interval="0.2"), TypeError, r"`interval`"),
        (lambda d: GPUMonitor(gpus=[3]), ValueError, r"Received: gpus=\[3\].*below 2"),
        (lambda d: GPUMonitor(gpus=[99]), ValueError, r"gpus=\[99\].*one of \[0, 1\]"),
        (lambda d: GPUMonitor(gpus=[0.0]), TypeError, r"`gpus`"),
        (lambda d: GPUMonitor(gpus=1), TypeError, r"`gpus`"),
        (lambda d: GPUMonitor(host="yes"), TypeError, r"`host`"),
        (lambda d: GPUMonitor(log_dir=d / "file" / "x"), ValueError, r"`log_dir`.*under the file"),
        (lambda d: GPUMonitor(log_dir=d / "file"), ValueError, r"`log_dir`.*is a file"),
        (lambda d: GPUMonitor(log_dir=3), TypeError, r"`log_dir`"),
        (lambda d: GPUMonitor(tensorboard=d / "file"), ValueError, r"`tensorboard`.*is a file"),
        (lambda d: GPUMonitor(tensorboard=True), ValueError, r"`tensorboard`.*log_dir"),
        (lambda d: GPUMonitor(tensorboard=1), TypeError, r"`tensorboard`"),
        (lambda d: StepTimer(batch_size=0), ValueError, r"Received: batch_size=0"),
        (lambda d: StepTimer(batch_size=2.5), TypeError, r"`batch_size`.*Expected an int"),
        (lambda d: StepTimer(batch_size=True), TypeError, r"`batch_size`"),
        (lambda d: StepTimer(batch_size="32"), TypeError, r"`batch_size`"),
        (lambda d: StepTimer(flops_per_step=-1.0), ValueError, r"`flops_per_step`"),
        (lambda d: StepTimer(flops_per_step="1e9"), TypeError, r"`flops_per_step`"),
        (lambda d: StepTimer(peak_flops=float("nan")), ValueError, r"`peak_flops`"),
        (lambda d: StepTimer(peak_flops=float("inf")), ValueError, r"`peak_flops`"),
        (lambda d: StepTimer(log_dir=d / "file" / "x"), ValueError, r"`log_dir`.*under the file"),
        (lambda d: StepTimer(log_dir=b"runs"), TypeError, r"`log_dir`"),
        (lambda d: StepTimer(b"runs"), TypeError, r"`log_dir`"),
        (lambda d: StepTimer(d / "file"), ValueError, r"`log_dir`.*is a file"),
    ],
)
def test_bad_arguments_raise_before_training(fake, tmp_path, make, error, match):
    (tmp_path / "file").write_text("")
    with pytest.raises(error, match=match):
        make(tmp_path)
    assert not _monitor_threads()


def test_epoch_summary_from_timed_executions():
    logs = _epoch_summary([(1, 2.0), (1, 0.1), (1, 0.2), (1, 0.3)], 32, 3.0, 1e9, 1e11)
    assert logs["first_step_time_s"] == 2.0
    assert logs["step_time_median_s"] == pytest.approx(0.2)
    assert logs["step_time_p90_s"] == pytest.approx(0.28)
    assert logs["examples_per_s"] == pytest.approx(32 * 3 / 0.6)
    assert logs["epoch_time_s"] == 3.0
    assert logs["mfu"] == pytest.approx(1e9 / 0.2 / 1e11)
    # steps_per_execution=4, last execution shorter; unknown batch size; no FLOPs numbers
    logs = _epoch_summary([(4, 4.0), (4, 0.8), (2, 0.4)], None, 5.0, None, 1e12)
    assert logs["first_step_time_s"] == 1.0 and logs["step_time_median_s"] == pytest.approx(0.2)
    assert math.isnan(logs["examples_per_s"]) and "mfu" not in logs
    # one execution per epoch: it is all there is
    assert _epoch_summary([(8, 1.6)], 10, 2.0, None, None)["examples_per_s"] == pytest.approx(50)
    assert math.isnan(_epoch_summary([], 10, 0.0, None, None)["step_time_median_s"])


@pytest.mark.parametrize(
    "policy, cc, tf32, expected",
    [
        ("float32", (8, 0), True, "tf32"),
        ("float32", (8, 0), False, "float32"),  # TF32 switched off in TensorFlow
        ("float32", (7, 0), True, "float32"),  # no TF32 before Ampere
        ("float32", None, True, "float32"),
        ("mixed_bfloat16", (9, 0), True, "bfloat16"),
        ("mixed_float16", (7, 5), True, "float16"),
        ("bfloat16", (8, 0), True, "bfloat16"),
        ("float64", (8, 0), True, None),
    ],
)
def test_peak_precision_follows_the_dtype_policy(policy, cc, tf32, expected):
    assert devices.peak_precision(policy, cc, tf32) == expected
    if expected is not None:  # a name peak_flops accepts
        assert flops.peak_flops("NVIDIA A100-SXM4-80GB", expected) > 0


@pytest.mark.parametrize("policy, precision", [("float32", "tf32"), ("mixed_bfloat16", "bf16")])
@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_step_timer_works_out_mfu_from_the_gpu_and_the_model(fake, monkeypatch, policy, precision):
    # NVML names an A100 (cc 8.0); TensorFlow is told it trains on a GPU (this CPU stands in).
    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)
    keras.mixed_precision.set_global_policy(policy)
    x, y = _data(128)
    model = _model()
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[StepTimer()])
    expected_flops = flops.train_step_flops(model, 32)
    # Two Dense matmuls: forward + weight gradient each, and the input gradient of the second
    # only (the first layer's input needs none).
    assert expected_flops == 2 * 32 * (2 * 8 * 16 + 3 * 16 * 1)
    peak = flops.peak_flops("NVIDIA A100-SXM4-80GB", precision)
    logged = history.history
    for epoch in range(2):
        median = logged["step_time_median_s"][epoch]
        assert logged["mfu"][epoch] == pytest.approx(expected_flops / median / peak, rel=1e-9)


def test_step_timer_keeps_given_numbers_and_fills_in_the_missing_one(fake, monkeypatch):
    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)
    x, y = _data(64)
    history = _model().fit(
        x, y, batch_size=32, epochs=1, verbose=0, callbacks=[StepTimer(flops_per_step=1e9)]
    )
    median = history.history["step_time_median_s"][0]
    peak = flops.peak_flops("NVIDIA A100-SXM4-80GB", "tf32")
    assert history.history["mfu"][0] == pytest.approx(1e9 / median / peak, rel=1e-9)


def test_auto_peak_counts_every_replica(fake, monkeypatch):
    import tensorflow as tf

    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = _model()
    one = flops.peak_flops("NVIDIA A100-SXM4-80GB", "tf32")
    assert step_timer._auto_peak_flops(model) == pytest.approx(2 * one)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the V100 (cc 7.0): no TF32
    v100 = flops.peak_flops("Tesla V100-SXM2-16GB", "float32")
    assert step_timer._auto_peak_flops(model) == pytest.approx(2 * v100)


def test_no_mfu_without_nvml_or_off_the_gpu(monkeypatch, fake):
    x, y = _data(64)
    # NVML lists an A100 but TensorFlow trains on the CPU: a GPU peak would be meaningless
    history = _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[StepTimer()])
    assert "mfu" not in history.history and history.history["step_time_median_s"][0] > 0
    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: no GPU to look up
    history = _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[StepTimer()])
    assert "mfu" not in history.history and history.history["step_time_median_s"][0] > 0


def test_mfu_failures_never_break_training(fake, monkeypatch, caplog):
    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)

    class Subclassed(keras.Model):  # no `inputs`: its FLOPs cannot be counted
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model.compile("sgd", "mse")
    x, y = _data(64)
    timer = StepTimer()
    with caplog.at_level(logging.WARNING, logger="tfgpu.callbacks"):
        for _ in range(2):
            history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[timer])
    assert "mfu" not in history.history and history.history["examples_per_s"][0] > 0
    notes = [r for r in caplog.records if "no mfu" in r.getMessage()]
    assert len(notes) == 1 and "ValueError" in notes[0].getMessage()


def test_step_timer_under_steps_per_execution(fake, tmp_path):
    x, y = _data()  # 8 batches; executions of 3 steps: 0-2, 3-5, 6-7
    timer = StepTimer(log_dir=tmp_path, flops_per_step=1e6, peak_flops=1e12)
    history = _model(steps_per_execution=3).fit(
        x, y, batch_size=32, epochs=2, verbose=0, callbacks=[timer]
    )
    _, steps = _csv(tmp_path / "steps.csv")
    # Keras passes 8 for the last execution (6 + 3 - 1); the step that ran last is 7.
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, s) for e in (0, 1) for s in (2, 5, 7)]
    last = steps[-1]  # 2 steps in the last execution: per-step time and rate agree on it
    assert last["examples_per_s"] * last["step_time_s"] == pytest.approx(32, rel=1e-3)
    assert 0 < history.history["mfu"][-1] < 1
    assert history.history["examples_per_s"][-1] > 0


@pytest.mark.slow
def test_step_timer_reads_the_batch_size_of_a_tf_data_dataset(fake, tmp_path, caplog):
    import tensorflow as tf

    x, y = _data(128)
    batched = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    _model().fit(
        batched, epochs=1, verbose=0, shuffle=False, callbacks=[StepTimer(log_dir=tmp_path / "a")]
    )
    _, steps = _csv(tmp_path / "a" / "steps.csv")
    assert len(steps) == 8
    assert steps[-1]["examples_per_s"] * steps[-1]["step_time_s"] == pytest.approx(16, rel=1e-3)

    # A batch dimension of None: the batching step in the chain still tells the size.
    partial = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = _model().fit(partial, epochs=1, verbose=0, shuffle=False, callbacks=[StepTimer()])
    assert history.history["examples_per_s"][0] > 0

    # Batches from a generator: nothing can tell their size.
    unknown = tf.data.Dataset.from_generator(
        lambda: ((x[i : i + 16], y[i : i + 16]) for i in range(0, 128, 16)),
        output_signature=(
            tf.TensorSpec((None, 8), tf.float32),
            tf.TensorSpec((None, 1), tf.float32),
        ),
    )
    caplog.set_level(logging.WARNING, logger="tfgpu.callbacks")
    history = _model().fit(unknown, epochs=1, verbose=0, shuffle=False, callbacks=[StepTimer()])
    assert math.isnan(history.history["examples_per_s"][0])
    assert any("StepTimer(batch_size=...)" in r.getMessage() for r in caplog.records)
    history = _model().fit(
        unknown, epochs=1, verbose=0, shuffle=False, callbacks=[StepTimer(batch_size=16)]
    )
    assert history.history["examples_per_s"][0] > 0


@pytest.mark.slow
def test_tensorboard_gets_a_scalar_per_sample(fake, tmp_path):
    import tensorflow as tf

    x, y = _data(64)
    gpu_monitor = GPUMonitor(tmp_path, interval=0.02, tensorboard=True)
    _model().fit(
        x, y, batch_size=8, epochs=2, verbose=0, callbacks=[gpu_monitor, _SampleAt(gpu_monitor)]
    )
    values = []
    for path in (tmp_path / "tensorboard").glob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag == "monitor/gpu0_util_pct":
                    values.append(tf.make_ndarray(value.tensor).item())
    assert len(values) == len(gpu_monitor.sampler.samples) >= 4  # start, 2 by hand, stop
    assert set(values) == {50.0}


def test_multi_worker_files_carry_the_task_index_and_a_second_fit_appends(
    fake, tmp_path, monkeypatch
):
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    )
    x, y = _data(64)
    model = _model()
    callbacks = [GPUMonitor(tmp_path, interval=0.05), StepTimer(log_dir=tmp_path)]
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["run-worker1.json", "steps-worker1.csv", "timeline-worker1.csv"]
    assert json.loads((tmp_path / "run-worker1.json").read_text())["worker"] == 1
    _, rows = _csv(tmp_path / "timeline-worker1.csv")
    assert len(rows) >= 4  # two sessions, one header
    _, steps = _csv(tmp_path / "steps-worker1.csv")
    assert len(steps) == 4


def test_both_callbacks_take_log_dir_positionally_as_keras_tensorboard(fake, tmp_path, monkeypatch):
    """`log_dir` is the one positional argument of both, as `keras.callbacks.TensorBoard`'s;
    the rest are keyword-only."""
    monkeypatch.chdir(tmp_path)
    x, y = _data(64)
    callbacks = [GPUMonitor("runs/x", interval=0.05), StepTimer("runs/x")]
    _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
    run = tmp_path / "runs" / "x"
    assert sorted(p.name for p in run.iterdir()) == ["run.json", "steps.csv", "timeline.csv"]
    assert json.loads((run / "run.json").read_text())["timeline"] == "timeline.csv"
    _, steps = _csv(run / "steps.csv")
    assert len(steps) == 2  # one row per step: 64 examples in batches of 32
    with pytest.raises(TypeError, match="positional argument"):
        StepTimer("runs/x", 32)


def test_without_nvml_training_goes_on_with_host_metrics(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    x, y = _data(64)
    with pytest.warns(RuntimeWarning, match="NVIDIA driver") as caught:
        gpu_monitor = GPUMonitor(tmp_path)
        history = _model().fit(
            x,
            y,
            batch_size=32,
            epochs=1,
            verbose=0,
            callbacks=[gpu_monitor, _FirstRow(gpu_monitor)],
        )
    # The warning points at the user's `fit` line, not at a line inside tfgpu.
    (warning,) = [w for w in caught if "NVIDIA driver" in str(w.message)]
    assert warning.filename == __file__, warning.filename
    assert "_model().fit(" in Path(__file__).read_text().splitlines()[warning.lineno - 1]
    assert history.history["host_rss_mib_max"][0] > 0
    assert not any(key.startswith("gpu") for key in history.history)
    header, _ = _csv(tmp_path / "timeline.csv")
    assert header == monitor.timeline_columns(0)


@pytest.mark.parametrize(
    "pynvml", [None, fake_pynvml.make(library_missing=True)], ids=["no-binding", "no-driver"]
)
def test_without_nvml_gpus_given_to_gpu_monitor_are_said_unchecked_at_construction(
    monkeypatch, pynvml
):
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    with pytest.warns(RuntimeWarning, match=r"Argument `gpus` cannot be checked") as caught:
        gpu_monitor = GPUMonitor(gpus=[99])  # TensorFlow lists no GPU here either
    (warning,) = [w for w in caught if "`gpus`" in str(w.message)]
    assert "Received: gpus=[99]" in str(warning.message)
    assert "NVIDIA driver" in str(warning.message)  # why, and the fix
    assert warning.filename == __file__  # this line, not one inside tfgpu
    assert gpu_monitor.sampler.gpus == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPUMonitor()  # no `gpus`: nothing to check, nothing said at construction


@pytest.fixture
def tf_sees(monkeypatch):
    """Scripts TensorFlow's GPUs: `tf_sees(physical=2, visible=[1])` (this CPU stands in)."""
    import tensorflow as tf

    list_physical, get_visible = tf.config.list_physical_devices, tf.config.get_visible_devices

    def script(physical: int, visible: list[int]):
        devices = [
            tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(physical)
        ]
        monkeypatch.setattr(
            tf.config,
            "list_physical_devices",
            lambda kind=None: devices if kind == "GPU" else list_physical(kind),
        )
        monkeypatch.setattr(
            tf.config,
            "get_visible_devices",
            lambda kind=None: [devices[i] for i in visible] if kind == "GPU" else get_visible(kind),
        )

    return script


_CLASSIC = (
    "util_pct_mean",
    "util_pct_max",
    "mem_used_mib_mean",
    "mem_used_mib_max",
    "power_w_mean",
    "power_w_max",
    "host_cpu_pct_mean",
    "host_rss_mib_max",
)


def test_gpu_monitor_samples_the_gpus_tensorflow_was_given(fake, tf_sees, tmp_path):
    # NVML (CUDA) sees the A100 and the V100; TensorFlow was given only the V100, as
    # tfgpu.configure(gpus=[1]) does with tf.config.set_visible_devices.
    tf_sees(physical=2, visible=[1])
    x, y = _data(64)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=False)
    everything = GPUMonitor(tmp_path / "all", interval=0.02)
    first = GPUMonitor(interval=0.02, gpus=[0])  # /GPU:0 is the V100 here
    callbacks = [everything, first, _FirstRow(everything), _FirstRow(first)]
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
    assert [g.name for g in everything.sampler.gpus] == ["Tesla V100-SXM2-16GB"]
    assert [g.name for g in first.sampler.gpus] == ["Tesla V100-SXM2-16GB"]
    assert history.history["gpu_util_pct_mean"] == [10.0]  # the V100's scripted value
    assert math.isnan(history.history["gpu_power_w_total"][0])  # no power sensor
    assert "gpu_util_pct_min" not in history.history  # one GPU: the mean says it all
    assert not [k for k in history.history if k.startswith(("gpu0_", "gpu1_"))]
    meta = json.loads((tmp_path / "all" / "run.json").read_text())
    assert [g["index"] for g in meta["gpus"]] == [1]  # NVML index of the V100
    with pytest.raises(ValueError, match=r"gpus=\[1\].*below 1: TensorFlow uses 1 GPU"):
        GPUMonitor(gpus=[1])
    # Without a restriction, TensorFlow's order is CUDA's: both GPUs, in order.
    tf_sees(physical=2, visible=[0, 1])
    names = [g.name for g in GPUMonitor(interval=0.02).sampler.gpus]
    assert names == ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"]


def test_gpu_monitor_follows_visible_devices_set_after_it_was_built(fake, tf_sees):
    tf_sees(physical=2, visible=[0, 1])
    gpu_monitor = GPUMonitor(interval=0.02)
    assert len(gpu_monitor.sampler.gpus) == 2
    tf_sees(physical=2, visible=[1])  # tfgpu.configure(gpus=[1]) after the callback was made
    x, y = _data(64)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=False)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[gpu_monitor])
    assert [g.name for g in gpu_monitor.sampler.gpus] == ["Tesla V100-SXM2-16GB"]


def test_gpu_numbering_is_cuda_s_without_tensorflow(fake, monkeypatch):
    # TensorFlow not loaded at all: `gpus` numbers the CUDA-visible GPUs, nothing imports it.
    monkeypatch.delitem(sys.modules, "tensorflow")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # the V100 first
    gpu_monitor = GPUMonitor(gpus=[0])
    assert [g.name for g in gpu_monitor.sampler.gpus] == ["Tesla V100-SXM2-16GB"]
    assert "tensorflow" not in sys.modules


def test_auto_peak_reads_tensorflow_s_first_gpu(fake, monkeypatch, tf_sees):
    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)
    tf_sees(physical=2, visible=[1])  # TensorFlow's /GPU:0 is the V100 (cc 7.0: no TF32)
    model = _model()
    v100 = flops.peak_flops("Tesla V100-SXM2-16GB", "float32")
    assert step_timer._auto_peak_flops(model) == pytest.approx(v100)


@pytest.mark.slow
def test_steps_csv_keeps_every_step_of_a_fit_that_raises_and_leaks_no_handle(fake, tmp_path):
    import gc
    import warnings
    import weakref

    x, y = _data(256)  # 8 batches; _Boom raises at the end of batch 2 of the second fit
    model = _model()
    timer = StepTimer(log_dir=tmp_path)
    alive = weakref.ref(timer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[timer])
        # The second fit reopens steps.csv to append, then raises; the traceback is kept
        # alive, as a notebook keeps `sys.last_traceback` (it holds fit's frame).
        with pytest.raises(RuntimeError, match="boom inside fit") as raised:
            model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[timer, _Boom()])
        # Every step that ran is on disk once fit has left the stack, no on_train_end needed:
        # the watcher's pass (every 0.25 s in its thread) run here, without waiting.
        keras_internals.check_fit_watches()
        _, steps = _csv(tmp_path / "steps.csv")
        assert [(r["epoch"], r["step"]) for r in steps] == [(0, s) for s in range(8)] + [
            (0, 0),
            (0, 1),
            (0, 2),
        ]
        del timer, raised
        gc.collect()
        assert alive() is None  # collected: its file must have been closed, not leaked
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, [str(w.message) for w in leaks]


class _FakeClock:
    """A `perf_counter` stand-in that moves only when told: `clock.now += 0.1`."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _fake_clocks(timer: StepTimer) -> _FakeClock:
    clock = _FakeClock()
    timer._perf = clock
    timer._wall = lambda: 1_700_000_000.0 + clock.now  # unix time at the same pace
    return clock


def test_batch_hooks_only_note_times_and_rows_come_in_step_order_from_any_thread(tmp_path):
    # Keras may run batch-end hooks in several pool threads, out of order. The hooks only
    # note the time; rows are built in bulk (here at epoch end: the fake clock stands still).
    n = 400
    timer = StepTimer(batch_size=8, log_dir=tmp_path)
    clock = _fake_clocks(timer)
    timer.set_params({"steps": n})
    timer.on_train_begin()
    timer.on_epoch_begin(0)
    for step in range(n):
        timer.on_train_batch_begin(step)
    ends = list(range(n))
    np.random.default_rng(0).shuffle(ends)
    threads = [
        threading.Thread(target=lambda part: [timer.on_train_batch_end(s) for s in part], args=(p,))
        for p in (ends[0::3], ends[1::3], ends[2::3])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (tmp_path / "steps.csv").read_text().count("\n") == 1  # the header, nothing yet
    clock.now += 0.5
    logs = {}
    timer.on_epoch_end(0, logs)
    _, rows = _csv(tmp_path / "steps.csv")
    assert [r["step"] for r in rows] == list(range(n))
    assert all(r["time"] == pytest.approx(1_700_000_100.0, abs=1e-3) for r in rows)
    assert all(r["step_time_s"] == 0 for r in rows)
    assert logs["step_time_median_s"] == 0 and logs["epoch_time_s"] == pytest.approx(0.5)
    timer.on_train_end()


def test_steps_csv_is_written_about_every_second_during_a_long_epoch(tmp_path):
    # 20 steps of 0.125 s on a fake clock: rows reach the file once a second has passed
    # since the last write, not only at epoch end.
    timer = StepTimer(batch_size=16, log_dir=tmp_path)
    clock = _fake_clocks(timer)
    timer.set_params({"steps": 20})
    timer.on_train_begin()
    timer.on_epoch_begin(0)
    on_disk = []
    for step in range(20):
        timer.on_train_batch_begin(step)
        clock.now += 0.125
        timer.on_train_batch_end(step)
        on_disk.append((tmp_path / "steps.csv").read_text().count("\n") - 1)
    assert on_disk == [0] * 7 + [8] * 8 + [16] * 5  # at 1 s and at 2 s
    timer.on_epoch_end(0, {})
    timer.on_train_end()
    _, steps = _csv(tmp_path / "steps.csv")
    assert [r["step"] for r in steps] == list(range(20))
    assert all(r["step_time_s"] == pytest.approx(0.125) for r in steps)
    assert all(r["examples_per_s"] == pytest.approx(128) for r in steps)


# ---------------------------------------------------------------- earlier runs are kept
def test_steps_csv_with_another_header_or_a_cut_row_is_moved_aside(fake, tmp_path):
    x, y = _data(64)
    old = "time,epoch,step,step_time_s\n1.0,0,0,0.1\n"  # an older tfgpu's columns
    (tmp_path / "steps.csv").write_text(old)
    _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[StepTimer(log_dir=tmp_path)])
    assert (tmp_path / "steps.1.csv").read_text() == old
    text = (tmp_path / "steps.csv").read_text()
    cut = text + "1700000000.000,0,0,0.0"  # a SIGKILL in the middle of a row
    (tmp_path / "steps.csv").write_text(cut)
    _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[StepTimer(log_dir=tmp_path)])
    assert (tmp_path / "steps.2.csv").read_text() == cut
    _, steps = _csv(tmp_path / "steps.csv")
    assert len(steps) == 2


def test_a_gpu_monitor_run_with_other_gpus_rotates_the_timeline(fake, tmp_path):
    x, y = _data(64)
    model = _model()
    # A sample as each fit starts and ends, however long it takes (no interval elapses).
    model.fit(
        x, y, batch_size=32, epochs=1, verbose=0, callbacks=[GPUMonitor(tmp_path, interval=60)]
    )
    first = (tmp_path / "timeline.csv").read_text()
    monitor_one = GPUMonitor(tmp_path, gpus=[1], interval=60)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor_one])
    assert (tmp_path / "timeline.1.csv").read_text() == first
    header, rows = _csv(tmp_path / "timeline.csv")
    assert header == monitor.timeline_columns(1) and len(rows) == 2
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["timeline"] == "timeline.csv"
    assert [s["timeline"] for s in info["earlier_sessions"]] == ["timeline.1.csv"]


# ---------------------------------------------------------------- hostile conditions
def test_a_disk_that_fills_up_mid_fit_never_stops_training(fake, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    gpu_monitor, timer = GPUMonitor(tmp_path, interval=60), StepTimer(log_dir=tmp_path)

    class _FillDisk(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 1 and not isinstance(timer._csv.file, FullDisk | None):
                gpu_monitor.sampler._csv.file = FullDisk(gpu_monitor.sampler._csv.file)
                timer._csv.file = FullDisk(timer._csv.file)

    x, y = _data(128)
    history = _model().fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        verbose=0,
        callbacks=[gpu_monitor, timer, _FillDisk(), _SampleAt(gpu_monitor)],
    )
    assert history.history["gpu_util_pct_mean"] == [30.0, 30.0]  # from memory
    assert len(history.history["examples_per_s"]) == 2
    _, rows = _csv(tmp_path / "timeline.csv")
    assert len(rows) == 1  # the sample taken at start, intact
    assert any("writing the timeline failed" in r.getMessage() for r in caplog.records)
    assert any("writing steps.csv failed" in r.getMessage() for r in caplog.records)


def test_a_run_directory_removed_mid_fit_is_started_again_and_said_once(fake, tmp_path, caplog):
    """`rm -rf runs/exp1` after epoch 1: training goes on, the timeline is written again at its
    path with every row of this run (the sampler holds them), run.json names the session
    again, steps.csv starts again from there; each writer says so once."""
    caplog.set_level(logging.WARNING)
    run = tmp_path / "run"
    gpu_monitor, timer = GPUMonitor(run, interval=60), StepTimer(log_dir=run)

    class _RemoveRun(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch in (0, 1):  # twice: said once all the same
                shutil.rmtree(run)

    x, y = _data(128)
    history = _model().fit(
        x,
        y,
        batch_size=32,
        epochs=3,
        verbose=0,
        callbacks=[gpu_monitor, timer, _SampleAt(gpu_monitor), _RemoveRun()],
    )
    assert len(history.history["examples_per_s"]) == 3
    _, rows = _csv(run / "timeline.csv")
    # The first row, one at batch 3 of each epoch, the last: all of this run's, in order.
    assert [r["epoch"] for r in rows][1:-1] == [0.0, 1.0, 2.0]
    assert len(rows) == 5 and rows == sorted(rows, key=lambda r: r["time"])
    assert json.loads((run / "run.json").read_text())["timeline"] == "timeline.csv"
    _, steps = _csv(run / "steps.csv")
    assert {r["epoch"] for r in steps} == {2.0}  # epochs 0 and 1 went with the directory
    said = [
        r.getMessage() for r in caplog.records if "was removed during the run" in r.getMessage()
    ]
    assert len(said) == 2, said
    assert any("tfgpu.monitor" in m and "with the 2 row(s) this run still held" in m for m in said)
    assert any("StepTimer" in m and "the rows written before went with it" in m for m in said)
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


def test_nvml_raising_anything_mid_fit_never_stops_training(fake):
    def broken():
        raise SystemError("a binding bug")

    class _BreakNvml(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            fake.gpus[0].util = broken
            fake.nvmlDeviceGetCount = broken

    gpu_monitor = GPUMonitor(interval=60, per_gpu_logs=True)
    history = _model().fit(
        *_data(64),
        batch_size=32,
        epochs=2,
        verbose=0,
        callbacks=[_BreakNvml(), gpu_monitor, _SampleAt(gpu_monitor, batch=1)],
    )
    assert all(math.isnan(v) for v in history.history["gpu0_util_pct_mean"])
    assert history.history["gpu1_util_pct_mean"] == [10.0, 10.0]
    assert history.history["gpu_util_pct_mean"] == [10.0, 10.0]  # the GPU still read


@pytest.mark.slow
def test_one_callback_in_two_models_and_two_fits_keeps_every_session(fake, tmp_path):
    gpu_monitor, timer = GPUMonitor(tmp_path, interval=60), StepTimer(log_dir=tmp_path)
    x, y = _data(64)
    for model in (_model(), _model(), _model(steps_per_execution=2)):
        history = model.fit(
            x,
            y,
            batch_size=32,
            epochs=1,
            verbose=0,
            callbacks=[gpu_monitor, _FirstRow(gpu_monitor), timer],
        )
        assert history.history["gpu_util_pct_mean"] == [30.0]
        assert history.history["examples_per_s"][0] > 0
    assert not _monitor_threads()
    info = json.loads((tmp_path / "run.json").read_text())
    assert len(info["earlier_sessions"]) == 2
    _, rows = _csv(tmp_path / "timeline.csv")
    assert len(rows) == 6
    _, steps = _csv(tmp_path / "steps.csv")
    assert [r["step"] for r in steps] == [0, 1, 0, 1, 1]


@pytest.mark.slow
def test_repeated_fits_leave_no_tfgpu_object_in_a_reference_cycle(fake, tmp_path):
    """Whatever a fit with both callbacks leaves behind is freed by reference counting.

    An object in a cycle (or reachable only from one) waits for a full collection, and with
    it the sampler, its NVML handles and open files. `DEBUG_SAVEALL` keeps whatever the
    collector had to free in `gc.garbage`; TensorFlow's and Keras's own cycles are allowed.
    """
    import gc

    import tfgpu

    strategy = tfgpu.strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _model()
    data = tfgpu.data.pipeline(_data(64), batch_size=16, strategy=strategy)
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            callbacks = [GPUMonitor(log_dir=tmp_path, interval=0.02), StepTimer(log_dir=tmp_path)]
            history = model.fit(data, epochs=2, verbose=0, callbacks=callbacks)
            assert len(history.history["gpu_util_pct_mean"]) == 2
            assert len(history.history["examples_per_s"]) == 2
        del callbacks, history
        gc.collect()
        ours = sorted(
            {
                f"{type(obj).__module__}.{type(obj).__qualname__}"
                for obj in gc.garbage
                if (type(obj).__module__ or "").startswith("tfgpu")
            }
        )
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    assert ours == []
    _, rows = _csv(tmp_path / "timeline.csv")  # three sessions, each closed
    assert len(json.loads((tmp_path / "run.json").read_text())["earlier_sessions"]) == 2
    assert rows


def test_gpu_monitor_hooks_outside_fit_never_raise(fake):
    gpu_monitor = GPUMonitor(interval=60)
    logs = {}
    gpu_monitor.on_epoch_end(0, logs)  # no on_train_begin: nothing sampled yet
    assert set(logs) == {
        "gpu_util_pct_mean",
        "gpu_util_pct_min",
        "gpu_mem_used_mib_max",
        "gpu_power_w_total",
        "host_cpu_pct_mean",
        "host_rss_mib_max",
    }
    gpu_monitor.on_train_batch_begin("not a step")  # a wrong label is logged, not raised
    gpu_monitor.on_train_end()
    gpu_monitor.on_train_end()


# ---------------------------------------------------------------- issue 15: epoch logs (pure)
def test_epoch_logs_add_gpm_pcie_and_energy_only_where_known():

    nan = float("nan")
    agg = {k: 1.0 for k in monitor.aggregate_keys(2)}
    agg.update(
        gpu0_sm_active_pct_mean=60.0,
        gpu0_tensor_active_pct_mean=40.0,
        gpu1_sm_active_pct_mean=nan,  # a GPU without GPM next to one with it
        gpu1_tensor_active_pct_mean=nan,
        gpu0_pcie_tx_mib_s_mean=100.0,
        gpu0_pcie_rx_mib_s_mean=50.0,
        gpu1_pcie_tx_mib_s_mean=nan,
        gpu1_pcie_rx_mib_s_mean=nan,
        gpu0_energy_j=600.0,
        gpu1_energy_j=200.0,
    )
    logs = _epoch_logs(agg, 2, seconds=10.0, steps=100, batch_size=32, per_gpu=True)
    assert logs["gpu0_sm_active_pct_mean"] == 60.0 and math.isnan(logs["gpu1_sm_active_pct_mean"])
    assert logs["gpu0_tensor_active_pct_mean"] == 40.0
    assert logs["gpu0_pcie_mib_per_step"] == pytest.approx(150.0 * 10.0 / 100)
    assert logs["joules_per_example"] == pytest.approx(800.0 / 3200)
    assert "gpu0_energy_j" not in logs and "gpu0_power_limit_w_max" not in logs  # diagnose's
    assert logs["host_cpu_pct_mean"] == 1.0 and logs["gpu1_util_pct_max"] == 1.0

    no_gpm = dict(agg, gpu0_sm_active_pct_mean=nan, gpu0_tensor_active_pct_mean=nan)
    no_gpm.update(gpu0_pcie_tx_mib_s_mean=nan, gpu1_energy_j=nan)
    logs = _epoch_logs(no_gpm, 2, seconds=10.0, steps=100, batch_size=32, per_gpu=True)
    assert not [k for k in logs if "active" in k or "pcie" in k]
    assert "joules_per_example" not in logs  # one GPU without energy: no partial sum
    assert "joules_per_example" not in _epoch_logs(agg, 2, 10.0, 100, batch_size=None)
    assert "gpu0_pcie_mib_per_step" not in _epoch_logs(agg, 2, 10.0, 0, 32, per_gpu=True)
    assert "gpu_pcie_mib_per_step" not in _epoch_logs(agg, 2, 10.0, 0, batch_size=32)

    # The default summary: the same facts across GPUs, no gpu{i}_ key.
    agg.update(gpu0_util_pct_mean=90.0, gpu1_util_pct_mean=30.0, gpu1_mem_used_mib_max=7.0)
    agg.update(gpu0_power_w_mean=300.0, gpu1_power_w_mean=100.0)
    logs = _epoch_logs(agg, 2, seconds=10.0, steps=100, batch_size=32)
    assert not [k for k in logs if k.startswith(("gpu0", "gpu1"))]
    assert logs["gpu_util_pct_mean"] == 60.0 and logs["gpu_util_pct_min"] == 30.0
    assert logs["gpu_mem_used_mib_max"] == 7.0 and logs["gpu_power_w_total"] == 400.0
    assert logs["gpu_sm_active_pct_mean"] == 60.0  # over the GPUs that report it
    assert logs["gpu_tensor_active_pct_mean"] == 40.0
    assert logs["gpu_pcie_mib_per_step"] == pytest.approx(15.0)  # all GPUs' traffic
    assert logs["joules_per_example"] == pytest.approx(800.0 / 3200)
    assert set(logs) <= set(_SUMMARY_KEYS) and len(logs) == len(_SUMMARY_KEYS) == 10
    # One GPU: no min beside a mean it equals; no GPU: host keys only.
    one = _epoch_logs(agg, 1, seconds=10.0, steps=100, batch_size=32)
    assert "gpu_util_pct_min" not in one and one["gpu_util_pct_mean"] == 90.0
    assert one["gpu_power_w_total"] == 300.0
    assert set(_epoch_logs(agg, 0, 10.0, 100, 32)) == {"host_cpu_pct_mean", "host_rss_mib_max"}


def test_step_timer_reads_the_batch_size_of_a_pipeline_with_a_partial_last_batch(caplog):
    # 100 examples in batches of 32: the batch dimension is None (the last batch holds 4), so
    # Keras's adapter cannot tell; the batching step in the dataset's chain can.
    x, y = _data(100)
    from tfgpu.data import pipeline

    train = pipeline((x, y), batch_size=32, shuffle=False)
    assert train.element_spec[0].shape[0] is None
    with caplog.at_level("WARNING", logger="tfgpu"):
        history = _model().fit(train, epochs=1, verbose=0, callbacks=[StepTimer()])
    assert "batch size is unknown" not in caplog.text
    assert np.isfinite(history.history["examples_per_s"][0])


# ---------------------------------------------------------------- issue 16: short logs, true steps
def _eight_gpus(monkeypatch):
    gpus = [
        fake_pynvml.FakeGpu(
            uuid=f"GPU-{i:08d}-1111-2222-3333-444444444444",
            pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            util=10.0 * (i + 1),
            memory_used_mib=1000.0 + i,
        )
        for i in range(8)
    ]
    fake = fake_pynvml.make(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    for name in ("CUDA_VISIBLE_DEVICES", "TF_CONFIG", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    return fake


def test_eight_gpus_keep_the_progress_line_short_and_the_timeline_whole(monkeypatch, tmp_path):
    _ticking(_eight_gpus(monkeypatch))
    x, y = _data(64)  # 2 batches of 32
    short = GPUMonitor(tmp_path / "short", interval=60)
    history = _model().fit(
        x,
        y,
        batch_size=32,
        epochs=1,
        verbose=0,
        callbacks=[short, _SampleAt(short, batch=1), StepTimer()],
    )
    added = set(history.history) - {"loss"}
    from_monitor = added - STEP_KEYS
    assert len(from_monitor) <= 10 and len(added) <= 16, sorted(added)
    assert not [k for k in added if k[3:4].isdigit()]  # no gpu{i}_ key by default
    assert history.history["gpu_util_pct_mean"] == [45.0]  # 10, 20, ..., 80
    assert history.history["gpu_util_pct_min"] == [10.0]
    assert history.history["gpu_mem_used_mib_max"] == [1007.0]
    assert history.history["gpu_power_w_total"] == [8 * 250.0]
    # The run files keep every GPU, whatever goes into the logs.
    header, rows = _csv(tmp_path / "short" / "timeline.csv")
    assert header == monitor.timeline_columns(8)
    assert [rows[-1][f"gpu{i}_util_pct"] for i in range(8)] == [10.0 * (i + 1) for i in range(8)]
    assert len(json.loads((tmp_path / "short" / "run.json").read_text())["gpus"]) == 8

    full = GPUMonitor(interval=60, per_gpu_logs=True)
    history = _model().fit(
        x, y, batch_size=32, epochs=1, verbose=0, callbacks=[full, _SampleAt(full, batch=1)]
    )
    per_gpu = {f"gpu{i}_{key}" for i in range(8) for key in _CLASSIC[:6]}
    assert per_gpu <= set(history.history)
    assert {f"gpu{i}_pcie_mib_per_step" for i in range(8)} <= set(history.history)
    assert history.history["gpu7_util_pct_mean"] == [80.0]
    assert from_monitor <= set(history.history)  # the summary stays, same keys


def test_per_gpu_logs_must_be_a_bool(fake):
    with pytest.raises(TypeError, match=r"per_gpu_logs.*Received: per_gpu_logs='yes'"):
        GPUMonitor(per_gpu_logs="yes")


class _Energy:
    """A GPU energy counter that goes up 100 J at each reading: deltas count samples."""

    def __init__(self):
        self.joules = 1000.0

    def __call__(self) -> float:
        self.joules += 100.0
        return self.joules


@pytest.mark.parametrize("cardinality", ["known", "unknown"])
@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_fewer_batches_than_steps_per_execution_report_the_true_steps(fake, tmp_path, cardinality):
    import tensorflow as tf

    # 4 batches of 32 under steps_per_execution=16: Keras's hooks say steps 0 to 15 ("16/4").
    x, y = _data(128)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    if cardinality == "unknown":
        data = data.filter(lambda *_: True)  # tf.data cannot tell its length
        assert int(data.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    for gpu in fake.gpus:
        gpu.energy_j = _Energy()
    gpu_monitor = GPUMonitor(interval=60)
    timer = StepTimer(log_dir=tmp_path)
    callbacks = [gpu_monitor, _SampleAt(gpu_monitor, 0), _SampleAt(gpu_monitor, 0), timer]
    history = _model(steps_per_execution=16).fit(data, epochs=2, verbose=0, callbacks=callbacks)

    _, rows = _csv(tmp_path / "steps.csv")
    assert [(r["epoch"], r["step"]) for r in rows] == [(0, 3), (1, 3)]  # the 4th step, 0-based
    for r, epoch_time in zip(rows, history.history["epoch_time_s"]):
        seconds = r["step_time_s"] * (r["step"] + 1)  # what the report adds up
        assert 0 < seconds <= epoch_time  # never more time in steps than the epoch took
        assert r["examples_per_s"] * seconds == pytest.approx(128, rel=1e-3)  # 4 x 32
    # Keras-logged rates agree: 4 steps of 32 over the execution, not 16.
    for median, rate in zip(
        history.history["step_time_median_s"], history.history["examples_per_s"]
    ):
        assert rate * median == pytest.approx(32, rel=1e-3)
    # GPUMonitor divides by the same 4 steps: two samples, 100 J each on each of 2 GPUs.
    assert history.history["joules_per_example"] == [pytest.approx(200.0 / 128)] * 2


def test_the_last_execution_of_an_epoch_of_unknown_length_is_held_until_its_count_is_known(
    tmp_path,
):
    # Pure bookkeeping with a fake clock: a row written before the epoch ends may be the
    # one the data cut short, so it waits; at epoch end the optimizer's count fixes it.
    timer = StepTimer(batch_size=10, log_dir=tmp_path)
    timer.set_params({"steps": None, "epochs": 1})
    clock = _fake_clocks(timer)
    counts = iter([100, 120])  # the optimizer's iterations at epoch begin and end
    timer.set_model(types.SimpleNamespace(optimizer=_FakeOptimizer(counts)))
    timer.on_train_begin()
    timer.on_epoch_begin(0)
    for begin in (0, 16):
        timer.on_train_batch_begin(begin)
        clock.now += 1.6 if begin == 0 else 0.4  # 16 steps, then 4
        timer.on_train_batch_end(begin + 15)
    timer._sync(final=False)  # mid-epoch: the first row is written, the last waits
    _, rows = _csv(tmp_path / "steps.csv")
    assert [r["step"] for r in rows] == [15]
    logs = {}
    timer.on_epoch_end(0, logs)
    timer.on_train_end()
    _, rows = _csv(tmp_path / "steps.csv")
    assert [r["step"] for r in rows] == [15, 19]  # 16 + 4 steps, not 32
    assert rows[1]["step_time_s"] == pytest.approx(0.1)
    assert logs["step_time_median_s"] == pytest.approx(0.1)
    assert logs["examples_per_s"] == pytest.approx(10 * 4 / 0.4)


class _FakeOptimizer:
    def __init__(self, counts):
        self._counts = counts
        self.gradient_accumulation_steps = None

    @property
    def iterations(self):
        return np.int64(next(self._counts))


def test_optimizer_steps_and_the_last_execution_s_count():
    assert _steps.true_last_steps([16], 4) == 4
    assert _steps.true_last_steps([16, 16], 20) == 4
    assert _steps.true_last_steps([16], 16) is None  # nothing to correct
    assert _steps.true_last_steps([16], 40) is None  # a count that does not fit
    assert _steps.true_last_steps([16, 16], 10) is None
    assert _steps.true_last_steps([], 4) is None and _steps.true_last_steps([3], None) is None
    assert _steps.steps_between(5, 9) == 4 and _steps.steps_between(None, 9) is None
    assert _steps.known_epoch_steps({"steps": 4}) == 4
    assert _steps.known_epoch_steps({"steps": None}) is None
    assert _steps.known_epoch_steps(None) is None
    model = _model()
    model.fit(*_data(64), batch_size=32, epochs=1, verbose=0)
    assert _steps.optimizer_steps(model) == 2
    assert _steps.optimizer_steps(types.SimpleNamespace(optimizer=None)) is None
    accumulating = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    accumulating.compile(keras.optimizers.SGD(gradient_accumulation_steps=2), "mse")
    assert _steps.optimizer_steps(accumulating) is None  # counts updates, not steps


def test_docs_and_docstrings_list_every_logged_key_and_every_argument():
    import inspect

    text = (REPO / "docs" / "metrics.md").read_text()
    for key in _SUMMARY_KEYS:
        assert f"| `{key}` |" in text, key  # a row of the summary table
        assert f"`{key}`" in GPUMonitor.__doc__, key
    for key in ("pcie_mib_per_step", "sm_active_pct_mean", "tensor_active_pct_mean"):
        assert f"`gpu{{i}}_{key}`" in text and f"`gpu{{i}}_{key}`" in GPUMonitor.__doc__
    for key in [*STEP_KEYS, "mfu"]:
        assert f"| `{key}` |" in text and f"`{key}`" in StepTimer.__doc__, key
    for callback in (GPUMonitor, StepTimer):
        for name in inspect.signature(callback.__init__).parameters:
            if name != "self":
                assert f"| `{name}` |" in text, (callback.__name__, name)  # the arguments table
                assert f"        {name}: " in callback.__doc__, (callback.__name__, name)


@pytest.mark.slow
def test_one_gpu_monitor_in_two_concurrent_fits_is_refused_at_the_second(fake, tmp_path):
    x, y = _data(64)
    monitor_cb = GPUMonitor(log_dir=tmp_path, interval=0.05)
    started, release = threading.Event(), threading.Event()

    class Hold(keras.callbacks.Callback):  # keeps the first fit inside its first batch
        def on_train_batch_end(self, batch, logs=None):
            started.set()
            release.wait(30)

    errors: list[BaseException] = []

    def first_fit():
        try:
            _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor_cb, Hold()])
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=first_fit)
    thread.start()
    try:
        assert started.wait(60)
        with pytest.raises(RuntimeError, match="already monitoring a `fit` running in another"):
            _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor_cb])
        assert monitor_cb.sampler.running  # the first fit's sampling goes on
    finally:
        release.set()
        thread.join(60)
    assert not errors
    # Once the first fit is over, the same callback serves a fit in this thread again.
    _model().fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor_cb])
    assert not monitor_cb.sampler.running


def test_step_timer_logs_what_tune_measured_for_a_tuned_model(caplog):
    from tfgpu.tuning import TuneResult

    x, y = _data(64)
    model = _model()
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[StepTimer()])
    assert "tuned_examples_per_s" not in history.history  # never tuned
    result = TuneResult(trials=[], settings={"steps_per_execution": 2})
    result.tuned_examples_per_s = 1e12  # out of reach: the first epoch falls short
    result.apply(model)
    with caplog.at_level(logging.WARNING, logger="tfgpu.callbacks"):
        history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[StepTimer()])
    assert history.history["tuned_examples_per_s"] == [1e12, 1e12]
    short = [r.getMessage() for r in caplog.records if "tune measured" in r.getMessage()]
    assert len(short) == 1 and "of the 1,000,000,000,000 tune measured" in short[0]
    # apply() left a step to trace: the first epoch includes it, the second is compared.
    assert "in the first epoch after tracing (epoch 2)" in short[0]


def test_step_timer_never_holds_tracing_against_what_tune_measured(caplog):
    """`steps_per_execution=16` and 16 batches: an epoch is one execution, the first also
    traces (it read 1% of what tune measured, the second epoch ran 80x faster). A fit whose
    only epoch traces is not judged; the next fit of the same step is, from its first."""
    from tfgpu.tuning import TuneResult

    x, y = _data(256)
    model = _model()
    result = TuneResult(trials=[], settings={"steps_per_execution": 16})
    result.tuned_examples_per_s = 1e12  # out of reach: any epoch compared falls short
    result.apply(model)
    with caplog.at_level(logging.WARNING, logger="tfgpu.callbacks"):
        history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[StepTimer()])
        assert history.history["tuned_examples_per_s"] == [1e12]
        assert not [r for r in caplog.records if "tune measured" in r.getMessage()]
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[StepTimer()])
    short = [r.getMessage() for r in caplog.records if "tune measured" in r.getMessage()]
    assert len(short) == 1 and "in the first epoch (epoch 1)" in short[0]
