"""Data parallelism: pick a `tf.distribute.Strategy` (pure choices from the cluster and the
GPUs, then built), scale batch and learning rate. The guide: docs/distributed.md."""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfgpu._internal.helpers.checks import (
    check_finite_result,
    check_int,
    check_number,
    invalid_type,
    invalid_value,
    is_int,
)
from tfgpu._internal.helpers.cluster import Cluster, resolve_cluster, slurm_num_tasks

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["global_batch_size", "scale_learning_rate", "strategy"]

_LOG = logging.getLogger(__name__)

KINDS = ("auto", "default", "one_device", "mirrored", "multi_worker")
_ALL_REDUCE = {
    "mirrored": ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device"),
    "multi_worker": ("auto", "nccl", "ring"),
}
_LR_RULES = ("linear", "sqrt")

# The k-th strategy built here numbers its collective keys from FIRST + k * STRIDE: far from
# TensorFlow's own (from 1), and int32 for the first half million strategies.
_COLLECTIVE_KEY_FIRST = 1 << 20
_COLLECTIVE_KEY_STRIDE = 1 << 12
_collective_ranges = itertools.count()
_collective_lock = threading.Lock()


def _normalize_kind(kind: Any) -> str:
    if not isinstance(kind, str):
        raise invalid_type("kind", kind, f"a str, one of: {', '.join(map(repr, KINDS))}")
    normalized = kind.strip().lower().replace("-", "_")
    aliases = {"onedevice": "one_device", "multiworker": "multi_worker", "mirror": "mirrored"}
    normalized = aliases.get(normalized, normalized)
    if normalized not in KINDS:
        raise invalid_value("kind", kind, f"one of: {', '.join(map(repr, KINDS))}")
    return normalized


def _choose_kind(kind: str, *, num_gpus: int, num_tasks: int) -> str:
    """The strategy kind to build: `auto` resolved from the cluster size and GPU count."""
    kind = _normalize_kind(kind)
    if kind != "auto":
        return kind
    if num_tasks > 1:
        return "multi_worker"
    if num_gpus > 1:
        return "mirrored"
    if num_gpus == 1:
        return "one_device"
    return "default"


def _choose_all_reduce(kind: str, all_reduce: str, *, on_gpus: bool) -> str | None:
    """The reduction, a name of `_ALL_REDUCE[kind]` (`auto` resolved); None with one replica."""
    if not isinstance(all_reduce, str):
        raise invalid_type("all_reduce", all_reduce, "a str")
    all_reduce = all_reduce.strip().lower()
    allowed = _ALL_REDUCE.get(kind)
    if allowed is None:
        if all_reduce != "auto":
            raise invalid_value(
                "all_reduce",
                all_reduce,
                "'auto'",
                received=f"all_reduce={all_reduce!r} with kind={kind!r}, which has a single "
                "replica and nothing to reduce",
            )
        return None
    if all_reduce not in allowed:
        raise invalid_value(
            "all_reduce", all_reduce, f"one of (for kind={kind!r}): {', '.join(map(repr, allowed))}"
        )
    if all_reduce == "nccl" and not on_gpus:
        raise invalid_value(
            "all_reduce",
            all_reduce,
            "GPUs for NCCL; use 'auto' for a reduction that works on the CPU",
            received="all_reduce='nccl' with replicas on the CPU",
        )
    if all_reduce == "auto":
        if on_gpus:
            return "nccl"
        return "ring" if kind == "multi_worker" else "reduction_to_one_device"
    return all_reduce


def _num_replicas(strategy: Any) -> int:
    """The replicas of `strategy` (None: the strategy in scope), or `strategy` as a number."""
    if strategy is None:
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    if isinstance(strategy, bool):
        raise invalid_type(
            "strategy", strategy, "a tf.distribute.Strategy or a positive int (number of replicas)"
        )
    if is_int(strategy):  # a number of replicas (NumPy integers too)
        return check_int("strategy", strategy, expected="a positive number of replicas")
    replicas: Any = getattr(strategy, "num_replicas_in_sync", None)
    if not is_int(replicas):
        raise invalid_type("strategy", strategy, "a tf.distribute.Strategy or a positive int")
    return int(replicas)


def global_batch_size(per_replica: int, strategy: Any = None) -> int:
    """Returns the global batch size: `per_replica` examples on each replica of `strategy`.

    Keras and `tf.data` take the *global* batch, which the strategy splits across its
    replicas. The guide: docs/distributed.md, "Batch size and learning rate".

    Args:
        per_replica: int, examples each replica processes per step.
        strategy: `tf.distribute.Strategy`, a number of replicas, or None. Defaults to None.

    Returns:
        int, `per_replica * strategy.num_replicas_in_sync`.

    Raises:
        TypeError: if `per_replica` is not an int, or `strategy` is not a strategy or int.
        ValueError: if `per_replica` is not positive.

    Example:

    >>> tfgpu.global_batch_size(64, 4)
    256
    """
    per_replica = check_int("per_replica", per_replica, expected="a positive int")
    return per_replica * _num_replicas(strategy)


def scale_learning_rate(
    learning_rate: float, strategy: Any = None, *, rule: str = "linear", base_replicas: int = 1
) -> float:
    """Scales a learning rate tuned on `base_replicas` replicas to the replicas of `strategy`.

    `"linear"` multiplies the rate by the growth of the global batch (SGD with momentum),
    `"sqrt"` by its square root (Adam). The guide: docs/distributed.md.

    Args:
        learning_rate: float, the rate that works with `base_replicas` replicas.
        strategy: `tf.distribute.Strategy`, a number of replicas, or None. Defaults to None.
        rule: str, `"linear"` or `"sqrt"`. Defaults to `"linear"`.
        base_replicas: int, how many replicas `learning_rate` was tuned on. Defaults to 1.

    Returns:
        float, the scaled learning rate.

    Raises:
        TypeError: if `learning_rate` is not a number or `strategy` not a strategy or int.
        ValueError: for a `learning_rate` not > 0, an unknown `rule`, `base_replicas` < 1.

    Example:

    >>> tfgpu.scale_learning_rate(0.1, 8, rule="linear")
    0.8
    >>> tfgpu.scale_learning_rate(1e-3, 4, rule="sqrt")
    0.002
    """
    learning_rate = check_number(
        "learning_rate",
        learning_rate,
        minimum=0,
        exclusive_minimum=True,
        expected="a positive finite float",
    )
    if not isinstance(rule, str):
        raise invalid_type("rule", rule, f"one of: {', '.join(map(repr, _LR_RULES))}")
    if rule not in _LR_RULES:
        raise invalid_value("rule", rule, f"one of: {', '.join(map(repr, _LR_RULES))}")
    base_replicas = check_int("base_replicas", base_replicas, expected="a positive int")
    replicas = _num_replicas(strategy)
    factor = replicas / base_replicas
    scaled = learning_rate * (factor if rule == "linear" else math.sqrt(factor))
    check_finite_result(
        "the scaled learning rate",
        scaled,
        f"learning_rate={learning_rate!r}, {replicas} replicas, base_replicas={base_replicas}",
    )
    return float(round(scaled, 15))


def _check_devices(devices: list[str], available: Sequence[str]) -> list[str]:
    """Canonical names (`/device:GPU:1`) of `devices` in any spelling TensorFlow accepts (no
    index: 0); ValueError for one malformed, repeated or not among `available`."""
    import tensorflow as tf

    have = ", ".join(repr(d) for d in available) or "none"
    names = []
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device)
        except ValueError:
            spec = None
        shown = devices if len(devices) > 1 else device
        if spec is None or spec.device_type is None or spec.job not in (None, "localhost"):
            raise invalid_value(
                "devices",
                shown,
                f"local device names such as '/gpu:0' or '/cpu:0'; {device!r} is not one",
            )
        name = f"/device:{spec.device_type.upper()}:{spec.device_index or 0}"
        if name not in available:
            no_gpu = spec.device_type.upper() == "GPU" and not any("GPU" in d for d in available)
            hint = ". TensorFlow sees no GPU here (run `tfgpu env` to see why)" if no_gpu else ""
            raise invalid_value(
                "devices",
                shown,
                f"devices this process has: {have}; {device!r} is not one of them{hint}",
            )
        if name in names:
            raise invalid_value("devices", devices, f"distinct devices; {device!r} is repeated")
        names.append(name)
    return names


def _local_devices() -> list[str]:
    """Canonical names of this process's logical devices (initializes the runtime)."""
    import tensorflow as tf

    return [
        f"/device:{d.device_type}:{d.name.rsplit(':', 1)[-1]}"
        for d in tf.config.list_logical_devices()
    ]


def _collective_key_base(index: int) -> int:
    """The first collective group key of the `index`-th strategy this process builds (pure)."""
    return _COLLECTIVE_KEY_FIRST + index * _COLLECTIVE_KEY_STRIDE


def _build_with_own_collective_keys(cls, *args, **kwargs):
    """Builds `cls(*args, **kwargs)` whose collective ops use keys no other strategy uses (why:
    docs/distributed.md, "Several strategies in one process"). Sets the `_collective_key_base`
    TensorFlow's own tests use on the instance before `__init__`: nothing global changes."""
    if not isinstance(getattr(cls, "_collective_key_base", None), int):
        return cls(*args, **kwargs)
    with _collective_lock:
        index = next(_collective_ranges)
    instance = cls.__new__(cls)
    instance._collective_key_base = _collective_key_base(index)
    instance.__init__(*args, **kwargs)
    return instance


def _slurm_resolver(environ: Mapping[str, str], port_base: int):
    """TensorFlow's `SlurmClusterResolver`, told the GPU count so it never runs nvidia-smi."""
    import tensorflow as tf

    if environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        gpus = len([d for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()])
        auto_set_gpu = False  # Slurm (or the user) already bound GPUs to this task
    elif environ.get("SLURM_GPUS_ON_NODE", "").strip().isdigit():
        gpus = int(environ["SLURM_GPUS_ON_NODE"])
        auto_set_gpu = gpus > 0
    else:
        gpus = len(tf.config.list_physical_devices("GPU"))
        auto_set_gpu = False
    per_task = None  # the resolver's own: a node's GPUs divided among its tasks
    if gpus == 0:
        # That division fails on 0 GPUs (range() step 0): each task gets a placeholder GPU it
        # never applies (auto_set_gpu is False without GPUs).
        gpus, per_task = slurm_num_tasks(environ) or 1, 1
    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=gpus, gpus_per_task=per_task, auto_set_gpu=auto_set_gpu
    )


def strategy(
    kind: str = "auto",
    *,
    devices: Sequence[str] | None = None,
    all_reduce: str = "auto",
    timeout_s: float | None = None,
    slurm_port_base: int = 8888,
) -> tf.distribute.Strategy:
    """Returns a `tf.distribute.Strategy` for this machine or cluster.

    Create it before any model, build the model and optimizer inside `strategy.scope()`, and
    call it again for each new model. The guide: docs/distributed.md, "What `strategy()`
    picks".

    Args:
        kind: str, `"auto"`, `"default"`, `"one_device"`, `"mirrored"` or `"multi_worker"`
            (case-insensitive). Defaults to `"auto"`.
        devices: list of str, the devices to replicate on (`["/gpu:0", "/gpu:1"]`). Defaults
            to `None`: all GPUs.
        all_reduce: str, how gradients are summed (`"nccl"`, `"ring"`, ...). Defaults to
            `"auto"`.
        timeout_s: float or None, multi-worker: a collective's longest wait. Defaults to `None`.
        slurm_port_base: int, the first port of a node's Slurm tasks. Defaults to 8888.

    Returns:
        `tf.distribute.Strategy`.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if `kind`, `devices` or `all_reduce` is invalid, or `TF_CONFIG` malformed.

    Example:

    >>> strategy = tfgpu.strategy()                       # whatever the machine offers
    >>> strategy = tfgpu.strategy("mirrored", devices=["/gpu:0", "/gpu:1"])
    >>> with strategy.scope():
    ...     model = build_model()
    """
    import tensorflow as tf

    normalized = _normalize_kind(kind)
    _check_device_names(devices, normalized)
    check_number(
        "timeout_s",
        timeout_s,
        minimum=0,
        exclusive_minimum=True,
        allow_none=True,
        expected="a positive number of seconds or None",
    )
    check_int("slurm_port_base", slurm_port_base, minimum=1, maximum=65535)
    cluster = resolve_cluster(os.environ)
    gpus = len(tf.config.list_physical_devices("GPU"))
    chosen = _choose_kind(normalized, num_gpus=gpus, num_tasks=cluster.num_tasks)
    if chosen == "default":
        _choose_all_reduce(chosen, all_reduce, on_gpus=False)
        if devices is not None:
            raise invalid_value(
                "devices",
                devices,
                "None",
                received=f"devices={devices!r} with kind='default', which uses TensorFlow's "
                "default placement",
            )
        _LOG.info("tfgpu.strategy: default strategy (%s)", "no GPU" if not gpus else "as asked")
        return tf.distribute.get_strategy()
    if chosen == "one_device":
        return _one_device_strategy(devices, all_reduce, gpus)
    if chosen == "mirrored":
        return _mirrored_strategy(devices, all_reduce, gpus)
    return _multi_worker_strategy(devices, all_reduce, gpus, cluster, timeout_s, slurm_port_base)


def _check_device_names(devices: Any, kind: str) -> None:
    """Checks the form of `devices` (its names are checked against the devices later)."""
    if devices is None:
        return
    expected = 'a non-empty list of device names, e.g. ["/gpu:0", "/gpu:1"]'
    if isinstance(devices, str):
        if kind != "one_device":
            raise invalid_value("devices", devices, expected)
    elif not isinstance(devices, Sequence) or not all(isinstance(d, str) for d in devices):
        raise invalid_type("devices", devices, expected)
    elif not devices:
        raise invalid_value("devices", devices, expected)


def _one_device_strategy(
    devices: Sequence[str] | None, all_reduce: str, gpus: int
) -> tf.distribute.Strategy:
    """`OneDeviceStrategy` on the device given, else on the first GPU (or the CPU)."""
    import tensorflow as tf

    _choose_all_reduce("one_device", all_reduce, on_gpus=bool(gpus))
    if devices is None:
        device = "/gpu:0" if gpus else "/cpu:0"
    elif isinstance(devices, str):
        device = devices
    elif len(devices) == 1:
        device = devices[0]
    else:
        raise invalid_value(
            "devices",
            devices,
            "a single device",
            received=f"devices={list(devices)!r} with kind='one_device'",
        )
    device = _check_devices([device], _local_devices())[0]
    _LOG.info("tfgpu.strategy: OneDeviceStrategy on %s", device)
    return tf.distribute.OneDeviceStrategy(device)


def _mirrored_strategy(
    devices: Sequence[str] | None, all_reduce: str, gpus: int
) -> tf.distribute.Strategy:
    """`MirroredStrategy` on the devices given, else on every GPU (none: the logical CPUs)."""
    import tensorflow as tf

    if devices is None:
        if gpus:
            devices = [f"/gpu:{i}" for i in range(len(tf.config.list_logical_devices("GPU")))]
        else:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            warnings.warn(
                f"tfgpu.strategy('mirrored'): no GPU is visible, so the replicas run on "
                f"{len(devices)} logical CPU device(s) {devices}. This proves the numerics, "
                "not speed.",
                stacklevel=3,
            )
    devices = _check_devices(list(devices), _local_devices())
    on_gpus = all("GPU" in d for d in devices)
    name = _choose_all_reduce("mirrored", all_reduce, on_gpus=on_gpus)
    _LOG.info("tfgpu.strategy: MirroredStrategy on %s, all-reduce %s", devices, name)
    from tfgpu._internal.adapters.all_reduce import mirrored_ops

    ops = None if name is None else mirrored_ops()[name]()
    return _build_with_own_collective_keys(
        tf.distribute.MirroredStrategy, devices=devices, cross_device_ops=ops
    )


def _multi_worker_strategy(
    devices: Sequence[str] | None,
    all_reduce: str,
    gpus: int,
    cluster: Cluster,
    timeout_s: float | None,
    slurm_port_base: int,
) -> tf.distribute.Strategy:
    """`MultiWorkerMirroredStrategy` over `cluster`, Keras 3 corrected where it needs it."""
    import tensorflow as tf

    if devices is not None:
        raise invalid_value(
            "devices",
            devices,
            "None: each worker replicates over its visible GPUs (restrict them with "
            "CUDA_VISIBLE_DEVICES or tfgpu.configure())",
            received=f"devices={devices!r} with kind='multi_worker'",
        )
    name = _choose_all_reduce("multi_worker", all_reduce, on_gpus=bool(gpus))
    if name is None:  # _ALL_REDUCE lists multi_worker's reductions, so one is chosen
        raise AssertionError("no all-reduce chosen for kind='multi_worker'")
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, name.upper())
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=timeout_s
    )
    resolver = None
    if cluster.source == "slurm":
        resolver = _slurm_resolver(os.environ, slurm_port_base)
    elif cluster.num_tasks <= 1:
        _LOG.info("tfgpu.strategy: multi_worker with a single task (no TF_CONFIG or Slurm step)")
    cls = tf.distribute.MultiWorkerMirroredStrategy
    kwargs = dict(cluster_resolver=resolver, communication_options=options)
    # Every worker must use the same keys: TensorFlow's, from the one strategy each builds.
    several = cluster.num_tasks > 1
    result = cls(**kwargs) if several else _build_with_own_collective_keys(cls, **kwargs)
    from tfgpu._internal.adapters import keras_internals

    if keras_internals.needs_multi_worker_correction(result):
        keras_internals.install_multi_worker_correction()
    _LOG.info(
        "tfgpu.strategy: MultiWorkerMirroredStrategy (%s), %d replicas, all-reduce %s",
        cluster.source,
        result.num_replicas_in_sync,
        name,
    )
    return result
