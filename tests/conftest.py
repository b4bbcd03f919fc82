"""Test setup shared by the whole suite.

TensorFlow can split the CPU into logical devices only before its runtime starts, so this
happens once, here, before any test: the process sees 4 logical CPU devices
(`/cpu:0` .. `/cpu:3`), enough for `MirroredStrategy` with 2 or 4 replicas. Tests that must
see an uninitialized runtime (e.g. `configure()` applied for real) run in a subprocess.
"""

from __future__ import annotations

import gc
import itertools
import math
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


# The test files that take longest (in this order: 200 s down to 40 s of tests on a 2-core
# machine), collected first: `make test` hands whole files to its workers in collection order
# (`--dist loadfile --no-loadscope-reorder`), and a long file handed out last would keep one
# worker busy while the others wait at the end. The other files follow in their own order.
_LONGEST_FILES = (
    "test_docs.py", "test_backup_distributed.py", "test_examples.py", "test_data_service.py",
    "test_docs_from_keras.py", "test_tune_script.py", "test_multi_worker.py",
    "test_diagnosis.py", "test_data.py", "test_backup.py", "test_keras_examples.py",
    "test_demo.py", "test_callbacks.py", "test_run.py", "test_distribute.py", "test_warnings.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU visible to TensorFlow; none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _collected_and_frozen_after_each_test():
    """Collects each test's garbage when it ends, then freezes what is left alive
    (`gc.freeze`): later collections, ours and Python's own, walk only what later tests make.

    Without this, the suite's workers (hundreds of thousands of objects by the end) spend
    0.3 s in every full collection, and a tf.data iterator left in a reference cycle by one
    test is destroyed in a collection minutes later, during another test: its autotuning
    thread, whose wait grows with the iterator's age up to 60 s, can miss its wake-up
    (TensorFlow's `Model::OptimizeLoop` re-checks `IsCancelled()` before the cancellation
    manager sets it) and the destructor waits the rest of that period holding the GIL (stalls
    of 40-80 s seen in full suites). Collected at the end of its own test, an iterator is as
    young as that test. Objects alive at a test's end that die later (a module fixture's)
    stay frozen: a small leak, never a wrong result."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Restores the Keras precision policy, op determinism and the environment after each
    test, and unsets TensorFlow's global seed (as in a fresh process; a module's fixture may
    have set it before this one ran). A global seed left behind fixes the op seed of every
    random op built later: a dataset's randomness would repeat in another test, by the order
    tests ran in."""
    import keras
    import tensorflow as tf
    from tensorflow.python.eager import context
    from tensorflow.python.framework import config as tf_config

    policy = keras.mixed_precision.global_policy().name
    deterministic = tf_config.is_op_determinism_enabled()
    environ = dict(os.environ)
    yield
    keras.mixed_precision.set_global_policy(policy)
    if context.global_seed() is not None:
        tf.random.set_seed(None)
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
        trial = type("T", (), {"batch_size": current, "fits": True})()
        trial.examples_per_s = 1000.0
        self.trials, self.fastest = [trial], current


# The device facts of a CPU host without native bfloat16 and one core, for tests that set
# the measuring core's `facts.device_facts` (update them for a test's machine).
CPU_FACTS = {
    "on_gpu": False,
    "gpu_name": None,
    "compute_capabilities": (),
    "memory_capacity_bytes": None,
    "cpu_native_bf16": False,
    "cpu_count": 1,
}


def tune_on_a_plain_cpu(monkeypatch, batch_size: int, cpu_count: int = 1) -> None:
    """What tune's tests run on, whatever this machine is: `CPU_FACTS` with `cpu_count`
    cores, no XLA candidate (Keras refuses it), and a batch-size search that finds nothing
    faster than `batch_size`."""
    import tfgpu.batch_size
    from tfgpu._internal.adapters import model_state
    from tfgpu._internal.measure import facts

    monkeypatch.setattr(facts, "device_facts", lambda: {**CPU_FACTS, "cpu_count": cpu_count})
    monkeypatch.setattr(model_state, "supports_xla", lambda model: False)
    monkeypatch.setattr(
        tfgpu.batch_size, "find_batch_size", lambda model, data, **k: FoundOneSize(batch_size)
    )


class ScriptedTiming:
    """The suite's one scripted timing engine: the measuring core's clock and timed fits
    (`tfgpu._internal.measure.timing`) replaced, so that no test depends on this machine's
    speed or load.

    `step(model, dataset)` gives each timed fit's seconds per step (a number; or raises, as a
    failing fit would); the clock (`timing.now`) advances by the fit's steps, and a fit that
    would pass its deadline ends there and returns None, as a real deadline cuts it. A model
    without a train function is traced first: by a real fit of one step (`real_fit`, so that
    a step traced for real is restored and measured around), else by marking it traced;
    `trace_s` is added to that fit. `input_s` is the pipeline alone's seconds per batch.
    `calls` counts the timed fits. `runs(...)` makes scripted `timing.Run`s for the engine's
    own tests.
    """

    def __init__(self, monkeypatch, step=None, *, input_s=0.0, real_fit=False, trace_s=0.0):
        from tfgpu._internal.measure import timing

        self.clock = 1000.0
        self.calls = 0
        self.step, self.input_s, self.real_fit, self.trace_s = step, input_s, real_fit, trace_s
        self._real_epoch_time = timing.epoch_time
        monkeypatch.setattr(timing, "now", lambda: self.clock)
        if step is None:
            return
        monkeypatch.setattr(timing, "fit_step_time", self.fit_step_time)
        monkeypatch.setattr(timing, "epoch_time", self.epoch_time)
        monkeypatch.setattr(timing, "probe_step_time", self.probe_step_time)
        monkeypatch.setattr(timing, "input_time", lambda dataset, batches=10: self.input_s)

    def _traced(self, model, dataset) -> float:
        if model.train_function is not None:
            return 0.0
        if self.real_fit:
            self._real_epoch_time(model, dataset, 1, 1)
        else:
            model.train_function = _never_called
        return self.trace_s

    def _fit(self, model, dataset, steps, deadline):
        """A fit of whole `steps` (epochs, a first look): cut at the deadline, it returns None."""
        traced = self._traced(model, dataset)
        seconds = float(self.step(model, dataset))
        self.calls += 1
        if deadline is not None and self.clock + traced + seconds * steps > deadline:
            self.clock = max(self.clock, deadline)
            return None
        self.clock += traced + seconds * steps
        return seconds

    def fit_step_time(self, model, dataset, steps, warmup, deadline=None, timed_limit_s=None):
        """The steady step: the engine's calls, the timed ones cut at `timed_limit_s`, the fit
        stopped at the first call that ends past `deadline` (None: no timed call ran)."""
        from tfgpu._internal.measure import timing

        traced = self._traced(model, dataset)
        seconds = float(self.step(model, dataset))
        self.calls += 1
        spe = max(1, int(model.steps_per_execution))
        warm, timed = timing.call_counts(spe, steps, warmup)
        call = seconds * spe
        if timed_limit_s is not None:
            timed = min(timed, max(1, math.ceil(timed_limit_s / call - 1e-9)))
        calls = warm + timed
        if deadline is not None:
            calls = min(calls, max(1, math.ceil((deadline - self.clock - traced) / call)))
        self.clock += traced + calls * call
        return seconds if calls > warm else None

    def epoch_time(
        self,
        model,
        dataset,
        epochs=1,
        steps_per_epoch=None,
        steps_in_epoch=None,
        deadline=None,
        timed_limit_s=None,
    ):
        steps = epochs * (steps_per_epoch or steps_in_epoch or 1)
        return self._fit(model, dataset, steps, deadline)

    def probe_step_time(self, model, dataset, deadline=None, timed_limit_s=None):
        """A first look: the call that traces and two more (`timed_limit_s` not scripted)."""
        return self._fit(model, dataset, 3, deadline)

    def runs(self, name, times, log, seconds_per_run=10.0):
        """A `timing.Run` named `name` returning `times` (a number, a function of the call's
        index, or an exception to raise), logging its calls and advancing the clock."""
        calls = [0]

        def run(deadline, limit):
            log.append((name, limit))
            self.clock += seconds_per_run
            value = times(calls[0]) if callable(times) else times
            calls[0] += 1
            if isinstance(value, BaseException):
                raise value
            return value

        return run


class FullDisk:
    """The open file of a run-directory writer (`RunCsv.file`) on a disk that has just filled
    up: every write fails with ENOSPC; the file is still there (its `fileno`)."""

    def __init__(self, file):
        self.file = file

    def fileno(self):
        return self.file.fileno()

    def write(self, text):
        raise OSError(28, "No space left on device")

    flush = write

    def close(self):
        self.file.close()


def _never_called(*args):  # what a scripted fit leaves as the model's train function
    raise AssertionError("a scripted train function is never called")


def prepare_tfds(data_dir, name, *, side, classes, splits, level=1, ids=False) -> str:
    """The suite's one TFDS builder: a tiny image dataset `name` built and prepared in
    `data_dir` from examples made here (no download). `splits` maps each split to its
    example indices; image i is `side` x `side` x 1, flat at `level * i`; its label is
    `i % classes` (and its "id" i where `ids`). Returns `data_dir` as a str."""
    tfds = pytest.importorskip("tensorflow_datasets")
    import numpy as np

    features = {
        "image": tfds.features.Image(shape=(side, side, 1)),
        "label": tfds.features.ClassLabel(num_classes=classes),
        **({"id": np.int64} if ids else {}),
    }
    dataset_name = name

    class TinyImages(tfds.core.GeneratorBasedBuilder):
        name = dataset_name
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return self.dataset_info_from_configs(
                features=tfds.features.FeaturesDict(features), supervised_keys=("image", "label")
            )

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(indices) for split, indices in splits.items()}

        def _generate_examples(self, indices):
            for i in indices:
                image = np.full((side, side, 1), level * i, np.uint8)
                yield i, {"image": image, "label": i % classes, **({"id": i} if ids else {})}

    TinyImages(data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir)
