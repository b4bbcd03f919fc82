"""Checks that need a real NVIDIA GPU visible to TensorFlow; skipped (with the reason) elsewhere.

Everything here is also tested without a GPU (fake NVML, logical CPU devices, CPU memory
stats); these tests confirm the same behaviour against the real driver and device.
"""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest

import tfgpu
from tests.conftest import run_python

pytestmark = pytest.mark.gpu


def _model(width: int = 1024) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((width,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_environment_sees_the_gpu_through_tensorflow_and_nvml():
    report = tfgpu.environment().to_dict()
    assert report["facts"]["tensorflow"]["gpus"], "TensorFlow lists no GPU"
    assert report["facts"]["nvml"]["gpus"], "NVML lists no GPU"
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def test_configure_applies_memory_growth_in_a_fresh_process():
    code = (
        "import json, tfgpu, tensorflow as tf\n"
        "cfg = tfgpu.configure()\n"
        "gpus = tf.config.list_physical_devices('GPU')\n"
        "print(json.dumps({'growth': [tf.config.experimental.get_memory_growth(g) for g in gpus],"
        " 'precision': cfg.precision}))\n"
    )
    out = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert out["growth"] and all(out["growth"])
    assert out["precision"] in {"mixed_bfloat16", "mixed_float16", "float32"}


def test_gpu_monitor_records_real_utilization_and_memory(tmp_path):
    x = np.random.rand(8192, 1024).astype("float32")
    y = np.random.randint(0, 10, 8192)
    history = _model().fit(
        x,
        y,
        batch_size=512,
        epochs=2,
        verbose=0,
        callbacks=[tfgpu.callbacks.GPUMonitor(log_dir=tmp_path, interval=0.1)],
    )
    assert history.history["gpu_mem_used_mib_max"][-1] > 0
    assert not math.isnan(history.history["gpu_util_pct_mean"][-1])
    rows = (tmp_path / "timeline.csv").read_text().splitlines()
    assert len(rows) > 2


def test_find_batch_size_stays_inside_a_real_memory_budget():
    x = np.random.rand(4096, 1024).astype("float32")
    y = np.random.randint(0, 10, 4096)
    result = tfgpu.find_batch_size(_model(), (x, y), max_batch_size=1024, memory_fraction=0.5)
    assert result.largest is not None and result.device.startswith("GPU")
    fitted = [t for t in result.trials if t.batch_size == result.largest and t.fits]
    assert fitted and fitted[0].peak_memory_bytes <= result.memory_budget_bytes
