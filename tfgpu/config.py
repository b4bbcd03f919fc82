"""`tfgpu.configure()`: memory, GPUs, precision and determinism, set once before training; a
pure `_plan(facts, wishes)` makes every decision, `_apply(plan)` calls `tf.config` and Keras."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tfgpu._internal.helpers.checks import conflicting, invalid_type, invalid_value, is_int
from tfgpu.precision import choose_policy, has_tensor_cores, supports_bfloat16

__all__ = ["Configuration", "configure"]

_PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
_ASYNC = "cuda_malloc_async"


@dataclass(frozen=True)
class Configuration:
    """What `tfgpu.configure()` decided and applied. Print it for a readable summary.

    Args:
        precision: str, the Keras global precision policy now in effect.
        precision_reason: str, why this policy.
        gpus: tuple of str, the GPUs TensorFlow will use (`"GPU:0 NVIDIA A100 (cc 8.0)"`).
        memory_growth: bool or None, memory growth on every used GPU; None: not set.
        memory_limit_mib: int or None, the memory limit per GPU in MiB.
        cpu_devices: int or None, the number of logical CPU devices, if split.
        deterministic: bool, whether op determinism was enabled.
        seed: int or None, the seed given to Python, NumPy, TensorFlow and Keras.
        async_allocator: bool, whether `TF_GPU_ALLOCATOR=cuda_malloc_async` is in effect.
        notes: tuple of str, caveats: settings without effect here, and why.
    """

    precision: str
    precision_reason: str
    gpus: tuple[str, ...] = ()
    memory_growth: bool | None = None
    memory_limit_mib: int | None = None
    cpu_devices: int | None = None
    deterministic: bool = False
    seed: int | None = None
    async_allocator: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """Returns the record as a JSON-safe dict (tuples become lists)."""
        return {**asdict(self), "gpus": list(self.gpus), "notes": list(self.notes)}

    def __str__(self) -> str:
        if self.memory_limit_mib is not None:
            memory = f"limit {self.memory_limit_mib} MiB per GPU"
        elif not self.gpus:
            memory = "n/a (no GPU)"
        elif self.memory_growth is None:
            memory = "TensorFlow default"
        else:
            memory = "growth on every GPU" if self.memory_growth else "whole GPU reserved at start"
        seeded = f"seed {self.seed}" if self.seed is not None else "not seeded"
        rows = [
            ("GPUs", ", ".join(self.gpus) or "none (TensorFlow runs on the CPU)"),
            ("memory", memory),
            ("precision", f"{self.precision} ({self.precision_reason})"),
            ("determinism", f"{'on' if self.deterministic else 'off'}, {seeded}"),
            ("allocator", _ASYNC if self.async_allocator else "TensorFlow default (BFC)"),
        ]
        if self.cpu_devices is not None:
            rows.append(("CPU devices", str(self.cpu_devices)))
        lines = ["tfgpu configuration", *(f"  {k:<12} {v}" for k, v in rows)]
        if self.notes:
            lines += ["  notes", *(f"    - {n}" for n in self.notes)]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Gpu:
    name: str  # e.g. "/physical_device:GPU:0"
    device_name: str | None = None  # e.g. "NVIDIA A100-SXM4-80GB"
    compute_capability: tuple[int, int] | None = None

    def label(self) -> str:
        short = self.name.replace("/physical_device:", "")
        cc = self.compute_capability
        cc_text = f"cc {cc[0]}.{cc[1]}" if cc else "cc unknown"
        return f"{short} {self.device_name or 'unknown GPU'} ({cc_text})"


@dataclass(frozen=True)
class _Facts:
    gpus: tuple[_Gpu, ...] = ()
    runtime_initialized: bool | None = False
    env: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Wishes:
    """`configure()`'s arguments, by name (checked and normalized by `_validate`)."""

    memory_growth: bool | None = None
    memory_limit_mib: int | None = None
    gpus: tuple[int, ...] | None = None
    precision: str = "auto"
    deterministic: bool = False
    seed: int | None = None
    async_allocator: bool = False
    cpu_devices: int | None = None


@dataclass(frozen=True)
class _Plan:
    """The record `configure()` returns (memory growth None: not touched), and what else to apply."""

    configuration: Configuration
    visible_gpus: tuple[int, ...] | None  # indices into facts.gpus; None: leave as is
    set_async_allocator: bool  # set TF_GPU_ALLOCATOR in os.environ


def _validate(w: _Wishes) -> _Wishes:
    """Raises TypeError or ValueError for an argument of `configure()`; returns them normalized."""
    if w.memory_growth is not None and not isinstance(w.memory_growth, bool):
        raise invalid_type("memory_growth", w.memory_growth, "a bool or None")
    if w.memory_limit_mib is not None:
        if not is_int(w.memory_limit_mib):
            raise invalid_type("memory_limit_mib", w.memory_limit_mib, "an int (MiB) or None")
        if w.memory_limit_mib <= 0:
            raise invalid_value("memory_limit_mib", w.memory_limit_mib, "a positive number of MiB")
        if w.memory_growth:
            raise conflicting(
                f"memory_growth={w.memory_growth!r}",
                f"memory_limit_mib={w.memory_limit_mib!r}",
                "Choose memory growth (the default) or a fixed memory limit per GPU, not both.",
            )
    if w.gpus is not None:
        expected = "a list of GPU indices (ints), e.g. [0, 1], or None"
        if isinstance(w.gpus, str | bytes) or not isinstance(w.gpus, Sequence):
            raise invalid_type("gpus", w.gpus, expected)
        for index in w.gpus:
            if not is_int(index):
                raise invalid_type("gpus", w.gpus, expected)
            if index < 0:
                raise invalid_value("gpus", list(w.gpus), "GPU indices >= 0")
        if len(set(w.gpus)) != len(w.gpus):
            raise invalid_value("gpus", list(w.gpus), "each GPU index at most once")
    one_of = f"one of: {', '.join(map(repr, _PRECISIONS))}"
    if not isinstance(w.precision, str):
        raise invalid_type("precision", w.precision, one_of)
    if w.precision not in _PRECISIONS:
        raise invalid_value("precision", w.precision, one_of)
    if not isinstance(w.deterministic, bool):
        raise invalid_type("deterministic", w.deterministic, "a bool")
    if w.seed is not None:
        if not is_int(w.seed):
            raise invalid_type("seed", w.seed, "an int or None")
        if not 0 <= w.seed < 2**32:
            raise invalid_value("seed", w.seed, "an int in [0, 2**32 - 1]")
    if not isinstance(w.async_allocator, bool):
        raise invalid_type("async_allocator", w.async_allocator, "a bool")
    if w.cpu_devices is not None:
        if not is_int(w.cpu_devices):
            raise invalid_type("cpu_devices", w.cpu_devices, "an int or None")
        if w.cpu_devices < 1:
            raise invalid_value("cpu_devices", w.cpu_devices, "an int >= 1")
    return replace(
        w,
        memory_limit_mib=None if w.memory_limit_mib is None else int(w.memory_limit_mib),
        gpus=None if w.gpus is None else tuple(int(g) for g in w.gpus),
        seed=None if w.seed is None else int(w.seed),
    )


def _plan(facts: _Facts, wishes: _Wishes) -> _Plan:
    """Turns device facts and validated wishes into what to apply (pure; raises ValueError)."""
    used = _used_gpus(facts, wishes)
    growth, memory_note = _memory_growth(facts, wishes, used)
    policy, reason, precision_note = _precision(wishes, used)
    # Determinism needs a seed: random ops without one raise once it is on.
    seed, seed_note = wishes.seed, ""
    if wishes.deterministic and seed is None:
        seed, seed_note = 0, "deterministic=True without a seed: using seed=0."
    set_env, effective, allocator_note = _async_allocator(facts, wishes, used)
    configuration = Configuration(
        precision=policy,
        precision_reason=reason,
        gpus=tuple(g.label() for g in used),
        memory_growth=growth,
        memory_limit_mib=wishes.memory_limit_mib if used else None,
        cpu_devices=wishes.cpu_devices,
        deterministic=wishes.deterministic,
        seed=seed,
        async_allocator=effective,
        notes=tuple(n for n in (memory_note, precision_note, seed_note, allocator_note) if n),
    )
    return _Plan(configuration, visible_gpus=wishes.gpus, set_async_allocator=set_env)


def _used_gpus(facts: _Facts, wishes: _Wishes) -> tuple[_Gpu, ...]:
    """The GPUs asked for (all by default); ValueError for an index TensorFlow does not see."""
    if wishes.gpus is None:
        return facts.gpus
    n = len(facts.gpus)
    if any(i >= n for i in wishes.gpus):
        expected = (
            f"indices of the GPUs TensorFlow sees: 0 to {n - 1} ({n} GPU(s))"
            if n
            else "None or [] (TensorFlow sees no GPU here)"
        )
        raise invalid_value("gpus", list(wishes.gpus), expected)
    return tuple(facts.gpus[i] for i in wishes.gpus)


def _memory_growth(
    facts: _Facts, wishes: _Wishes, used: tuple[_Gpu, ...]
) -> tuple[bool | None, str]:
    """Memory growth (None: not set), the default unless a limit replaces it, with a note
    when the limit has no effect or TF_FORCE_GPU_ALLOW_GROWTH overrides it ("": none)."""
    if wishes.memory_limit_mib is not None:
        return None, "" if used else "memory_limit_mib has no effect: no GPU is used."
    if not used:
        return None, ""
    growth = True if wishes.memory_growth is None else wishes.memory_growth
    forced = facts.env.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if forced in ("true", "false") and growth != (forced == "true"):
        return growth, (
            f"TF_FORCE_GPU_ALLOW_GROWTH={forced} overrides memory_growth={growth}: "
            "unset the variable to let configure() decide."
        )
    return growth, ""


def _precision(wishes: _Wishes, used: tuple[_Gpu, ...]) -> tuple[str, str, str]:
    """The policy and why, with a note when the one requested is slow here ("": none)."""
    if wishes.precision == "auto":
        ccs = [g.compute_capability for g in used]
        if any(cc is None for cc in ccs):
            return "float32", "the compute capability of a GPU is unknown", ""
        choice = choose_policy([cc for cc in ccs if cc is not None])
        return choice.policy, choice.reason, ""
    policy = wishes.precision
    known = [g.compute_capability for g in used if g.compute_capability]
    note = ""
    if policy != "float32" and not used:
        note = (
            f"{policy} on the CPU is slower than float32 (no tensor cores); "
            'precision="auto" would choose float32.'
        )
    elif policy == "mixed_bfloat16" and not all(supports_bfloat16(cc) for cc in known):
        note = (
            "mixed_bfloat16 on GPUs with compute capability < 8.0 has no bfloat16 tensor "
            "cores: it is slow there; mixed_float16 fits them."
        )
    elif policy == "mixed_float16" and not all(has_tensor_cores(cc) for cc in known):
        note = (
            "mixed_float16 on GPUs without tensor cores (compute capability < 7.0) is "
            "slower than float32."
        )
    return policy, "requested", note


def _async_allocator(
    facts: _Facts, wishes: _Wishes, used: tuple[_Gpu, ...]
) -> tuple[bool, bool, str]:
    """Whether to set TF_GPU_ALLOCATOR (read when the GPUs initialize), whether the async
    allocator is in effect, and a note when the wish has no effect or replaces a setting."""
    current = facts.env.get("TF_GPU_ALLOCATOR")
    if not wishes.async_allocator:
        return False, current == _ASYNC, ""  # in effect when the environment chose it
    if facts.runtime_initialized and current != _ASYNC:
        late = (
            "async_allocator not applied: TensorFlow already initialized its GPUs; set "
            "TF_GPU_ALLOCATOR=cuda_malloc_async before starting Python, or call "
            "tfgpu.configure() first."
        )
        return False, False, late
    if not used:
        return True, True, "async_allocator has no effect: no GPU is used."
    if current not in (None, _ASYNC):
        return True, True, f"TF_GPU_ALLOCATOR={current} replaced by {_ASYNC}."
    return True, True, ""


def _read_facts() -> _Facts:
    import tensorflow as tf  # noqa: F401  (loaded, so that devices reads its devices)

    from tfgpu._internal.adapters import devices

    gpus = [_Gpu(g.tf_name, g.device_name, g.compute_capability) for g in devices.physical_gpus()]
    env = {k: os.environ.get(k) for k in ("TF_GPU_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH")}
    return _Facts(gpus=tuple(gpus), runtime_initialized=devices.tf_runtime_initialized(), env=env)


def _apply(plan: _Plan) -> Configuration:
    """Applies `plan` with tf.config and Keras. Device settings first: if TensorFlow refuses
    them (its runtime already started), nothing else is changed and RuntimeError names them."""
    import keras
    import tensorflow as tf

    c = plan.configuration
    failed: list[str] = []
    physical = tf.config.list_physical_devices("GPU")
    if plan.visible_gpus is not None:
        try:
            tf.config.set_visible_devices([physical[i] for i in plan.visible_gpus], "GPU")
        except RuntimeError:
            failed.append(f"gpus={list(plan.visible_gpus)}")
    used = [physical[i] for i in plan.visible_gpus] if plan.visible_gpus is not None else physical
    if c.memory_limit_mib is not None:
        config = [tf.config.LogicalDeviceConfiguration(memory_limit=c.memory_limit_mib)]
        try:
            for device in used:
                tf.config.set_logical_device_configuration(device, config)
        except RuntimeError:
            failed.append(f"memory_limit_mib={c.memory_limit_mib}")
    elif c.memory_growth is not None:
        try:
            for device in physical:  # TensorFlow wants the same growth on every GPU
                tf.config.experimental.set_memory_growth(device, c.memory_growth)
        except RuntimeError:
            failed.append(f"memory_growth={c.memory_growth}")
    if c.cpu_devices is not None:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(c.cpu_devices)]
            )
        except RuntimeError:
            failed.append(f"cpu_devices={c.cpu_devices}")
    if failed:
        raise RuntimeError(
            f"tfgpu.configure() could not apply {', '.join(failed)}: TensorFlow already "
            "initialized its devices in this process. Call tfgpu.configure() before building "
            "any tensor or model (first thing after the imports). Settings that are already in "
            "effect can be requested again."
        )

    if plan.set_async_allocator:
        os.environ["TF_GPU_ALLOCATOR"] = _ASYNC
    keras.mixed_precision.set_global_policy(c.precision)
    if c.seed is not None:
        keras.utils.set_random_seed(c.seed)
    if c.deterministic:
        tf.config.experimental.enable_op_determinism()
    elif _op_determinism_enabled():
        stays_on = (
            "op determinism stays on: an earlier call enabled it, and TensorFlow has no public "
            "way to turn it off in a running process (start a new process to turn it off)."
        )
        c = replace(c, deterministic=True, notes=(*c.notes, stays_on))
    return c


def _op_determinism_enabled() -> bool:
    """Whether TensorFlow's op determinism is on in this process (False if it cannot tell)."""
    try:
        from tensorflow.python.framework import config as tf_config

        return bool(tf_config.is_op_determinism_enabled())
    except (ImportError, AttributeError):  # a TensorFlow without this private function
        return False


_last: tuple[_Wishes, Configuration] | None = None


def configure(
    *,
    memory_growth: bool | None = None,
    memory_limit_mib: int | None = None,
    gpus: Sequence[int] | None = None,
    precision: str = "auto",
    deterministic: bool = False,
    seed: int | None = None,
    async_allocator: bool = False,
    cpu_devices: int | None = None,
) -> Configuration:
    """Sets up TensorFlow's devices, memory, precision and determinism. Call it first.

    Run it before any tensor or model exists: TensorFlow fixes its devices when its runtime
    starts. Calling it again with the same arguments does nothing. The guide: docs/setup.md,
    "Configure TensorFlow".

    Args:
        memory_growth: bool or None, allocate GPU memory as needed. Defaults to `None`: True
            unless `memory_limit_mib` is given.
        memory_limit_mib: int or None, a fixed memory limit per GPU in MiB. Defaults to `None`.
        gpus: list of int or None, the GPUs to use (`[]`: the CPU). Defaults to `None`: all.
        precision: str, the Keras global policy, or `"auto"`. Defaults to `"auto"`.
        deterministic: bool, op determinism, seeded (`seed`, or 0). Defaults to `False`.
        seed: int or None, `keras.utils.set_random_seed(seed)`. Defaults to `None`.
        async_allocator: bool, `TF_GPU_ALLOCATOR=cuda_malloc_async`. Defaults to `False`.
        cpu_devices: int or None, this many logical CPU devices. Defaults to `None`.

    Returns:
        `Configuration`, the record of what was decided and applied; print it to read it.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: for a value out of range, an unknown GPU index, or growth with a limit.
        RuntimeError: if a device setting differs from what TensorFlow already initialized.

    Example:

    >>> cfg = tfgpu.configure(seed=42)  # doctest: +SKIP
    >>> print(cfg)  # doctest: +SKIP
    tfgpu configuration
      GPUs         GPU:0 NVIDIA A100-SXM4-80GB (cc 8.0)
      precision    mixed_bfloat16 (every GPU has compute capability >= 8.0 (8.0): ...)
      ...
    """
    global _last
    wishes = _validate(_Wishes(**locals()))  # every argument, by name
    if _last is not None and _last[0] == wishes:
        return _last[1]
    configuration = _apply(_plan(_read_facts(), wishes))
    _last = (wishes, configuration)
    return configuration
