"""tfgpu.precision: the policy choice by compute capability, and what Keras does with it."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tfgpu.precision import PolicyChoice, choose_policy, has_tensor_cores, supports_bfloat16


@pytest.mark.parametrize(
    "cc, tensor_cores, bf16",
    [
        ((6, 1), False, False),  # Pascal (P40, GTX 10xx)
        ((7, 0), True, False),  # Volta V100
        ((7, 5), True, False),  # Turing T4
        ((8, 0), True, True),  # Ampere A100
        ((8, 9), True, True),  # Ada L4
        ((9, 0), True, True),  # Hopper H100
        ((12, 0), True, True),  # Blackwell
    ],
)
def test_capabilities_by_generation(cc, tensor_cores, bf16):
    assert has_tensor_cores(cc) is tensor_cores
    assert supports_bfloat16(cc) is bf16


@pytest.mark.parametrize(
    "ccs, policy, reason_part",
    [
        ([], "float32", "no GPU"),
        ([(8, 0)], "mixed_bfloat16", "no loss scaling"),
        ([(9, 0), (8, 6), (12, 0)], "mixed_bfloat16", "9.0, 8.6, 12.0"),
        ([(7, 0)], "mixed_float16", "loss scaling"),
        ([(8, 0), (7, 5)], "mixed_float16", "not all have bfloat16"),
        ([(6, 1)], "float32", "tensor cores"),
        ([(8, 0), (6, 0)], "float32", "found 8.0, 6.0"),
    ],
)
def test_choose_policy_every_branch(ccs, policy, reason_part):
    choice = choose_policy(ccs)
    assert isinstance(choice, PolicyChoice)
    assert choice.policy == policy
    assert reason_part in choice.reason
    assert str(choice).startswith(policy)


def test_choose_policy_accepts_tuples_and_lists_of_pairs():
    assert choose_policy(((8, 0), [8, 6])).policy == "mixed_bfloat16"


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        ("8.0", TypeError, r"Received: cc='8.0'"),
        ((8,), TypeError, r"tuple of two ints"),
        ((8.0, 0), TypeError, r"Received: cc=\(8.0, 0\)"),
        ((True, 0), TypeError, r"tuple of two ints"),
        ((-1, 0), ValueError, r"non-negative"),
    ],
)
def test_bad_compute_capability(bad, exc, match):
    with pytest.raises(exc, match=match):
        has_tensor_cores(bad)


def test_choose_policy_rejects_non_sequences():
    with pytest.raises(TypeError, match=r"argument `compute_capabilities`.*Received"):
        choose_policy("8.0")
    with pytest.raises(TypeError, match=r"argument `compute_capabilities`"):
        choose_policy([(8, 0), "x"])
    with pytest.raises(TypeError, match=r"argument `compute_capabilities`"):
        choose_policy(None)


def _tiny_model():
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def test_keras_wraps_the_optimizer_for_loss_scaling_under_mixed_float16():
    # The docstring's claim: fp16 needs loss scaling and Keras 3 applies it at compile.
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = _tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.layers[1].compute_dtype == "float16"
    assert model.layers[1].kernel.dtype == "float32"  # variables stay float32
    history = model.fit(np.ones((8, 8), "float32"), np.ones((8, 1), "float32"), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_keras_does_not_scale_the_loss_under_mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = _tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.layers[1].compute_dtype == "bfloat16"
