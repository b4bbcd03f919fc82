"""FLOPs per training step, peak FLOP/s per GPU model, and model FLOPs utilization (MFU).

MFU is the share of the GPU's peak arithmetic rate a training run achieves:
`mfu = train_step_flops / step_time_s / peak_flops`. The FLOP count follows the usual
convention (Kaplan et al. 2020, "Scaling Laws for Neural Language Models"; Chowdhery et al.
2022, PaLM, appendix B): only matrix multiplications and convolutions are counted, a
multiply-add is 2 FLOPs, and a training step (forward + backward) costs 3x the forward pass.

The forward count is read from the model's traced graph (a `tf.function` of the forward pass
at the given batch size), op by op: `MatMul`, `BatchMatMul*`, `Einsum`, `Conv2D`, `Conv3D`,
`DepthwiseConv2dNative`, `Conv2DBackpropInput` (transposed convolutions) and
`Conv3DBackpropInputV2`. Element-wise ops, bias adds, normalization and softmax are left out
(they are a few percent for real models). Ops inside loops (recurrent layers) are counted
once, not per time step; such models get a warning.

The peak table lists dense (not structured-sparse) rates from NVIDIA datasheets and
architecture whitepapers; `docs/diagnosis.md` has the table with its sources.
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from tfgpu._checks import check_int, invalid_type, invalid_value

__all__ = ["mfu", "peak_flops", "train_step_flops"]

_TERA = 1e12

# The ops counted and their FLOPs, given static input/output shapes.
_COUNTED_OPS = (
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Einsum",
    "Conv2D",
    "Conv3D",
    "DepthwiseConv2dNative",
    "Conv2DBackpropInput",
    "Conv3DBackpropInputV2",
)
_LOOP_OPS = ("While", "StatelessWhile")


@dataclass(frozen=True)
class _Peak:
    pattern: str  # regex matched against the lower-cased NVML name
    label: str
    fp32: float  # TFLOP/s on CUDA cores
    tf32: float | None  # TFLOP/s, tensor cores, dense
    fp16: float | None  # TFLOP/s, tensor cores, FP32 accumulate, dense
    bf16: float | None
    source: str


# Dense peak TFLOP/s. Order matters: the first matching pattern wins, so specific names
# (PCIe, NVL, S, Ti) come before the generic one.
_PEAKS: tuple[_Peak, ...] = (
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): SXM / NVL.
    _Peak(r"h200.*nvl", "H200 NVL", 60.0, 417.5, 835.5, 835.5, "NVIDIA H200 datasheet (NVL)"),
    _Peak(r"h200", "H200 SXM", 67.0, 494.5, 989.5, 989.5, "NVIDIA H200 datasheet (SXM)"),
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100).
    _Peak(r"h100.*nvl", "H100 NVL", 60.0, 417.5, 835.5, 835.5, "NVIDIA H100 datasheet (NVL)"),
    _Peak(r"h100.*pcie", "H100 PCIe", 51.0, 378.0, 756.0, 756.0, "NVIDIA H100 datasheet (PCIe)"),
    _Peak(r"h100", "H100 SXM", 67.0, 494.5, 989.5, 989.5, "NVIDIA H100 datasheet (SXM)"),
    # NVIDIA A100 Tensor Core GPU datasheet; SXM4 and PCIe share the peak rates.
    _Peak(r"a100", "A100", 19.5, 156.0, 312.0, 312.0, "NVIDIA A100 datasheet"),
    # NVIDIA A30 datasheet.
    _Peak(r"\ba30\b", "A30", 10.3, 82.0, 165.0, 165.0, "NVIDIA A30 datasheet"),
    # NVIDIA L40S datasheet; NVIDIA L40 datasheet.
    _Peak(r"l40s", "L40S", 91.6, 183.0, 362.05, 362.05, "NVIDIA L40S datasheet"),
    _Peak(r"\bl40\b", "L40", 90.5, 90.5, 181.0, 181.0, "NVIDIA L40 datasheet"),
    # NVIDIA L4 Tensor Core GPU datasheet.
    _Peak(r"\bl4\b", "L4", 30.3, 60.0, 121.0, 121.0, "NVIDIA L4 datasheet"),
    # NVIDIA A10 Tensor Core GPU datasheet.
    _Peak(r"\ba10\b", "A10", 31.2, 62.5, 125.0, 125.0, "NVIDIA A10 datasheet"),
    # NVIDIA T4 Tensor Core GPU datasheet (Turing: no TF32, no bfloat16).
    _Peak(r"\bt4\b", "T4", 8.1, None, 65.0, None, "NVIDIA T4 datasheet"),
    # NVIDIA V100 Tensor Core GPU datasheet (Volta: no TF32, no bfloat16).
    _Peak(r"v100s", "V100S PCIe", 16.4, None, 130.0, None, "NVIDIA V100 datasheet (V100S)"),
    _Peak(r"v100.*pcie", "V100 PCIe", 14.0, None, 112.0, None, "NVIDIA V100 datasheet (PCIe)"),
    _Peak(r"v100", "V100 SXM2", 15.7, None, 125.0, None, "NVIDIA V100 datasheet (SXM2)"),
    # NVIDIA RTX A6000 datasheet.
    _Peak(r"rtx a6000", "RTX A6000", 38.7, 77.4, 154.8, 154.8, "NVIDIA RTX A6000 datasheet"),
    # NVIDIA Ada GPU architecture whitepaper (v2.1), appendix table for GeForce RTX 4090/4080;
    # GeForce cards run FP16/BF16 with FP32 accumulate at half the FP16-accumulate rate.
    _Peak(r"rtx 4090", "RTX 4090", 82.6, 82.6, 165.2, 165.2, "NVIDIA Ada whitepaper"),
    _Peak(r"rtx 4080", "RTX 4080", 48.7, 48.7, 97.5, 97.5, "NVIDIA Ada whitepaper"),
    # NVIDIA Ampere GA102 GPU architecture whitepaper (v2.0), GeForce RTX 3090 / 3080.
    _Peak(r"rtx 3090 ti", "RTX 3090 Ti", 40.0, 40.0, 80.0, 80.0, "NVIDIA GA102 whitepaper"),
    _Peak(r"rtx 3090", "RTX 3090", 35.6, 35.6, 71.0, 71.0, "NVIDIA GA102 whitepaper"),
    _Peak(r"rtx 3080", "RTX 3080", 29.8, 29.8, 59.5, 59.5, "NVIDIA GA102 whitepaper"),
)

_PRECISIONS = {
    "float32": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "float16": "fp16",
    "fp16": "fp16",
    "mixed_float16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "mixed_bfloat16": "bf16",
}


def _lookup_peak(gpu_name: str) -> _Peak | None:
    name = " ".join(gpu_name.lower().replace("-", " ").split())
    for peak in _PEAKS:
        if re.search(peak.pattern, name):
            return peak
    return None


def peak_flops(gpu_name: str, precision: str) -> float | None:
    """Returns the GPU's dense peak FLOP/s for a precision, from the datasheet table.

    Matches names as NVML reports them (`"NVIDIA H100 80GB HBM3"`, `"NVIDIA A100-SXM4-40GB"`,
    `"Tesla T4"`, `"NVIDIA GeForce RTX 4090"`). Rates are dense (no 2:4 sparsity); FP16 and
    BF16 are tensor-core rates with FP32 accumulation, which is what Keras mixed precision
    uses. Note that TensorFlow runs float32 matmuls in TF32 on Ampere and newer GPUs by
    default (`tf.config.experimental.enable_tensor_float_32_execution`), so pass `"tf32"`
    there for a float32 model.

    Args:
        gpu_name: str, the GPU model name as NVML or `nvidia-smi --query-gpu=name` gives it.
        precision: str, one of `"float32"`/`"fp32"`, `"tf32"`, `"float16"`/`"fp16"`/
            `"mixed_float16"`, `"bfloat16"`/`"bf16"`/`"mixed_bfloat16"`.

    Returns:
        float, peak FLOP/s, or `None` when the GPU is not in the table or lacks that precision
        (e.g. bfloat16 on a T4).

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
    peak = _lookup_peak(gpu_name)
    if peak is None:
        return None
    tflops = getattr(peak, key)
    return None if tflops is None else tflops * _TERA


def mfu(flops_per_step: float, step_time_s: float, peak: float | None) -> float | None:
    """Returns model FLOPs utilization: achieved FLOP/s divided by peak FLOP/s.

    Args:
        flops_per_step: float, FLOPs of one training step (see `train_step_flops`); NaN
            (not measured) gives None.
        step_time_s: float, seconds per training step; zero or NaN (not measured) gives None.
        peak: float or None, the device's peak FLOP/s (see `peak_flops`); None or zero when
            the device is not in the peak table.

    Returns:
        float in [0, 1] for a sane measurement, or `None` when `peak` is unknown or the step
        time or FLOPs are not measured.

    Raises:
        TypeError: if an argument is not a real number (bools are not), or `peak` is neither a
            number nor None.
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
    if peak is None or not peak or math.isnan(peak):
        return None
    if math.isnan(step_time_s) or math.isnan(flops_per_step) or step_time_s <= 0:
        return None
    return float(flops_per_step) / float(step_time_s) / float(peak)


def _shape(tensor) -> list[int] | None:
    dims = tensor.shape
    if dims.rank is None:
        return None
    out = [d for d in dims.as_list()]
    return None if any(d is None for d in out) else out


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
    """FLOPs of one graph op, or None when its shapes are not static."""
    t = op.type
    ins = [_shape(x) for x in op.inputs]
    out = _shape(op.outputs[0]) if op.outputs else None
    try:
        if t == "MatMul":
            a, _ = ins[0], ins[1]
            if a is None or out is None:
                return None
            k = a[0] if op.get_attr("transpose_a") else a[1]
            return 2.0 * out[0] * out[1] * k
        if t.startswith("BatchMatMul"):
            a = ins[0]
            if a is None or out is None:
                return None
            adj = op.get_attr("adj_x")
            k = a[-2] if adj else a[-1]
            return 2.0 * math.prod(out) * k
        if t == "Einsum":
            shapes = [s for s in ins if s is not None]
            if len(shapes) < len(ins):
                return None
            return _einsum_flops(op.get_attr("equation").decode(), shapes)
        if t in ("Conv2D", "Conv3D"):
            kernel = ins[1]
            if kernel is None or out is None:
                return None
            # kernel: spatial..., in_channels, out_channels; output: batch, spatial..., out.
            return 2.0 * math.prod(out) * math.prod(kernel[:-1])
        if t == "DepthwiseConv2dNative":
            kernel = ins[1]
            if kernel is None or out is None:
                return None
            return 2.0 * math.prod(out) * kernel[0] * kernel[1]
        if t in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
            kernel, grad = ins[1], ins[2]
            if kernel is None or grad is None:
                return None
            # Transposed conv: every input (grad) position multiplies the full kernel.
            return 2.0 * math.prod(grad[:-1]) * math.prod(kernel)
    except (ValueError, IndexError, TypeError):
        return None
    return None


def _input_specs(model, batch_size: int, input_signature):
    import tensorflow as tf

    if input_signature is not None:
        specs = tf.nest.map_structure(
            lambda s: tf.TensorSpec((batch_size, *tuple(s.shape)[1:]), s.dtype),
            input_signature,
        )
        return specs
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            "Cannot count FLOPs of a model without known inputs. Received: a model whose "
            "`inputs` are undefined (a subclassed model). Expected: a Functional/Sequential "
            "model with an `Input`, or pass `input_signature=tf.TensorSpec((None, ...))`."
        )
    specs = [tf.TensorSpec((batch_size, *tuple(t.shape)[1:]), t.dtype or "float32") for t in inputs]
    return specs[0] if len(specs) == 1 else specs


def _forward_flops(model, batch_size: int = 1, *, input_signature=None) -> dict:
    """Counts forward FLOPs per op type from the traced graph.

    Args:
        model: keras.Model, a built model.
        batch_size: int, the batch the forward pass runs on. Defaults to 1.
        input_signature: optional nested `tf.TensorSpec`, the input shapes (batch dim
            ignored). Defaults to the model's `inputs`.

    Returns:
        dict mapping op type to FLOPs, plus `"total"`.
    """
    import tensorflow as tf

    specs = _input_specs(model, batch_size, input_signature)
    fn = tf.function(lambda x: model(x, training=False), autograph=False)
    graph = fn.get_concrete_function(specs).graph
    counts: dict[str, float] = {}
    unknown, loops = [], False

    def visit(g):
        nonlocal loops
        for op in g.get_operations():
            if op.type in _LOOP_OPS:
                loops = True
            if op.type in _COUNTED_OPS:
                f = _op_flops(op)
                if f is None:
                    unknown.append(op.name)
                else:
                    counts[op.type] = counts.get(op.type, 0.0) + f
        for sub in getattr(g, "_functions", {}).values():
            sub_graph = getattr(sub, "graph", None)
            if sub_graph is not None and sub_graph is not g:
                visit(sub_graph)

    visit(graph)
    if unknown:
        raise ValueError(
            f"Cannot count FLOPs: {len(unknown)} op(s) have non-static shapes (e.g. "
            f"{unknown[0]}). Received: inputs {specs}. Expected fully defined input shapes "
            "apart from the batch; pass `input_signature` with fixed sizes."
        )
    if loops:
        warnings.warn(
            "The model has loops (e.g. recurrent layers): their FLOPs are counted once, not "
            "per iteration, so the count is a lower bound.",
            stacklevel=3,
        )
    counts["total"] = sum(counts.values())
    return counts


def train_step_flops(model, batch_size: int, *, input_signature=None) -> float:
    """Returns the FLOPs of one training step: 3x the forward pass's matmul/conv FLOPs.

    Backpropagation costs about twice the forward pass (one matmul for the input gradient and
    one for the weight gradient per forward matmul), hence 3x.

    Args:
        model: keras.Model, a built model (Functional/Sequential, or any model when
            `input_signature` is given).
        batch_size: int, the (global) batch size of one step.
        input_signature: optional `tf.TensorSpec` or nested structure of them giving the
            input shapes; the batch dimension is ignored. Defaults to `model.inputs`.

    Returns:
        float, FLOPs per training step.

    Raises:
        ValueError: if `batch_size` is not a positive int, or input shapes are unknown.

    Example:

    >>> model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(10)])
    >>> train_step_flops(model, batch_size=4)  # 3 * 2 * 4 * 32 * 10
    7680.0
    """
    check_int("batch_size", batch_size, expected="a positive int")
    forward = _forward_flops(model, batch_size, input_signature=input_signature)
    return 3.0 * forward["total"]
