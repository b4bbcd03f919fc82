"""tfgpu._internal.adapters.keras_internals: every reach into Keras's internals still finds its target.

`test_every_reach_finds_its_target_in_a_real_fit` is the alarm: it fails, naming the Keras
version and what moved, the day Keras keeps `fit`'s epoch iterator, its data adapter,
`model.train_function`, `model._initial_epoch`, its global seed generator, or the trainer
functions the multi-worker `fit` correction wraps, elsewhere.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

from tfgpu._internal.adapters import keras_internals


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


class _Probe(keras.callbacks.Callback):
    """Runs the check from inside `fit`'s hooks; keeps what each hook saw."""

    def __init__(self):
        super().__init__()
        self.problems: dict[str, list[str]] = {}
        self.batch_size: int | None = None
        self.source = None
        self.frame_name: str | None = None

    def on_train_begin(self, logs=None):
        self.problems["on_train_begin"] = keras_internals.problems_in_fit(self.model)
        self.batch_size = keras_internals.fit_batch_size(self.model)
        iterator = keras_internals.fit_epoch_iterator(self.model)
        self.source = keras_internals.source_dataset(iterator)
        frame = keras_internals.training_frame(__name__)
        self.frame_name = None if frame is None else frame.f_code.co_name

    def on_train_batch_end(self, batch, logs=None):
        self.problems.setdefault("on_train_batch_end", keras_internals.problems_in_fit(self.model))


def _data(kind: str) -> dict:
    x = np.zeros((32, 4), "float32")
    y = np.zeros((32, 1), "float32")
    if kind == "arrays":
        return {"x": x, "y": y, "batch_size": 8}
    import tensorflow as tf

    # A static batch size (drop_remainder) is what the data adapter can report.
    return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)}


@pytest.mark.parametrize("kind", ["arrays", "dataset"])
def test_every_reach_finds_its_target_in_a_real_fit(kind):
    probe = _Probe()
    data = _data(kind)
    _model().fit(**data, epochs=1, verbose=0, shuffle=False, callbacks=[probe])
    found = [f"{hook}: {p}" for hook, ps in probe.problems.items() for p in ps]
    if probe.batch_size != 8:
        found.append(keras_internals.moved("the data adapter's `batch_size`"))
    if kind == "dataset" and probe.source is not data["x"]:
        found.append(keras_internals.moved("the data adapter's `_dataset` (the user's dataset)"))
    if found or len(probe.problems) != 2:
        pytest.fail(
            f"Keras {keras.__version__} moved what tfgpu reaches for (checked against Keras "
            f"{'.'.join(map(str, keras_internals.CHECKED_KERAS))}); update "
            "tfgpu/_internal/adapters/keras_internals.py and CHECKED_KERAS. What moved:\n  "
            + "\n  ".join(found or ["the callback hooks did not run"])
        )
    assert probe.frame_name == "fit"
    checked = keras_internals.CHECKED_KERAS
    installed = tuple(int(p) for p in keras.__version__.split(".")[:2])
    if installed > checked:
        warnings.warn(
            f"Keras {keras.__version__} is newer than the one tfgpu/_internal/adapters/keras_internals.py was "
            f"checked against ({checked[0]}.{checked[1]}); every reach still works: raise "
            "CHECKED_KERAS.",
            stacklevel=1,
        )


# A training function of the user's own module, driving a "hook" of this test module.
_TRAIN = """
def train(name, hook, calls, check, fail=False):
    watch = hook(name)
    check()  # still running: nothing called
    assert calls == [] or name not in calls
    if fail:
        raise RuntimeError("boom")
    return watch
"""


def test_when_fit_ends_calls_back_once_the_driving_function_left_the_stack(caplog):
    calls: list[str] = []
    namespace: dict = {"__name__": "users_training_loop"}
    exec(compile(_TRAIN, "users_training_loop.py", "exec"), namespace)

    def hook(name, callback=None):
        callback = callback or (lambda: calls.append(name))
        return keras_internals.when_fit_ends(callback, __name__)

    def train(name, **kw):
        return namespace["train"](name, hook, calls, keras_internals.check_fit_watches, **kw)

    assert train("returned") is not None
    try:
        train("raised", fail=True)
    except RuntimeError as e:
        kept = e  # the traceback (and the frame) kept alive, as in a notebook
    keras_internals.check_fit_watches()
    assert sorted(calls) == ["raised", "returned"]
    keras_internals.check_fit_watches()
    assert len(calls) == 2  # once each
    train("cancelled").cancel()
    keras_internals.check_fit_watches()
    assert len(calls) == 2 and kept.__traceback__ is not None

    namespace["train"]("broken", lambda name: hook(name, lambda: 1 / 0), [], lambda: None)
    keras_internals.check_fit_watches()  # a failed callback is logged, never raised
    assert "end of fit failed" in caplog.text


def test_outside_fit_nothing_is_found():
    model = _model()
    assert keras_internals.fit_epoch_iterator(model) is None
    assert keras_internals.fit_batch_size(model) is None
    assert keras_internals.problems_in_fit(model) == [
        keras_internals.moved("`fit`'s frame with a local `epoch_iterator`")
    ]
    assert "Keras " in keras_internals.moved(
        "x"
    ) and "tfgpu/_internal/adapters/keras_internals.py" in (keras_internals.moved("x"))


def test_a_wrapped_train_function_is_found_under_and_taken_off():
    model = _model()
    model.make_train_function()
    keras_fn = model.train_function
    owner, other = object(), object()

    def outer(iterator):
        return keras_fn(iterator)

    keras_internals.install_train_function(model, outer, owner=owner, original=keras_fn)
    assert model.train_function is outer
    assert keras_internals.wrapper_owner(outer) is owner
    assert keras_internals.keras_train_function(outer) is keras_fn
    keras_internals.restore_train_function(model, other, keras_fn)  # not other's: stays
    assert model.train_function is outer
    keras_internals.restore_train_function(model, owner, keras_fn)
    assert model.train_function is keras_fn
    assert keras_internals.wrapper_owner(keras_fn) is None


def test_initial_epoch_is_cleared_only_when_it_is_tfgpu_s():
    model = _model()
    keras_internals.set_initial_epoch(model, 3)
    assert model._initial_epoch == 3
    keras_internals.clear_initial_epoch(model)
    assert model._initial_epoch is None
    model._initial_epoch = 5  # set by someone else: left alone
    keras_internals.clear_initial_epoch(model)
    assert model._initial_epoch == 5


def test_a_fit_that_restarts_from_the_initial_epoch_skips_the_done_epochs():
    model = _model()
    seen: list[int] = []

    class _Start(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            keras_internals.set_initial_epoch(self.model, 2)

        def on_epoch_begin(self, epoch, logs=None):
            seen.append(epoch)
            keras_internals.clear_initial_epoch(self.model)

    model.fit(**_data("arrays"), epochs=3, verbose=0, callbacks=[_Start()])
    assert seen == [2]
    assert model._initial_epoch is None


def test_the_trainer_check_names_what_the_multi_worker_correction_lost(monkeypatch):
    from keras.src.backend.tensorflow import trainer

    assert keras_internals.problems_in_trainer() == []

    def build_without_iterator(self, data_batch=None):  # a Keras that changed the signature
        return None

    monkeypatch.delattr(trainer, "reduce_per_replica")
    monkeypatch.setattr(trainer.TensorFlowTrainer, "_maybe_symbolic_build", build_without_iterator)
    assert keras_internals.problems_in_trainer() == [
        keras_internals.moved("`trainer.reduce_per_replica(values, strategy, reduction)`"),
        keras_internals.moved("`TensorFlowTrainer._maybe_symbolic_build(iterator, data_batch)`"),
    ]


def test_the_multi_worker_correction_is_not_installed_where_keras_lacks_the_functions(
    monkeypatch, caplog
):
    from keras.src.backend.tensorflow import trainer

    monkeypatch.setattr(keras_internals, "_correction_installed", False)
    monkeypatch.delattr(trainer, "reduce_per_replica")
    build = trainer.TensorFlowTrainer._maybe_symbolic_build
    with caplog.at_level("WARNING", logger="tfgpu"):
        assert keras_internals.install_multi_worker_correction() is False
    assert "multi-worker fit correction is not applied" in caplog.text
    assert trainer.TensorFlowTrainer._maybe_symbolic_build is build  # nothing changed


def test_the_multi_worker_correction_wraps_keras_and_defers_to_it_off_multi_worker(monkeypatch):
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    monkeypatch.setattr(keras_internals, "_correction_installed", False)
    monkeypatch.setattr(trainer, "reduce_per_replica", trainer.reduce_per_replica)
    monkeypatch.setattr(
        trainer.TensorFlowTrainer,
        "_maybe_symbolic_build",
        trainer.TensorFlowTrainer._maybe_symbolic_build,
    )
    original = trainer.reduce_per_replica
    assert keras_internals.install_multi_worker_correction() is True
    assert keras_internals.install_multi_worker_correction() is True  # idempotent
    assert trainer.reduce_per_replica.__wrapped__ is original
    assert keras_internals.problems_in_trainer() == []  # the check sees through the wrapper
    value = tf.constant([1.0, 3.0])
    reduced = trainer.reduce_per_replica(value, tf.distribute.get_strategy(), "auto")
    assert reduced.numpy().tolist() == [1.0, 3.0]  # Keras's own answer off multi-worker
