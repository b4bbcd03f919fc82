"""FLOPs per training step, peak FLOP/s per GPU model, and model FLOPs utilization (MFU);
the counting rules and the peak table with its sources: docs/diagnosis.md, "FLOPs and MFU"."""

from __future__ import annotations

import math
import numbers
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfgpu._internal.helpers.checks import check_int, invalid_type, invalid_value
from tfgpu._internal.helpers.warn import one_line

__all__ = ["mfu", "peak_flops", "train_step_flops"]

_TERA = 1e12

# The ops counted: forward matmuls and convolutions, and the convolution gradients only a
# backward pass adds (matmul and einsum gradients are matmuls, einsums; a transposed
# convolution is a Conv*BackpropInput op).
_MATMUL_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum")
_CONV_OPS = ("Conv2D", "Conv3D", "DepthwiseConv2dNative")
_CONV_INPUT_GRADS = frozenset(
    {"Conv2DBackpropInput", "Conv2DBackpropInputV2", "Conv3DBackpropInput", "Conv3DBackpropInputV2"}
)
_CONV_FILTER_GRADS = frozenset(
    {"Conv2DBackpropFilter", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2"}
)
_DEPTHWISE_GRADS = ("DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")
_COUNTED_OPS = frozenset(
    (*_MATMUL_OPS, *_CONV_OPS, *_CONV_INPUT_GRADS, *_CONV_FILTER_GRADS, *_DEPTHWISE_GRADS)
)
_LOOP_OPS = ("While", "StatelessWhile")


@dataclass(frozen=True)
class _Peak:
    pattern: str  # regex matched against the lower-cased NVML name
    fp32: float  # TFLOP/s on CUDA cores
    tf32: float | None  # TFLOP/s, tensor cores, dense
    fp16: float | None  # TFLOP/s, tensor cores, FP32 accumulate, dense
    bf16: float | None


# Dense peak TFLOP/s. Order matters: the first matching pattern wins, so specific names
# (PCIe, NVL, S, Ti) come before the generic one.
_PEAKS: tuple[_Peak, ...] = (
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): SXM / NVL.
    _Peak(r"h200.*nvl", 60.0, 417.5, 835.5, 835.5),
    _Peak(r"h200", 67.0, 494.5, 989.5, 989.5),
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100).
    _Peak(r"h100.*nvl", 60.0, 417.5, 835.5, 835.5),
    _Peak(r"h100.*pcie", 51.0, 378.0, 756.0, 756.0),
    _Peak(r"h100", 67.0, 494.5, 989.5, 989.5),
    # NVIDIA A100 Tensor Core GPU datasheet; SXM4 and PCIe share the peak rates.
    _Peak(r"a100", 19.5, 156.0, 312.0, 312.0),
    _Peak(r"\ba30\b", 10.3, 82.0, 165.0, 165.0),
    _Peak(r"l40s", 91.6, 183.0, 362.05, 362.05),
    _Peak(r"\bl40\b", 90.5, 90.5, 181.0, 181.0),
    _Peak(r"\bl4\b", 30.3, 60.0, 121.0, 121.0),
    _Peak(r"\ba10\b", 31.2, 62.5, 125.0, 125.0),
    # NVIDIA T4 Tensor Core GPU datasheet (Turing: no TF32, no bfloat16).
    _Peak(r"\bt4\b", 8.1, None, 65.0, None),
    # NVIDIA V100 Tensor Core GPU datasheet (Volta: no TF32, no bfloat16).
    _Peak(r"v100s", 16.4, None, 130.0, None),
    _Peak(r"v100.*pcie", 14.0, None, 112.0, None),
    _Peak(r"v100", 15.7, None, 125.0, None),
    _Peak(r"rtx a6000", 38.7, 77.4, 154.8, 154.8),
    # NVIDIA Ada GPU architecture whitepaper (v2.1), appendix table for GeForce RTX 4090/4080;
    # GeForce cards run FP16/BF16 with FP32 accumulate at half the FP16-accumulate rate.
    _Peak(r"rtx 4090", 82.6, 82.6, 165.2, 165.2),
    _Peak(r"rtx 4080", 48.7, 48.7, 97.5, 97.5),
    # NVIDIA Ampere GA102 GPU architecture whitepaper (v2.0), GeForce RTX 3090 / 3080.
    _Peak(r"rtx 3090 ti", 40.0, 40.0, 80.0, 80.0),
    _Peak(r"rtx 3090", 35.6, 35.6, 71.0, 71.0),
    _Peak(r"rtx 3080", 29.8, 29.8, 59.5, 59.5),
)

# The precision names `peak_flops` accepts -> the `_Peak` field of their rate.
_PRECISIONS = {
    **dict.fromkeys(("float32", "fp32"), "fp32"),
    "tf32": "tf32",
    **dict.fromkeys(("float16", "fp16", "mixed_float16"), "fp16"),
    **dict.fromkeys(("bfloat16", "bf16", "mixed_bfloat16"), "bf16"),
}


def peak_flops(gpu_name: str, precision: str) -> float | None:
    """Returns the GPU's dense peak FLOP/s for a precision, from the datasheet table.

    For a float32 model on Ampere or newer pass `"tf32"` (TensorFlow's default). The table:
    docs/diagnosis.md, "Peak table".

    Args:
        gpu_name: str, the name as `nvidia-smi --query-gpu=name` gives it, e.g. `"Tesla T4"`.
        precision: str, `"float32"`/`"fp32"`, `"tf32"`, `"float16"`/`"fp16"`/`"mixed_float16"`
            or `"bfloat16"`/`"bf16"`/`"mixed_bfloat16"`.

    Returns:
        float, peak FLOP/s, or `None` for a GPU not in the table or without that precision.

    Raises:
        TypeError: if `gpu_name` is not a string.
        ValueError: if `precision` is not one of the names above.

    Example:

    >>> peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16")
    312000000000000.0
    """
    if not isinstance(gpu_name, str):
        raise invalid_type("gpu_name", gpu_name, "a str such as 'NVIDIA H100 80GB HBM3'")
    key = _PRECISIONS.get(str(precision).lower())
    if key is None:
        raise invalid_value(
            "precision", precision, f"one of: {', '.join(repr(p) for p in _PRECISIONS)}"
        )
    name = " ".join(gpu_name.lower().replace("-", " ").split())
    peak = next((p for p in _PEAKS if re.search(p.pattern, name)), None)
    tflops = None if peak is None else getattr(peak, key)
    return None if tflops is None else tflops * _TERA


def mfu(flops_per_step: float, step_time_s: float, peak: float | None) -> float | None:
    """Returns model FLOPs utilization: achieved FLOP/s divided by peak FLOP/s.

    Args:
        flops_per_step: float, FLOPs of one training step (`train_step_flops`); NaN: None.
        step_time_s: float, seconds per training step; zero or NaN: None.
        peak: float or None, the device's peak FLOP/s (`peak_flops`); None or zero: None.

    Returns:
        float in [0, 1] for a sane measurement, or `None` where a figure is unknown.

    Raises:
        TypeError: if an argument is not a real number (bools are not; `peak` may be None).
        ValueError: if an argument is negative or infinite.

    Example:

    >>> mfu(3e12, 0.01, 1e15)
    0.3
    """
    for name, value, optional in (
        ("flops_per_step", flops_per_step, False),
        ("step_time_s", step_time_s, False),
        ("peak", peak, True),
    ):
        if optional and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise invalid_type(
                name, value, "a real number" + (" or None" if optional else "") + ", e.g. 1.5e12"
            )
        if value < 0 or math.isinf(value):
            raise invalid_value(name, value, "a finite number >= 0")
    if not peak or math.isnan(peak):  # None or 0: not in the peak table
        return None
    if math.isnan(step_time_s) or math.isnan(flops_per_step) or step_time_s <= 0:
        return None
    return float(flops_per_step) / float(step_time_s) / float(peak)


def _shape(tensor) -> list[int]:
    """`tensor`'s static shape; ValueError when its rank or a size is unknown."""
    dims = tensor.shape.as_list()  # ValueError for an unknown rank
    if None in dims:
        raise ValueError(f"{tensor.name} has no static shape")
    return dims


def _einsum_flops(equation: str, shapes: Sequence[list[int]]) -> float:
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for spec, shape in zip(lhs.split(","), shapes):
        if "..." in spec:
            head, tail = spec.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            # Ellipsis dims broadcast right-aligned, so label them by distance from the right.
            spec = head + "".join(chr(0x100 + n_ell - 1 - j) for j in range(n_ell)) + tail
        for label, size in zip(spec, shape):
            sizes[label] = max(sizes.get(label, 1), size)
    return 2.0 * math.prod(sizes.values()) if len(shapes) > 1 else float(math.prod(shapes[0]))


def _op_flops(op) -> float | None:
    """FLOPs of one graph op, or None when a shape it needs is not static. Convolutions: 2 x
    (output, or incoming gradient, elements) x (kernel elements per output element), any layout."""
    t, x = op.type, op.inputs
    try:
        if t == "MatMul" or t.startswith("BatchMatMul"):
            a, out = _shape(x[0]), _shape(op.outputs[0])
            transposed = op.get_attr("transpose_a" if t == "MatMul" else "adj_x")
            return 2.0 * math.prod(out) * (a[-2] if transposed else a[-1])
        if t == "Einsum":
            return _einsum_flops(op.get_attr("equation").decode(), [_shape(i) for i in x])
        if t in ("Conv2D", "Conv3D"):
            # kernel: spatial..., in_channels, out_channels; output: batch, spatial..., out.
            return 2.0 * math.prod(_shape(op.outputs[0])) * math.prod(_shape(x[1])[:-1])
        if t == "DepthwiseConv2dNative":
            kernel = _shape(x[1])
            return 2.0 * math.prod(_shape(op.outputs[0])) * kernel[0] * kernel[1]
        if t in _CONV_INPUT_GRADS:  # per incoming-gradient element (a transposed conv too)
            return 2.0 * math.prod(_shape(x[2])) * math.prod(_shape(x[1])[:-1])
        if t in _CONV_FILTER_GRADS:  # the forward convolution's products; the kernel is the output
            return 2.0 * math.prod(_shape(x[2])) * math.prod(_shape(op.outputs[0])[:-1])
        if t in _DEPTHWISE_GRADS:
            kernel = _shape(x[1] if t.endswith("Input") else op.outputs[0])
            return 2.0 * math.prod(_shape(x[2])) * kernel[0] * kernel[1]
    except (ValueError, IndexError, TypeError):  # a shape not static, an input or attr missing
        return None
    return None


class _UnknownSizes(ValueError):
    """Raised when an op's shapes are not static: the caller must pass real sizes."""

    def __init__(self, received: str):
        super().__init__(
            "Cannot count FLOPs: input shapes with unknown sizes (None dims): pass "
            f"`input_signature` with the sizes of a real batch. Received: {received}"
        )


def _called_functions(op) -> list[str]:
    """Names of the functions an op runs (While body and cond, If branches, calls)."""
    names = []
    for value in op.node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def _function_graph(g, name: str):
    while g is not None:
        function = g._get_function(name)
        if function is not None:
            return getattr(function, "graph", None)
        g = getattr(g, "outer_graph", None)
    return None


def _count(graph) -> tuple[dict[str, float], list[str], bool]:
    """FLOPs per op type of the ops the graph's outputs and side effects need (TensorFlow prunes
    the rest, e.g. a frozen kernel's gradient); called functions count once per call site."""
    counts: dict[str, float] = {}
    unknown: list[str] = []
    loops = False

    def visit(g) -> None:
        nonlocal loops
        stack = [t.op for t in g.outputs] + list(getattr(g, "control_outputs", ()))
        seen: set[str] = set()
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.type in _LOOP_OPS:
                loops = True
            if op.type in _COUNTED_OPS:
                f = _op_flops(op)
                if f is None:
                    unknown.append(op.name)
                else:
                    counts[op.type] = counts.get(op.type, 0.0) + f
            for name in _called_functions(op):
                sub = _function_graph(g, name)
                if sub is not None and sub is not g:
                    visit(sub)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)

    visit(graph)
    return counts, unknown, loops


def _counted(fn, specs, stacklevel: int) -> dict[str, float]:
    """Traces `fn` on `specs` and counts its matmul/conv FLOPs per op type, plus "total"."""
    import tensorflow as tf

    graph = tf.function(fn, autograph=False).get_concrete_function(specs).graph
    counts, unknown, loops = _count(graph)
    if unknown:
        raise _UnknownSizes(
            f"inputs {_describe(specs)}, with which {len(unknown)} matmul/conv op(s) have no "
            f"static shape (e.g. {unknown[0]!r})."
        )
    if loops:
        warnings.warn(
            "The model has loops (e.g. recurrent layers): their FLOPs are counted once, not "
            "per iteration, so the count is a lower bound.",
            stacklevel=stacklevel,
        )
    counts["total"] = sum(counts.values())
    return counts


def _describe(specs) -> str:
    import tensorflow as tf

    parts = [
        f"{tuple(s.shape)} {s.dtype.name}"
        for s in tf.nest.flatten(specs)
        if isinstance(s, tf.TensorSpec)
    ]
    return ", ".join(parts) or repr(specs)


_SIGNATURE_EXPECTED = (
    "a tf.TensorSpec, or a nested structure of them (or of arrays with the shapes of a real "
    "batch), e.g. tf.TensorSpec((None, 32, 32, 3))"
)


def _input_specs(model, batch_size: int, input_signature):
    import tensorflow as tf

    if input_signature is not None:
        # One error for a leaf that is no spec and for a structure tf.nest cannot map.
        refused = invalid_type("input_signature", input_signature, _SIGNATURE_EXPECTED)

        def spec(s):
            shape, dtype = getattr(s, "shape", None), getattr(s, "dtype", None)
            if shape is None or dtype is None:
                raise refused
            shape = tf.TensorShape(shape)
            if shape.rank is None:
                raise _UnknownSizes(f"input_signature={input_signature!r} (unknown rank).")
            if shape.rank == 0:
                raise invalid_value(
                    "input_signature",
                    input_signature,
                    "specs with a batch dimension first (rank >= 1)",
                )
            return tf.TensorSpec((batch_size, *shape.as_list()[1:]), tf.as_dtype(dtype))

        try:
            return tf.nest.map_structure(spec, input_signature)
        except TypeError as e:
            if e is refused:
                raise
            raise refused from e
    try:
        inputs = getattr(model, "inputs", None)
    except (AttributeError, ValueError):
        inputs = None
    if not inputs:
        raise ValueError(
            "Cannot count FLOPs of a model without known inputs. Received: a model whose "
            "`inputs` are undefined (a subclassed or unbuilt model). Expected: a "
            "Functional/Sequential model with an `Input`, or pass "
            "`input_signature=tf.TensorSpec((None, ...))` with the sizes of a real batch."
        )
    specs = [tf.TensorSpec((batch_size, *tuple(t.shape)[1:]), t.dtype or "float32") for t in inputs]
    return specs[0] if len(specs) == 1 else specs


def _train_counts(model, specs) -> dict[str, float]:
    import tensorflow as tf

    def step(x):
        with tf.GradientTape() as tape:
            outputs = model(x, training=True)
            parts = [
                tf.reduce_sum(tf.cast(o, "float32"))
                for o in tf.nest.flatten(outputs)
                if o.dtype.is_floating
            ]
            loss = tf.add_n(parts) if parts else tf.constant(0.0)
        grads = tape.gradient(loss, model.trainable_variables)
        kept = [g for g in tf.nest.flatten(grads, expand_composites=True) if g is not None]
        return loss, outputs, kept

    return _counted(step, specs, stacklevel=5)  # user <- train_step_flops <- _step_flops


def train_step_flops(model: Any, batch_size: int, *, input_signature: Any = None) -> float:
    """Returns the matmul/conv FLOPs of one training step, as the step really computes them.

    Read from the traced gradient graph (else 3x the forward pass, 1x with nothing trainable,
    with a warning). The guide: docs/diagnosis.md, "FLOPs and MFU".

    Args:
        model: keras.Model, a built Functional/Sequential model (any with `input_signature`).
        batch_size: int, the (global) batch size of one step.
        input_signature: `tf.TensorSpec` (or array), or a nested structure of them: the input
            shapes and dtypes, the batch dimension ignored. Defaults to None: `model.inputs`.

    Returns:
        float, FLOPs per training step.

    Raises:
        TypeError: for a `batch_size` not an int, no Keras model, or a spec without a shape.
        ValueError: for `batch_size` < 1, unknown inputs, or unknown sizes (None dims).

    Example:

    >>> model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])
    >>> train_step_flops(model, batch_size=4)  # forward + weight gradient: 2 * 2 * 4 * 32 * 10
    5120.0
    """
    check_int("batch_size", batch_size, expected="a positive int")
    if not callable(model) or not hasattr(model, "trainable_variables"):
        raise invalid_type("model", model, "a keras.Model")
    try:
        return _step_flops(model, batch_size, input_signature)
    except _UnknownSizes as e:
        raise ValueError(str(e)) from None  # a plain ValueError for the caller


def _step_flops(model, batch_size: int, input_signature) -> float:
    specs = _input_specs(model, batch_size, input_signature)
    try:
        return _train_counts(model, specs)["total"]
    except _UnknownSizes:
        raise
    # The one catch-all: tracing any model's gradient fails in any way (an op without a
    # gradient: LookupError, a layer's NotImplementedError...); then the estimate below.
    except Exception as e:
        reason = e
    forward = _counted(lambda x: model(x, training=False), specs, stacklevel=4)["total"]
    factor = 3.0 if model.trainable_variables else 1.0
    warnings.warn(
        f"Could not trace the gradient of a training step ({one_line(reason)}); counting a step as {factor:g}x the forward pass, which overcounts "
        "frozen layers.",
        stacklevel=3,
    )
    return factor * forward
