"""tfgpu.tune on code shaped like the public Keras examples: what it keeps is safe to train with.

After `tune`, the user's model and data train as before apart from the kept settings, as the
docs apply them (`result.apply(model)`, `fit(result.dataset, validation_data=
result.validation_data)`), for a full epoch: a user's `from_tensor_slices().shuffle()
.batch(32)` with a partial batch under a one-replica and a two-replica `MirroredStrategy`,
arrays with `validation_split`, and a Keras folder loader. The search's timings are scripted
(tests/conftest.py `ScriptedTiming`): which settings win is set by the test, so no assertion
depends on this machine's speed; the fits after `tune` are real.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
import tfgpu.batch_size
from tests.conftest import ScriptedTiming, tune_on_a_plain_cpu
from tfgpu._internal.measure import rules
from tfgpu.tuning import _candidates as cands

X = np.random.default_rng(0).random((1000, 16)).astype("float32")  # 31 batches of 32, and 8
Y = np.random.default_rng(1).integers(0, 4, 1000)


@pytest.fixture(autouse=True)
def _facts(monkeypatch):
    """No GPU, one core (no thread-pool candidates), no XLA candidate, a batch-size search
    that finds nothing faster."""
    tune_on_a_plain_cpu(monkeypatch, 32)


def _mirrored(devices=("/cpu:0",)) -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(devices=list(devices))


def _model(strategy=None, inputs=16) -> keras.Model:
    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential(
            [
                keras.Input((inputs,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(4),
            ]
        )
        model.compile(
            keras.optimizers.Adam(),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def _static(dataset) -> bool:
    return all(leaf.shape[0] is not None for leaf in tf.nest.flatten(dataset.element_spec))


def _script(monkeypatch, faster_when):
    """The scripted engine: 0.1 s a step (not host-bound: no first look at the ladder), half
    that when `faster_when(model, dataset)`."""
    return ScriptedTiming(
        monkeypatch, lambda model, dataset: 0.05 if faster_when(model, dataset) else 0.1
    )


def _epoch_of(model, dataset, **kwargs) -> keras.callbacks.History:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras: "shuffle=True ... ignored" for a dataset
        return model.fit(dataset, epochs=2, verbose=0, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [("/cpu:0",), ("/cpu:0", "/cpu:1")], ids=["1", "2"])
def test_a_kept_static_batch_shape_trains_the_users_own_dataset_under_its_strategy(
    monkeypatch, devices
):
    # The Keras multi-GPU guide's shape: arrays through from_tensor_slices().shuffle().batch(32),
    # a partial last batch (8 of 1,000: under the 5% that tune drops at most).
    strategy = _mirrored(devices)
    model = _model(strategy)
    user = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(1000).batch(32)
    _script(monkeypatch, lambda model, dataset: _static(dataset))
    result = tfgpu.tune(model, user, time_budget_s=600, verbose=0)
    assert result.settings.get("drop_remainder") is True, str(result)
    assert "drops the last 8 of the 1,000 examples" in result.trial("static batch shape").reason
    # As the docs apply it: the compile settings on the model, the data from result.dataset.
    tuned = result.apply(model)
    assert _static(result.dataset)
    sizes = [int(tf.shape(x)[0]) for x, _ in result.dataset]
    assert sizes == [32] * 31  # the partial batch left out, every epoch
    history = _epoch_of(tuned, result.dataset)  # tf.distribute distributes it again: no crash
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


@pytest.mark.slow
def test_arrays_are_tuned_at_the_users_batch_and_keep_its_validation_split(monkeypatch):
    # The Keras examples' `fit(x, y, batch_size=128, validation_split=0.1)`.
    seen = []

    def faster(model, dataset):
        seen.append(int(model.steps_per_execution))
        return False

    _script(monkeypatch, faster)
    model = _model()
    result = tfgpu.tune(model, (X, Y), batch_size=128, validation_split=0.1, time_budget_s=600)
    # Timed as fit trains: the first 900 examples, 8 batches of 128 (the last of 4).
    spe = result.trial("steps_per_execution=16")
    assert spe.reason == "more than the 8 batches of an epoch", str(result)
    static = result.trial("static batch shape")
    assert static.line.startswith("model.fit(result.dataset, validation_data=result.validation")
    x_val, y_val = result.validation_data
    np.testing.assert_array_equal(x_val, X[900:])
    np.testing.assert_array_equal(y_val, Y[900:])
    history = _epoch_of(result.apply(model), result.dataset, validation_data=result.validation_data)
    assert "val_loss" in history.history
    # Reshuffled every epoch, as `fit(x, y)` reshuffles.
    first = [x.numpy()[0, 0] for x, _ in result.dataset]
    second = [x.numpy()[0, 0] for x, _ in result.dataset]
    assert sorted(first) != first or first != second
    assert first != second


def test_validation_split_is_refused_with_a_dataset_as_fit_refuses_it():
    user = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    with pytest.raises(ValueError, match=r"argument `validation_split`.*only for arrays"):
        tfgpu.tune(_model(), user, validation_split=0.1, verbose=0)
    with pytest.raises(ValueError, match=r"argument `validation_split`"):
        tfgpu.tune(_model(), (X, Y), validation_split=1.5, verbose=0)
    with pytest.raises(TypeError, match=r"argument `validation_split`"):
        tfgpu.tune(_model(), (X, Y), validation_split="0.1", verbose=0)


@pytest.mark.slow
def test_a_kept_static_shape_trains_a_keras_folder_loader(monkeypatch, tmp_path):
    for i in range(44):  # 2 batches of 16 and 12 (27%: no static shape), then 40 + 4 of 20
        folder = tmp_path / ("cat" if i % 2 else "dog")
        folder.mkdir(exist_ok=True)
        image = tf.fill((8, 8, 3), tf.constant(5 * i, tf.uint8))
        (folder / f"{i:02d}.jpg").write_bytes(tf.io.encode_jpeg(image).numpy())
    loader = keras.utils.image_dataset_from_directory(
        tmp_path, image_size=(8, 8), batch_size=20, verbose=False
    )
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _script(monkeypatch, lambda model, dataset: _static(dataset))
    result = tfgpu.tune(model, loader, time_budget_s=600, verbose=0)
    reason = result.trial("static batch shape").reason
    assert reason.startswith("it drops the last 4 of the 44 examples"), str(result)
    assert "drop_remainder" not in result.settings  # over 5%: the training would change
    history = _epoch_of(result.apply(model), result.dataset)
    assert len(history.history["loss"]) == 2


@pytest.mark.slow
def test_a_one_replica_mirrored_strategy_gets_tfgpu_strategy_in_its_place(monkeypatch):
    # The multi-GPU guide on a machine with one device: MirroredStrategy of one replica.
    strategy = _mirrored()
    model = _model(strategy)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32, drop_remainder=True)

    def default_strategy(model, dataset):
        return not isinstance(model.distribute_strategy, tf.distribute.MirroredStrategy)

    ScriptedTiming(monkeypatch, lambda m, d: 0.02 if default_strategy(m, d) else 0.1)
    result = tfgpu.tune(model, data, time_budget_s=600, verbose=0)  # a model: cloned
    trial = result.trial("tfgpu.strategy() (one replica)")
    assert trial.status == "kept", str(result)
    assert trial.reason == "the first round was clearly faster (x5.00)"
    assert result.settings["strategy"] == "auto"
    assert "strategy = tfgpu.strategy()  # in place of MirroredStrategy()" in result.lines[0]
    assert model.distribute_strategy is strategy  # the user's model as it was
    with pytest.warns(UserWarning, match=r"strategy = tfgpu.strategy\(\)"):
        result.apply(model)


def test_the_strategy_candidate_without_a_factory_for_a_model_keras_cannot_clone(monkeypatch):
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return self.dense(x)

    strategy = _mirrored()
    with strategy.scope():
        model = Subclassed()
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(100)
    ScriptedTiming(monkeypatch, lambda m, d: 0.1)
    result = tfgpu.tune(model, data, time_budget_s=600, verbose=0)
    trial = result.trial("tfgpu.strategy() (one replica)")
    assert trial.status == "untried" and trial.reason.startswith(cands.NEEDS_FACTORY)
    assert "Keras could not clone the model" in trial.reason


def test_a_borderline_rung_does_not_stop_the_ladder(monkeypatch):
    # Steps of 50 ms (not host-bound: no first look at the ladder); 4 steps a call: x1.06
    # with the rounds' noise (borderline); 16: x1.5.
    noise = iter([1.0, 0.97, 1.1, 1.0, 0.95, 1.12, 1.0, 0.96, 1.09, 1.0, 0.97, 1.1] * 9)

    def step(model, dataset):
        spe = int(model.steps_per_execution)
        if spe == 16:
            return 0.05 / 1.5
        return 0.05 / 1.06 * next(noise) if spe == 4 else 0.05

    ScriptedTiming(monkeypatch, step)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10)  # 100 batches
    result = tfgpu.tune(_model(), data, time_budget_s=None, verbose=0)
    assert result.trial("steps_per_execution=4").status == rules.BORDERLINE, str(result)
    assert result.trial("steps_per_execution=16").status == rules.KEPT, str(result)
    assert result.settings["steps_per_execution"] == 16


def test_a_verification_the_budget_cut_keeps_what_the_search_measured():
    def kept(name, change, gain):
        trial = tfgpu.tuning.Trial(name, change, rules.Gain(gain, gain - 0.2, gain + 0.1), "kept")
        return cands.Kept(trial, [(gain, 1.0)] * 3, against_baseline=name == "a")

    measured = [kept("a", {"steps_per_execution": 16}, 1.55), kept("b", {"prefetch": True}, 1.2)]
    notes: list[str] = []

    def cut(changes):  # one round before the budget ran out
        from tfgpu._internal.measure.timing import Comparison

        return Comparison(rounds=[(1.0, 0.9)], stopped="budget")

    gain, verified = cands.verify(measured, cut, notes)
    assert not verified and len(measured) == 2  # nothing dropped
    assert gain.value == pytest.approx(1.55 * 1.2) and gain.low == pytest.approx(1.35 * 1.0)
    assert "not verified together (the time budget ran out first)" in notes[0]
    assert all(k.trial.status == "kept" for k in measured)
    result = tfgpu.tuning.TuneResult(
        trials=[k.trial for k in measured],
        baseline_examples_per_s=100.0,
        tuned_examples_per_s=186.0,
        speedup=gain,
        verified=False,
    )
    assert "not verified together (see the note)" in str(result)


def test_a_trace_longer_than_the_budget_says_what_budget_would_do(monkeypatch):
    engine = ScriptedTiming(monkeypatch, lambda m, d: 1.0, trace_s=50.0)
    result = tfgpu.tune(_model(), (X, Y), time_budget_s=15, verbose=0)
    assert engine.clock - 1000.0 <= 15 * 1.1
    assert all(t.status == "untried" for t in result.trials)
    assert "the baseline could not be timed within the time budget" in result.notes[0]
    assert "give tune at least about" in result.notes[0]
