"""The all-reduce a strategy sums gradients with: which one (`describe`), another for a while
(`using`, for `tune`), all reached in `reach` (checked against `CHECKED_TF`); TF imported lazily."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from tfgpu._internal.helpers.checks import invalid_value

CHECKED_TF = (2, 21)  # the TensorFlow version (major, minor) `reach` was checked against

# The all-reduce names of `tfgpu.strategy(kind, all_reduce=...)`, by kind; then what a
# MirroredStrategy built without `cross_device_ops` uses, which no such name gives.
MIRRORED = ("nccl", "hierarchical_copy", "reduction_to_one_device")
MULTI_WORKER = ("nccl", "ring")
COLLECTIVE = "collective"  # TensorFlow's collective ops


@dataclasses.dataclass(frozen=True)
class AllReduce:
    """How a strategy sums its replicas' gradients. Pure data."""

    kind: str = ""  # "mirrored", "multi_worker", or "" (one replica, another strategy)
    replicas: int = 1
    workers: int = 1
    on_gpus: bool = False
    # A name of `MIRRORED` or `MULTI_WORKER`, `COLLECTIVE`, "auto" (multi-worker: the runtime
    # chooses), or "" when unknown.
    in_use: str = ""
    missing: str = ""  # why this TensorFlow's all-reduce cannot be read or swapped


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a strategy keeps its all-reduce: `get()` it, `set()` one `get` gave, `make(name)`."""

    get: Callable[[], Any]
    set: Callable[[Any], None]
    make: Callable[[str], Any]


def mirrored_ops() -> dict[str, type]:
    """The "mirrored" `all_reduce=` names -> TensorFlow's ops classes, subclasses first."""
    import tensorflow as tf

    return {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
    }


def _moved(what: str) -> str:
    import tensorflow as tf

    return (
        f"TensorFlow {tf.__version__} keeps {what} elsewhere than TensorFlow "
        f"{CHECKED_TF[0]}.{CHECKED_TF[1]} (tfgpu/_internal/adapters/all_reduce.py)"
    )


def kind_of(strategy: Any) -> str:
    """`"mirrored"`, `"multi_worker"`, or "" for any other strategy (public types only)."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    return ""


def reach(strategy: Any) -> Slot | None:
    """The one reach into TensorFlow's privates: where `strategy` keeps its all-reduce, or None.
    Mirrored: `extended._cross_device_ops`, read at every reduce (a step traced after a swap uses
    the new one). Multi-worker: `_communication_options` and two `CollectiveAllReduce`s whose
    launchers, which the optimizer's all-reduce uses, keep their options: a swap builds new ones."""
    kind = kind_of(strategy)
    extended: Any = getattr(strategy, "extended", None)
    if kind == "mirrored":
        if not hasattr(extended, "_cross_device_ops"):
            return None
        return Slot(
            get=lambda: extended._cross_device_ops,
            set=lambda value: setattr(extended, "_cross_device_ops", value),
            make=lambda name: mirrored_ops()[name](),
        )
    if kind == "multi_worker":
        names = ("_communication_options", "_cross_device_ops", "_host_cross_device_ops")
        launchers = [getattr(extended, n, None) for n in names[1:]]  # the two CollectiveAllReduce
        held = ("_devices", "_group_size", "_collective_keys")
        if not hasattr(extended, names[0]) or not all(
            hasattr(o, a) for o in launchers for a in held
        ):
            return None

        def get_multi() -> Any:
            return tuple(getattr(extended, n) for n in names)

        def set_multi(value: Any) -> None:
            for n, v in zip(names, value, strict=True):
                setattr(extended, n, v)

        def make_multi(name: str) -> Any:
            import tensorflow as tf

            old = extended._communication_options
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=old.bytes_per_pack,
                timeout_seconds=old.timeout_seconds,
                implementation=getattr(
                    tf.distribute.experimental.CommunicationImplementation, name.upper()
                ),
            )

            def like(o: Any) -> Any:
                return type(o)(
                    devices=o._devices,
                    group_size=o._group_size,
                    options=options,
                    collective_keys=o._collective_keys,
                    canonicalize_devices=getattr(o, "_canonicalize_devices", True),
                )

            return (options, *(like(o) for o in launchers))

        return Slot(get=get_multi, set=set_multi, make=make_multi)
    return None


def _name(kind: str, value: Any) -> str:
    """The `tfgpu.strategy` name of a value `Slot.get` returned ("" when none fits)."""
    if kind == "multi_worker":
        implementation = getattr(value[0], "implementation", None)
        return str(getattr(implementation, "name", "")).lower()
    for name, cls in mirrored_ops().items():
        if isinstance(value, cls):
            return name
    return COLLECTIVE if type(value).__name__ == "CollectiveAllReduce" else ""


def describe(strategy: Any) -> AllReduce:
    """How `strategy` sums its replicas' gradients, as facts (never raises for a strategy)."""
    kind = kind_of(strategy)
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    if not kind or replicas <= 1:
        return AllReduce(replicas=replicas)
    devices = tuple(getattr(strategy.extended, "worker_devices", ()) or ())
    on_gpus = bool(devices) and all("GPU" in d.upper() for d in devices)
    workers = max(1, replicas // max(1, len(devices)))
    slot = reach(strategy)
    if slot is None:
        what = "a strategy's all-reduce" if kind == "mirrored" else "its communication options"
        return AllReduce(kind, replicas, workers, on_gpus, missing=_moved(what))
    return AllReduce(kind, replicas, workers, on_gpus, in_use=_name(kind, slot.get()))


@contextlib.contextmanager
def kept(strategy: Any) -> Iterator[None]:
    """Runs the body, then puts `strategy`'s all-reduce back (also on an exception), if any."""
    slot = reach(strategy)
    saved = None if slot is None else slot.get()
    try:
        yield
    finally:
        if slot is not None:
            slot.set(saved)


@contextlib.contextmanager
def using(strategy: Any, name: str) -> Iterator[None]:
    """Runs the body with `strategy` summing gradients by `name` (a step traced in it keeps it),
    then the old one back; ValueError where TensorFlow keeps it elsewhere, or an unknown `name`."""
    kind = kind_of(strategy)
    slot = reach(strategy)
    if slot is None:
        raise ValueError(describe(strategy).missing or "this strategy has no all-reduce to choose")
    allowed = MULTI_WORKER if kind == "multi_worker" else MIRRORED
    if name not in allowed:
        raise invalid_value("name", name, f"one of: {', '.join(map(repr, allowed))}")
    value = slot.make(name)
    with kept(strategy):
        slot.set(value)
        yield
