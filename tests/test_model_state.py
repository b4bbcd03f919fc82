"""`tfgpu._internal.adapters.model_state.preserved`: the model comes back exactly as it went in."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tfgpu._internal.adapters.model_state import preserved

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8)).astype("float32")
Y = RNG.normal(size=(64, 1)).astype("float32")


def _model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-2), "mse", metrics=["mae"], steps_per_execution=1)
    return model


def _state(model):
    variables = [*model.variables, *model.optimizer.variables, *model.metrics_variables]
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assert_same(before, after):
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_fit_inside_leaves_weights_optimizer_metrics_and_history_as_they_were():
    model = _model()
    history = model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
    before = _state(model)
    with preserved(model, X[:1]):
        model.steps_per_execution = 4
        model.jit_compile = False
        model.fit(X, Y, epochs=2, batch_size=16, verbose=0)
        assert any(np.any(a != b) for a, b in zip(before, _state(model)))  # it did train
    _assert_same(before, _state(model))
    assert model.history is history
    assert model.steps_per_execution == 1


@pytest.mark.slow
def test_the_state_is_put_back_when_the_body_raises():
    model = _model()
    model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
    before = _state(model)
    with pytest.raises(RuntimeError, match="in the body"), preserved(model):
        model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
        raise RuntimeError("in the body")
    _assert_same(before, _state(model))


@pytest.mark.slow
def test_a_fresh_model_is_built_first_so_the_optimizer_slots_are_put_back_too():
    model = _model()
    assert not model.optimizer.built
    with preserved(model, X[:1]):
        slots = len(model.optimizer.variables)  # created by the build, before the snapshot
        model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
    assert len(model.optimizer.variables) == slots
    assert int(model.optimizer.iterations.numpy()) == 0
    # Training afterwards matches a model that never went through it.
    twin = _model()
    twin.build((None, 8))
    twin.set_weights(model.get_weights())
    model.fit(X, Y, epochs=1, batch_size=16, verbose=0, shuffle=False)
    twin.fit(X, Y, epochs=1, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
