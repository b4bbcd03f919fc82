"""FLOPs per step against hand counts, the peak table, and MFU."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from tfgpu.flops import _forward_flops, mfu, peak_flops, train_step_flops


def test_dense_model_matches_hand_count():
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    per_example = 2 * 32 * 64 + 2 * 64 * 10  # multiply-adds count 2; bias/relu not counted
    assert train_step_flops(model, batch_size=8) == 3 * 8 * per_example


def test_conv_model_matches_hand_count():
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),  # 16x16 output
            keras.layers.Conv2D(4, 3, strides=2, padding="valid"),  # 7x7 output
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    conv1 = 2 * (16 * 16 * 8) * (3 * 3 * 3)
    conv2 = 2 * (7 * 7 * 4) * (3 * 3 * 8)
    dense = 2 * (7 * 7 * 4) * 10
    assert train_step_flops(model, batch_size=2) == 3 * 2 * (conv1 + conv2 + dense)


def test_attention_counts_einsum_projections_and_scores():
    t, d, heads, key_dim = 8, 16, 2, 8
    inp = keras.Input((t, d))
    out = keras.layers.MultiHeadAttention(heads, key_dim)(inp, inp)
    model = keras.Model(inp, out)
    projections = 3 * 2 * t * d * heads * key_dim + 2 * t * heads * key_dim * d
    scores = 2 * heads * t * t * key_dim * 2  # QK^T and attention @ V
    assert _forward_flops(model, 1)["total"] == projections + scores


def test_depthwise_and_transposed_convs_are_counted():
    model = keras.Sequential(
        [
            keras.Input((8, 8, 4)),
            keras.layers.DepthwiseConv2D(3, padding="same"),
            keras.layers.Conv2DTranspose(2, 2, strides=2),
        ]
    )
    depthwise = 2 * (8 * 8 * 4) * 9
    transposed = 2 * (8 * 8) * (2 * 2 * 2 * 4)
    assert _forward_flops(model, 1)["total"] == depthwise + transposed


def test_subclassed_model_needs_an_input_signature():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(5)

        def call(self, x):
            return self.d(x)

    net = Net()
    net(tf.zeros((1, 7)))
    with pytest.raises(ValueError, match="input_signature"):
        train_step_flops(net, 4)
    spec = tf.TensorSpec((None, 7))
    assert train_step_flops(net, 4, input_signature=spec) == 3 * 4 * 2 * 7 * 5


def test_bad_batch_size_is_rejected():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="batch_size=0"):
        train_step_flops(model, 0)


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5),
        ("NVIDIA H100 PCIe", "mixed_float16", 756.0),
        ("NVIDIA H100 NVL", "tf32", 417.5),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "float32", 19.5),
        ("NVIDIA L40S", "float16", 362.05),
        ("NVIDIA L40", "float16", 181.0),
        ("NVIDIA L4", "float16", 121.0),
        ("NVIDIA A10", "float16", 125.0),
        ("Tesla T4", "mixed_float16", 65.0),
        ("Tesla V100-SXM2-16GB", "float16", 125.0),
        ("Tesla V100-PCIE-32GB", "float16", 112.0),
        ("NVIDIA GeForce RTX 4090", "bfloat16", 165.2),
        ("NVIDIA GeForce RTX 3090", "float32", 35.6),
    ],
)
def test_peak_table_matches_nvml_names(name, precision, tflops):
    assert peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_peak_is_none_for_unknown_gpu_or_missing_precision():
    assert peak_flops("Some Future GPU", "float16") is None
    assert peak_flops("Tesla T4", "bfloat16") is None  # Turing has no bfloat16
    assert peak_flops("Tesla V100-SXM2-16GB", "tf32") is None
    assert peak_flops("NVIDIA A10G", "float16") is None  # not A10: different clocks


def test_peak_rejects_bad_arguments():
    with pytest.raises(ValueError, match="precision='int8'"):
        peak_flops("NVIDIA L4", "int8")
    with pytest.raises(TypeError, match="gpu_name"):
        peak_flops(None, "float16")


def test_mfu():
    assert mfu(3e12, 0.01, 1e15) == pytest.approx(0.3)
    assert mfu(3e12, 0.01, None) is None
    assert mfu(3e12, 0.0, 1e15) is None
    assert mfu(float("nan"), 0.01, 1e15) is None and mfu(3e12, float("nan"), 1e15) is None
    assert mfu(3e12, 0.01, 0.0) is None


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("3e12", 0.01, 1e15), TypeError, r"`flops_per_step`. Received: flops_per_step='3e12'"),
        ((3e12, None, 1e15), TypeError, r"`step_time_s`. Received: step_time_s=None"),
        ((3e12, 0.01, "A100"), TypeError, r"`peak`. Received: peak='A100'.*or None"),
        ((True, 0.01, 1e15), TypeError, r"`flops_per_step`"),
        ((-1.0, 0.01, 1e15), ValueError, r"Received: flops_per_step=-1\.0\. Expected a finite"),
        ((3e12, float("inf"), 1e15), ValueError, r"`step_time_s`"),
        ((3e12, 0.01, -5.0), ValueError, r"`peak`"),
    ],
)
def test_mfu_rejects_bad_arguments_as_its_docstring_says(args, error, match):
    with pytest.raises(error, match=match):
        mfu(*args)
    assert "Raises:" in mfu.__doc__
