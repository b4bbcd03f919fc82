"""What the model says, read without training it: its traced train step's ops (where they are
placed, whether a GPU kernel exists for them), one batch's bytes, its precision (the loss
scale, the layers that keep float32 math or odd matrix sizes) and the mixed-precision lint."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import kernels

from tfgpu.diagnosis._facts import OpFact
from tfgpu.diagnosis._result import Finding
from tfgpu.precision import has_tensor_cores

_HALF = ("float16", "bfloat16")  # the compute dtypes of a mixed policy


def lint_mixed_precision(model, compute_capabilities) -> list[Finding]:
    """Checks a model for mixed-precision pitfalls (pure: reads the model, changes nothing)."""
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
    odd = _odd_dims(mixed) if tensor_cores else []
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
    scale = getattr(getattr(model, "optimizer", None), "dynamic_scale", None)
    if scale is None:
        return None
    try:
        return float(np.asarray(scale.numpy() if hasattr(scale, "numpy") else scale))
    except (TypeError, ValueError):  # not one number
        return None


def _has_gpu_kernel(node, registry: dict[str, list | None]) -> bool:
    """Whether a GPU (or device-agnostic) kernel is registered for `node`'s op and dtypes."""
    if node.op not in registry:
        try:
            found = kernels.get_registered_kernels_for_op(node.op).kernel
        except tf.errors.OpError:  # the registry could not be read for it: unknown
            found = None
        registry[node.op] = (
            None if found is None else [k for k in found if k.device_type in ("GPU", "DEFAULT")]
        )
    candidates = registry[node.op]
    if candidates is None:
        return True  # unknown here: do not accuse it
    for kernel in candidates:
        if all(_fits(node.attr.get(c.name), c.allowed_values.list.type) for c in kernel.constraint):
            return True
    return False


def _fits(attr, allowed) -> bool:
    """Whether a node's type attribute is one a kernel constraint allows."""
    if attr is None or not allowed:
        return True
    which = attr.WhichOneof("value")
    if which == "type":
        return attr.type in allowed
    if which == "list":
        return all(t in allowed for t in attr.list.type)
    return True


def step_ops(model, batch) -> list[OpFact]:
    """The ops of the model's train step traced on `batch` (no step runs); under several
    replicas the strategy places them, so the devices asked for are not kept."""
    strategy = model.distribute_strategy
    keep_devices = int(strategy.num_replicas_in_sync) == 1

    def step(data):
        return strategy.run(model.train_step, args=(data,))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Gradients do not exist": not ours to say
        graph = tf.function(step).get_concrete_function(batch).graph.as_graph_def()
    registry: dict[str, list | None] = {}
    nodes = list(graph.node)
    for fn in graph.library.function:
        nodes += list(fn.node_def)
    return [
        OpFact(
            node.name, node.op, node.device if keep_devices else "", _has_gpu_kernel(node, registry)
        )
        for node in nodes
    ]
