"""What the model says about its precision: the policy, the loss scale, the layers that
keep float32 math or odd matrix sizes, and the mixed-precision lint."""

from __future__ import annotations

from typing import Any

import numpy as np

from tfgpu.diagnosis._result import Finding

_HALF = ("float16", "bfloat16")  # the compute dtypes of a mixed policy


def lint_mixed_precision(model, compute_capabilities) -> list[Finding]:
    """Checks a model for mixed-precision pitfalls (pure: reads the model, changes nothing)."""
    from tfgpu.precision import has_tensor_cores

    mixed = [la for la in _leaf_layers(model) if getattr(la, "compute_dtype", None) in _HALF]
    if not mixed:
        return []
    findings = []
    last = model.layers[-1] if model.layers else None
    while last is not None and getattr(last, "layers", None):
        last = last.layers[-1]
    if last is not None and getattr(last, "compute_dtype", None) in _HALF:
        findings.append(
            Finding(
                "mixed_precision_output",
                "high",
                f"The output layer `{last.name}` computes in {last.compute_dtype}",
                "Softmax and losses lose precision and overflow in 16 bits.",
                f'Give the last layer `dtype="float32"`, e.g. `keras.layers.Activation('
                f'"softmax", dtype="float32")` after a linear `{last.name}`.',
            )
        )
    tensor_cores = bool(compute_capabilities) and all(
        has_tensor_cores(tuple(cc)) for cc in compute_capabilities
    )
    if tensor_cores:
        odd = _odd_dims(mixed)
        if odd:
            findings.append(
                Finding(
                    "mixed_precision_dims",
                    "moderate",
                    "Matrix dimensions not multiples of 8",
                    "Tensor cores need input/output sizes that are multiples of 8 in float16/"
                    "bfloat16; these kernels are not: " + ", ".join(odd[:8]) + ".",
                    "Round `units` / `filters` / `output_dim` (and input features, e.g. by "
                    "padding the vocabulary or channels) up to a multiple of 8.",
                )
            )
    return findings


def _leaf_layers(model) -> list[Any]:
    return [la for la in model._flatten_layers(include_self=False) if not la._layers]


def _odd_dims(layers) -> list[str]:
    """ "`name` (shape)" of each layer whose kernel's last two dims are not multiples of 8."""
    odd = []
    for la in layers:
        kernel = getattr(la, "kernel", None)
        shape = tuple(int(d) for d in kernel.shape) if kernel is not None else ()
        dims = shape[-2:] if len(shape) >= 2 else ()
        if any(d % 8 for d in dims):
            odd.append(f"`{la.name}` {shape}")
    return odd


def precision_layers(model) -> tuple[list[str], list[str]]:
    """(layers keeping float32 math under a 16-bit policy, the last one left out; kernels with
    dims not multiples of 8) for the tensor-core advice. Reads the model, changes nothing."""
    layers = _leaf_layers(model)
    mixed = [la for la in layers if getattr(la, "compute_dtype", None) in _HALF]
    with_kernel = [la for la in layers if getattr(la, "kernel", None) is not None]
    float32 = []
    if mixed:
        last = with_kernel[-1] if with_kernel else None
        float32 = [
            f"`{la.name}`"
            for la in with_kernel
            if la is not last and getattr(la, "compute_dtype", None) == "float32"
        ]
    return float32, _odd_dims(mixed or with_kernel)


def loss_scale(model) -> float | None:
    opt = getattr(model, "optimizer", None)
    scale = getattr(opt, "dynamic_scale", None)
    if scale is None:
        return None
    try:
        return float(np.asarray(scale.numpy() if hasattr(scale, "numpy") else scale))
    except (TypeError, ValueError):  # not one number
        return None
