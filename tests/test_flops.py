"""FLOPs per step against hand counts, the peak table, and MFU."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.flops import _counted, _input_specs, _train_counts, mfu, peak_flops, train_step_flops


# FLOPs per op type, plus "total", of the forward pass and of a training step: what
# `train_step_flops` adds up, checked op by op here.
def _forward_flops(model, batch_size: int = 1, *, input_signature=None) -> dict:
    """Forward FLOPs per op type (inference mode), plus `"total"`."""
    specs = _input_specs(model, batch_size, input_signature)
    return _counted(lambda x: model(x, training=False), specs, stacklevel=3)


def _train_flops(model, batch_size: int = 1, *, input_signature=None) -> dict:
    """A training step's FLOPs per op type (forward and backward), plus `"total"`: the float
    outputs summed as the loss (a loss has no matmuls), the gradient taken as `fit` does."""
    return _train_counts(model, _input_specs(model, batch_size, input_signature))


def test_dense_model_matches_hand_count():
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    first, second = 2 * 32 * 64, 2 * 64 * 10  # multiply-adds count 2; bias/relu not counted
    # Forward + weight gradient for both layers, input gradient for the second only: the first
    # trainable layer has nothing below it that needs a gradient.
    assert _forward_flops(model, 8)["total"] == 8 * (first + second)
    assert train_step_flops(model, batch_size=8) == 8 * (2 * first + 3 * second)


def test_docstring_example_is_true():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])
    assert train_step_flops(model, batch_size=4) == 2 * 2 * 4 * 32 * 10 == 5120.0
    assert "5120.0" in train_step_flops.__doc__


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
    counts = _train_flops(model, 2)
    # Conv2D's gradient function builds the first layer's input gradient too; TensorFlow
    # prunes it (nothing uses it), so it is not counted.
    assert counts["Conv2DBackpropFilter"] == 2 * (conv1 + conv2)
    assert counts["Conv2DBackpropInput"] == 2 * conv2
    assert train_step_flops(model, batch_size=2) == 2 * (2 * conv1 + 3 * conv2 + 3 * dense)


def test_attention_counts_einsum_projections_and_scores():
    t, d, heads, key_dim = 8, 16, 2, 8
    inp = keras.Input((t, d))
    out = keras.layers.MultiHeadAttention(heads, key_dim)(inp, inp)
    model = keras.Model(inp, out)
    projections = 3 * 2 * t * d * heads * key_dim + 2 * t * heads * key_dim * d
    scores = 2 * heads * t * t * key_dim * 2  # QK^T and attention @ V
    assert _forward_flops(model, 1)["total"] == projections + scores
    qkv = 3 * 2 * t * d * heads * key_dim  # their input gradients (w.r.t. data) are not needed
    assert train_step_flops(model, 1) == 3 * (projections + scores) - qkv


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
    counts = _train_flops(model, 1)
    assert counts["DepthwiseConv2dNativeBackpropFilter"] == depthwise
    assert "DepthwiseConv2dNativeBackpropInput" not in counts  # first layer
    assert counts["Conv2DBackpropFilter"] == transposed  # the transposed conv's kernel
    assert counts["Conv2D"] == transposed  # its input gradient is a convolution
    assert counts["total"] == 2 * depthwise + 3 * transposed


def test_separable_and_3d_convs_fully_trainable():
    model = keras.Sequential(
        [
            keras.Input((4, 4, 4, 2)),
            keras.layers.Conv3D(3, 2),  # 3x3x3 output
            keras.layers.Conv3D(2, 2),  # 2x2x2 output
        ]
    )
    first, second = 2 * 27 * 3 * (8 * 2), 2 * 8 * 2 * (8 * 3)
    counts = _train_flops(model, 1)
    assert counts["Conv3DBackpropFilterV2"] == first + second
    assert counts["Conv3DBackpropInputV2"] == second
    assert counts["total"] == 2 * first + 3 * second

    model = keras.Sequential(
        [keras.Input((6, 6, 2)), keras.layers.Dense(4), keras.layers.SeparableConv2D(3, 3)]
    )
    dense = 2 * 36 * 2 * 4
    depthwise, pointwise = 2 * (4 * 4 * 4) * 9, 2 * (4 * 4 * 3) * 4
    assert train_step_flops(model, 1) == 2 * dense + 3 * (depthwise + pointwise)


def _frozen_backbone_model(trainable: bool):
    backbone = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(8, 3, strides=2, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
        ],
        name="backbone",
    )
    backbone.trainable = trainable
    inp = keras.Input((16, 16, 3))
    x = backbone(inp, training=False)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    out = keras.layers.Dense(5)(x)
    return keras.Model(inp, out)


@pytest.mark.slow
def test_frozen_backbone_costs_its_forward_pass_only():
    conv1, conv2 = 2 * (16 * 16 * 8) * (3 * 3 * 3), 2 * (8 * 8 * 8) * (3 * 3 * 8)
    head1, head2 = 2 * 8 * 16, 2 * 16 * 5
    batch = 4
    frozen = _frozen_backbone_model(trainable=False)
    forward = _forward_flops(frozen, batch)["total"]
    assert forward == batch * (conv1 + conv2 + head1 + head2)
    # Backbone: forward only. Head: weight gradients, and the input gradient of the second
    # Dense (the first trainable layer needs none).
    assert train_step_flops(frozen, batch) == batch * (conv1 + conv2 + 2 * head1 + 3 * head2)
    assert train_step_flops(frozen, batch) < 3 * forward / 2

    unfrozen = _frozen_backbone_model(trainable=True)
    assert train_step_flops(unfrozen, batch) == 3 * forward - batch * conv1


def test_frozen_middle_layer_still_passes_the_gradient_down():
    first, middle, last = keras.layers.Dense(16), keras.layers.Dense(16), keras.layers.Dense(4)
    model = keras.Sequential([keras.Input((8,)), first, middle, last])
    middle.trainable = False
    f1, f2, f3 = 2 * 8 * 16, 2 * 16 * 16, 2 * 16 * 4
    # The frozen layer: forward + input gradient (the first layer below it trains), no
    # weight gradient.
    assert train_step_flops(model, 1) == 2 * f1 + 2 * f2 + 3 * f3


def test_model_with_nothing_trainable_costs_the_forward_pass():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    model.trainable = False
    assert train_step_flops(model, 3) == _forward_flops(model, 3)["total"] == 3 * 2 * (256 + 16)


@pytest.mark.slow
def test_keras_applications_backbone_frozen_and_unfrozen():
    backbone = keras.applications.MobileNetV2(
        weights=None, include_top=False, input_shape=(32, 32, 3), alpha=0.35
    )
    inp = keras.Input((32, 32, 3))
    x = keras.layers.GlobalAveragePooling2D()(backbone(inp, training=False))
    model = keras.Model(inp, keras.layers.Dense(10)(x))
    batch = 2
    forward = _forward_flops(model, batch)["total"]
    head = batch * 2 * 1280 * 10
    first_conv = batch * 2 * (16 * 16 * 16) * (3 * 3 * 3)  # stride 2, 16 filters at alpha 0.35
    backbone.trainable = False
    assert train_step_flops(model, batch) == forward + head
    backbone.trainable = True
    assert train_step_flops(model, batch) == 3 * forward - first_conv


def test_integer_inputs_embedding():
    embedding = keras.layers.Embedding(100, 8)
    model = keras.Sequential(
        [
            keras.Input((10,), dtype="int32"),
            embedding,
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    dense = 2 * 4 * 80 * 3
    # The embedding trains (a gather, no matmul), so the Dense needs its input gradient.
    assert train_step_flops(model, 4) == 3 * dense
    embedding.trainable = False
    assert train_step_flops(model, 4) == 2 * dense
    spec = tf.TensorSpec((None, 10), tf.int64)
    assert train_step_flops(model, 4, input_signature=spec) == 2 * dense


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
    assert train_step_flops(net, 4, input_signature=spec) == 2 * 4 * 2 * 7 * 5
    # A real batch works as the signature too (its batch size is ignored).
    assert train_step_flops(net, 4, input_signature=np.zeros((9, 7), "float32")) == 560.0


def test_subclassed_model_with_nested_inputs():
    class Two(keras.Model):
        def __init__(self):
            super().__init__()
            self.a, self.b = keras.layers.Dense(3), keras.layers.Dense(3)

        def call(self, x):
            return self.a(x["u"]) + self.b(x["v"])

    signature = {"u": tf.TensorSpec((None, 4)), "v": tf.TensorSpec((None, 5))}
    assert train_step_flops(Two(), 2, input_signature=signature) == 2 * 2 * 2 * (4 * 3 + 5 * 3)


def test_unknown_sizes_ask_for_the_sizes_of_a_real_batch():
    model = keras.Sequential([keras.Input((None, 8)), keras.layers.Dense(3)])
    message = (
        r"input shapes with unknown sizes \(None dims\): pass `input_signature` with the "
        r"sizes of a real batch\. Received: inputs \(4, None, 8\) float32"
    )
    with pytest.raises(ValueError, match=message) as info:
        train_step_flops(model, 4)
    assert type(info.value) is ValueError
    with pytest.raises(ValueError, match="unknown sizes"):
        train_step_flops(model, 4, input_signature=tf.TensorSpec((None, None, 8)))
    spec = tf.TensorSpec((None, 6, 8))
    assert train_step_flops(model, 4, input_signature=spec) == 2 * (2 * 4 * 6 * 8 * 3)


def test_untraceable_gradient_falls_back_to_three_forward_passes():
    @tf.custom_gradient
    def opaque(x):
        def grad(dy):
            raise NotImplementedError("this layer has no gradient")

        return tf.identity(x), grad

    class Opaque(keras.layers.Layer):
        def call(self, x):
            return opaque(x)

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), Opaque()])
    with pytest.warns(UserWarning, match=r"this layer has no gradient.*3x the forward pass"):
        assert train_step_flops(model, 2) == 3 * 2 * 2 * 8 * 4


@pytest.mark.parametrize(
    ("batch_size", "error", "match"),
    [
        (0, ValueError, r"Received: batch_size=0\. Expected a positive int"),
        (-3, ValueError, r"batch_size=-3"),
        (True, TypeError, r"batch_size=True \(of type bool\)"),
        (2.0, TypeError, r"batch_size=2\.0 \(of type float\)"),
        ("8", TypeError, r"batch_size='8'"),
        (None, TypeError, r"batch_size=None"),
    ],
)
def test_bad_batch_size_is_rejected(batch_size, error, match):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(error, match=match):
        train_step_flops(model, batch_size)


def test_numpy_batch_size_is_an_int():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert train_step_flops(model, np.int64(2)) == 2 * 2 * 2 * 3


@pytest.mark.parametrize(
    ("signature", "error", "match"),
    [
        ((6, 8), TypeError, r"`input_signature`. Received: input_signature=\(6, 8\)"),
        ("x", TypeError, r"input_signature='x' \(of type str\). Expected a tf.TensorSpec"),
        ([tf.TensorSpec((None, 3)), 3], TypeError, r"`input_signature`"),
        (tf.TensorSpec(()), ValueError, r"Expected specs with a batch dimension first"),
        (tf.TensorSpec(None), ValueError, r"unknown sizes \(None dims\)"),
    ],
)
def test_bad_input_signature_is_rejected(signature, error, match):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(error, match=match):
        train_step_flops(model, 2, input_signature=signature)


def test_non_model_is_rejected():
    with pytest.raises(TypeError, match=r"model='my_model' \(of type str\). Expected a keras"):
        train_step_flops("my_model", 2)


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
