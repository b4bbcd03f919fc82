"""Test setup shared by the whole suite.

TensorFlow can split the CPU into logical devices only before its runtime starts, so this
happens once, here, before any test: the process sees 4 logical CPU devices
(`/cpu:0` .. `/cpu:3`), enough for `MirroredStrategy` with 2 or 4 replicas. Tests that must
see an uninitialized runtime (e.g. `configure()` applied for real) run in a subprocess.
"""

from __future__ import annotations

import itertools
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


class _FreshCollectiveKeys:
    """A class attribute that reads as a new collective key base at every access.

    `MirroredStrategy` and `MultiWorkerMirroredStrategy` read `_collective_key_base` once, when
    built, and number their collective groups from it (from 1 by default). The runtime keeps,
    per (group, instance) key, the shape first reduced under it for the life of the process,
    so two strategies built directly with TensorFlow in one process, training models of
    different sizes, abort with "Shape mismatch in the collective instance 100"
    (tensorflow/tensorflow#61314; `tests/test_distribute.py` checks it is still so). The
    suite builds many such strategies in one process; with this each gets keys of its own,
    as if each test ran in a fresh process (TensorFlow's own tests bump the same attribute).
    Strategies from `tfgpu.strategy()` set the attribute on the instance, which wins.
    """

    _FIRST = 1 << 30  # above tfgpu's own range; int32 keys for 260k strategies
    _STRIDE = 1 << 12

    def __init__(self):
        self._count = itertools.count()

    def __get__(self, instance, owner):
        return self._FIRST + next(self._count) * self._STRIDE


@pytest.fixture(scope="session", autouse=True)
def _own_collective_keys_for_every_strategy():
    import tensorflow as tf

    classes = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    saved = {cls: cls.__dict__.get("_collective_key_base") for cls in classes}
    fresh = _FreshCollectiveKeys()
    for cls in classes:
        if isinstance(saved[cls], int):
            cls._collective_key_base = fresh
    yield
    for cls, value in saved.items():
        if isinstance(value, int):
            cls._collective_key_base = value


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
    """Restores the Keras precision policy, op determinism and the environment after each test."""
    import keras
    from tensorflow.python.framework import config as tf_config

    policy = keras.mixed_precision.global_policy().name
    deterministic = tf_config.is_op_determinism_enabled()
    environ = dict(os.environ)
    yield
    keras.mixed_precision.set_global_policy(policy)
    if tf_config.is_op_determinism_enabled() != deterministic:
        (tf_config.enable_op_determinism if deterministic else tf_config.disable_op_determinism)()
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


@pytest.fixture
def unwritable(tmp_path):
    """A directory this process cannot write to: read-only permissions, or (for root, whom
    permissions do not stop) /proc."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    yield read_only if not os.access(read_only, os.W_OK) else Path("/proc")
    read_only.chmod(0o755)


class FoundOneSize:
    """A stand-in for `find_batch_size`'s result for tune's tests: the current batch size
    fits and is the fastest (the batch-size candidate finds nothing faster)."""

    def __init__(self, current):
        trial = type("T", (), {"global_batch_size": current, "fits": True})()
        trial.examples_per_s = 1000.0
        self.trials, self.fastest_global = [trial], current
