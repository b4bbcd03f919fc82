"""Reading the traced train step without running it: its ops, where they are placed and
whether a GPU kernel exists for them; and one batch's size in bytes. (The dataset's graph is
read by the measuring core's facts.)"""

from __future__ import annotations

import warnings

import tensorflow as tf

from tfgpu.diagnosis._facts import OpFact


def batch_nbytes(batch) -> int | None:
    """Bytes of one batch's tensors (inputs, labels, weights), or None if unknown."""
    total = 0
    try:
        for t in tf.nest.flatten(batch, expand_composites=True):
            n = t.shape.num_elements()
            if n is None:
                return None
            total += int(n) * int(t.dtype.size)
    except AttributeError:  # an element that is not a tensor (None in the batch): unknown
        return None
    return total or None


def _has_gpu_kernel(node, registry: dict[str, list | None]) -> bool:
    """Whether a GPU (or device-agnostic) kernel is registered for `node`'s op and dtypes."""
    from tensorflow.python.framework import kernels

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
    """Traces the model's train step on `batch` (no step runs) and lists the ops of its graph
    and its functions. Under several replicas the strategy places ops itself: the devices
    asked for are not kept there."""
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
