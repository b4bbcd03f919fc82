"""Test setup shared by the whole suite.

TensorFlow can split the CPU into logical devices only before its runtime starts, so this
happens once, here, before any test: the process sees 4 logical CPU devices
(`/cpu:0` .. `/cpu:3`), enough for `MirroredStrategy` with 2 or 4 replicas. Tests that must
see an uninitialized runtime (e.g. `configure()` applied for real) run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

REPO = Path(__file__).resolve().parent.parent
LOGICAL_CPUS = 4


def pytest_configure(config):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(LOGICAL_CPUS)]
    )


def _has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU visible to TensorFlow; none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Restores the Keras precision policy and the environment after every test."""
    import keras

    policy = keras.mixed_precision.global_policy().name
    environ = dict(os.environ)
    yield
    keras.mixed_precision.set_global_policy(policy)
    os.environ.clear()
    os.environ.update(environ)


def run_python(code: str, *, env: dict | None = None, timeout: float = 240, check: bool = True):
    """Runs `code` in a fresh Python process (fresh TensorFlow runtime); returns the result."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=str(REPO),
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({result.returncode}):\nSTDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr[-4000:]}"
        )
    return result
