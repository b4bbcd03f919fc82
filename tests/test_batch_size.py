"""The batch-size finder: search order, OOM by type, memory budget, strategy, state left alone."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.batch_size import (
    BatchSizeResult,
    _accumulation_plan,
    _next_candidate,
    find_batch_size,
)


def _search(fails_above: int, **kw) -> list[int]:
    """Runs the pure search against a fake: sizes above `fails_above` fail."""
    trials: list[tuple[int, bool]] = []
    while (b := _next_candidate(trials, **kw)) is not None:
        trials.append((b, b <= fails_above))
    return [b for b, _ in trials]


def test_search_doubles_then_bisects_on_multiples_of_8():
    kw = dict(start=8, max_batch_size=4096, multiple_of=8)
    assert _search(40, **kw) == [8, 16, 32, 64, 48, 40]
    assert _search(100, **kw) == [8, 16, 32, 64, 128, 96, 112, 104]


def test_search_bisects_to_one_without_rounding():
    assert _search(41, start=8, max_batch_size=4096, multiple_of=1) == [
        8, 16, 32, 64, 48, 40, 44, 42, 41,
    ]  # fmt: skip


def test_search_stops_at_max_and_halves_when_start_fails():
    assert _search(10**6, start=8, max_batch_size=100, multiple_of=8) == [8, 16, 32, 64, 100]
    assert _search(3, start=8, max_batch_size=100, multiple_of=8) == [8, 4, 2, 3]
    assert _search(0, start=2, max_batch_size=100, multiple_of=8) == [2, 1]


def test_accumulation_plan():
    assert _accumulation_plan(1024, 96, 1) == (16, 64)  # 11 steps of ~93 don't divide; 16x64
    assert _accumulation_plan(256, 64, 2) == (2, 64)
    assert _accumulation_plan(100, 128, 1) == (1, 100)
    steps, per = _accumulation_plan(1000, 48, 3)
    assert steps * per * 3 >= 1000 and per <= 48


@keras.saving.register_keras_serializable(package="tfgpu_tests")
class _OOMAbove(keras.layers.Layer):
    """Raises the real `ResourceExhaustedError` when the batch is larger than `limit`."""

    def __init__(self, limit: int, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    def call(self, x):
        if x.shape[0] is not None and x.shape[0] > self.limit:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"OOM when allocating tensor with shape[{x.shape[0]},16]"
            )
        return x

    def get_config(self):
        return {**super().get_config(), "limit": self.limit}


def _model(extra=None, width=16):
    layers = [keras.Input((8,)), keras.layers.Dense(width)]
    if extra is not None:
        layers.append(extra)
    layers.append(keras.layers.Dense(1))
    model = keras.Sequential(layers)
    return model


def _data(n=64):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 8)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def _state(model):
    return [v.numpy().copy() for v in model.weights] + [
        v.numpy().copy() for v in model.optimizer.variables
    ]


def test_oom_path_runs_exact_trials_and_leaves_model_as_found():
    model = _model(_OOMAbove(40))
    model.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # non-trivial optimizer state
    before = _state(model)

    result = find_batch_size(model, (x, y), start=8, max_batch_size=1024, steps=1)

    assert isinstance(result, BatchSizeResult)
    assert [t.batch_size for t in result.trials] == [8, 16, 32, 64, 48, 40]
    assert [t.reason for t in result.trials] == ["ok", "ok", "ok", "oom", "oom", "ok"]
    assert result.largest == 40 and result.largest_global == 40
    assert result.fastest in (8, 16, 32, 40)
    assert all(t.examples_per_second > 0 for t in result.trials if t.fits)
    after = _state(model)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert "largest that fits: 40" in str(result)


def test_memory_budget_gives_a_real_limit_on_cpu():
    model = _model(width=2048)
    model.compile("sgd", "mse")
    x, y = _data(256)
    free = find_batch_size(model, (x, y), start=64, max_batch_size=512, steps=1)
    peaks = {t.batch_size: t.peak_memory_bytes for t in free.trials}
    assert peaks[512] > peaks[64] > 0  # peak grows with the batch
    budget = (peaks[128] + peaks[256]) // 2

    limited = find_batch_size(
        model, (x, y), start=64, max_batch_size=512, steps=1, memory_limit_bytes=budget
    )
    assert limited.memory_budget_bytes == budget
    assert 128 <= limited.largest < 256
    over = [t for t in limited.trials if t.reason == "over_budget"]
    assert over and all(t.peak_memory_bytes > budget for t in over)
    assert all(t.peak_memory_bytes <= budget for t in limited.trials if t.fits)


def test_under_a_strategy_sizes_are_per_replica_and_global_is_reported():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _model(_OOMAbove(16))
        model.compile("sgd", "mse", run_eagerly=True)
    x, y = _data()
    before = [w.numpy().copy() for w in model.weights]
    result = find_batch_size(
        model, (x, y), start=8, max_batch_size=64, steps=1, target_global_batch_size=128
    )
    assert result.num_replicas == 2
    assert [t.batch_size for t in result.trials] == [8, 16, 32, 24]
    assert [t.global_batch_size for t in result.trials] == [16, 32, 64, 48]
    assert result.largest == 16 and result.largest_global == 32
    steps, per = result.gradient_accumulation_steps, result.accumulation_batch_size
    assert steps * per * 2 == 128 and per <= 16
    for a, w in zip(before, model.weights):
        np.testing.assert_array_equal(a, w.numpy())


def test_dataset_input_and_accumulation_steps():
    x, y = _data(32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    model = _model(_OOMAbove(32))
    model.compile("sgd", "mse", run_eagerly=True)
    result = find_batch_size(model, ds, start=16, steps=1, target_global_batch_size=96)
    assert result.largest == 32
    assert result.gradient_accumulation_steps * result.accumulation_batch_size == 96
    assert result.to_dict()["trials"][-1]["reason"] == "oom"


@pytest.mark.slow
def test_in_subprocess_leaves_this_process_alone_and_says_so():
    model = _model(_OOMAbove(16))
    model.compile("sgd", "mse", run_eagerly=True)
    x, y = _data()
    before = [w.numpy().copy() for w in model.weights]
    opt_built = model.optimizer.built
    result = find_batch_size(model, (x, y), start=8, max_batch_size=64, steps=1, in_subprocess=True)
    assert result.in_subprocess
    assert any("subprocess" in n for n in result.notes)
    assert [t.batch_size for t in result.trials] == [8, 16, 32, 24]
    assert result.largest == 16
    assert model.optimizer.built == opt_built
    for a, w in zip(before, model.weights):
        np.testing.assert_array_equal(a, w.numpy())


def test_invalid_arguments_are_rejected_before_work():
    model = _model()
    x, y = _data()
    with pytest.raises(ValueError, match="not compiled"):
        find_batch_size(model, (x, y))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="start=0"):
        find_batch_size(model, (x, y), start=0)
    with pytest.raises(ValueError, match=r"memory_fraction=1\.5"):
        find_batch_size(model, (x, y), memory_fraction=1.5)
    with pytest.raises(TypeError, match="data"):
        find_batch_size(model, "not data")


def test_start_above_max_batch_size_is_rejected_before_any_trial():
    model = _model()
    model.compile("sgd", "mse")
    x, y = _data()
    read = []

    def examples():
        read.append(True)
        yield from zip(x, y)

    spec = (tf.TensorSpec(x.shape[1:], tf.float32), tf.TensorSpec(y.shape[1:], tf.float32))
    data = tf.data.Dataset.from_generator(examples, output_signature=spec)
    with pytest.raises(ValueError, match=r"start=64 with max_batch_size=8\. Expected start <="):
        find_batch_size(model, data, start=64, max_batch_size=8)
    assert read == [] and not model.optimizer.built  # no data read, no step trained
    # Equal bounds are a valid single-size search.
    result = find_batch_size(model, (x, y), start=8, max_batch_size=8, steps=1)
    assert [t.batch_size for t in result.trials] == [8]
