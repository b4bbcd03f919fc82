"""Which GPU TensorFlow trains on and what NVML says of it: `/GPU:k`, CUDA's ordinals after
`CUDA_VISIBLE_DEVICES` and NVML's PCI-bus order differ once GPUs are reordered or hidden. Only the
peak memory imports TensorFlow; nothing here starts its runtime (`configure()` stays possible)."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tfgpu._internal.helpers.checks import invalid_type, invalid_value, is_int

if TYPE_CHECKING:
    from tfgpu.monitor.nvml import GpuInfo


@dataclasses.dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as `tf.config.list_physical_devices("GPU")` lists it, with its device details."""

    cuda_index: int  # its CUDA ordinal in this process (after `CUDA_VISIBLE_DEVICES`)
    tf_name: str  # e.g. "/physical_device:GPU:1"
    device_name: str | None  # e.g. "NVIDIA A100-SXM4-80GB"
    compute_capability: tuple[int, int] | None  # e.g. (8, 0)
    visible: bool  # whether TensorFlow uses it (not hidden by `set_visible_devices`)
    logical_devices: int  # the `/GPU:k` made of it (several: split in logical devices; 0: hidden)
    error: str | None = None  # why the device details could not be read


@dataclasses.dataclass(frozen=True)
class TfGpu:
    """`/GPU:{position}` and the physical GPU behind it (its `PhysicalGpu`'s fields are None where
    TensorFlow lists no GPU: the CUDA-visible GPUs stand in, as TensorFlow would number them)."""

    position: int
    cuda_index: int  # in this process; the `gpus=` numbering of `tfgpu.monitor.Sampler`
    tf_name: str | None
    # None without NVML, or where `CUDA_VISIBLE_DEVICES` names a GPU NVML cannot match (MIG).
    nvml: GpuInfo | None
    device_name: str | None = None
    tf_compute_capability: tuple[int, int] | None = None

    @property
    def nvml_index(self) -> int | None:
        """NVML's index of the GPU (PCI-bus order), or None without an NVML record."""
        return None if self.nvml is None else self.nvml.index

    @property
    def name(self) -> str | None:
        """The product name: NVML's, else TensorFlow's device details', else None."""
        return self.nvml.name if self.nvml is not None and self.nvml.name else self.device_name

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """TensorFlow's compute capability, else NVML's, else None."""
        if self.tf_compute_capability is not None:
            return self.tf_compute_capability
        return None if self.nvml is None else self.nvml.compute_capability

    @property
    def memory_total_bytes(self) -> int | None:
        """Installed memory from NVML (`nvidia-smi --query-gpu=memory.total`), or None."""
        return None if self.nvml is None else int(self.nvml.memory_total_mib * 2**20)


def tf_runtime_initialized() -> bool | None:
    """Whether TensorFlow's eager context exists already: False if not imported, None if unknown."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None
    except (ImportError, AttributeError):  # a TensorFlow that failed to import, a stub
        return None


def _tf_errors(tf: Any) -> tuple[type[Exception], ...]:
    """What TensorFlow's device queries raise where they cannot answer (a stub's too)."""
    op_error = getattr(getattr(tf, "errors", None), "OpError", RuntimeError)
    return (AttributeError, RuntimeError, ValueError, op_error)


def tf32_execution_enabled() -> bool:
    """Whether TensorFlow runs float32 matmuls in TF32 (its default where it is not loaded)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return True
    try:
        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    except _tf_errors(tf):  # a stub, a broken runtime
        return True


def physical_gpus() -> list[PhysicalGpu]:
    """Every GPU TensorFlow lists, used or hidden, in CUDA order; [] where it is not imported
    or cannot list them. Starts no runtime, never raises."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return []
    try:
        physical = list(tf.config.list_physical_devices("GPU"))
        visible = {d.name for d in tf.config.get_visible_devices("GPU")} if physical else set()
    except _tf_errors(tf):  # a TensorFlow without tf.config (a stub), a broken runtime
        return []
    gpus = []
    # TensorFlow lists physical GPUs by CUDA ordinal: "/physical_device:GPU:k" is CUDA's k.
    for cuda_index, device in enumerate(physical):
        details: dict[str, Any] = {}
        error = None
        try:
            details = dict(tf.config.experimental.get_device_details(device))
        except _tf_errors(tf) as e:
            error = f"{type(e).__name__}: {e}"
        name, cc = details.get("device_name"), details.get("compute_capability")
        capability = (int(cc[0]), int(cc[1])) if cc else None
        used = device.name in visible
        logical = 0
        if used:
            try:
                split = tf.config.get_logical_device_configuration(device)
            except _tf_errors(tf):  # a device TensorFlow does not know (a test's stand-in)
                split = None
            logical = len(split) if split else 1
        gpus.append(PhysicalGpu(cuda_index, device.name, name, capability, used, logical, error))
    return gpus


def _cuda_gpus() -> list[GpuInfo]:
    """NVML's records of the GPUs CUDA shows this process, in CUDA order ([] without NVML)."""
    try:
        from tfgpu.monitor.nvml import inventory, visible_gpus
    except ImportError:  # side feature: no NVML record, never a failure
        return []
    inv = inventory()  # never raises: NVML's failures come back as `available=False`
    if not inv.available:
        return []
    return visible_gpus(inv.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def tf_gpus() -> list[TfGpu]:
    """TensorFlow's `/GPU:k` (one per logical device) with their physical GPU and NVML record, else
    the CUDA-visible GPUs (`tf_name` None); starts no runtime, never raises. With
    CUDA_VISIBLE_DEVICES=2,0 and `configure(gpus=[1])`, `/GPU:0` is CUDA's 1 and NVML's 0."""
    return _tf_gpus(physical_gpus(), _cuda_gpus())


def _tf_gpus(physical: list[PhysicalGpu], cuda: list[GpuInfo]) -> list[TfGpu]:
    if not physical:
        return [TfGpu(k, k, None, gpu) for k, gpu in enumerate(cuda)]
    gpus: list[TfGpu] = []
    for p in physical:
        nvml = cuda[p.cuda_index] if p.cuda_index < len(cuda) else None
        for _ in range(p.logical_devices):
            gpus.append(
                TfGpu(len(gpus), p.cuda_index, p.tf_name, nvml, p.device_name, p.compute_capability)
            )
    return gpus


def gpu_record(k: int = 0) -> TfGpu | None:
    """TensorFlow's `/GPU:k` (see `tf_gpus`), or None where there is no such GPU."""
    gpus = tf_gpus()
    return gpus[k] if 0 <= k < len(gpus) else None


def reset_peak_memory(device: str) -> bool:
    """Resets TensorFlow's peak memory of `device` ("GPU:0"); False without allocator statistics."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(device)
        return True
    except (ValueError, tf.errors.OpError):  # a device without allocator statistics
        return False


def peak_memory(device: str) -> int | None:
    """TensorFlow's peak memory of `device` in bytes since its reset; None without statistics."""
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info(device)["peak"])
    except (ValueError, tf.errors.OpError):  # a device without allocator statistics
        return None


def nvml_indices() -> list[int]:
    """NVML indices of the GPUs TensorFlow uses, `/GPU:0`'s first, each once ([] without NVML)."""
    return list(dict.fromkeys(g.nvml_index for g in tf_gpus() if g.nvml_index is not None))


def cuda_indices(gpus: Sequence[int] | None = None) -> list[int] | None:
    """The CUDA ordinals (`Sampler`'s `gpus=` numbering) of TensorFlow's `/GPU:k` in `gpus` (None:
    all), each once; `gpus` itself where TensorFlow lists no GPU."""
    physical = physical_gpus()
    if not physical:
        return None if gpus is None else list(gpus)
    positions = [g.cuda_index for g in _tf_gpus(physical, [])]  # no NVML needed for CUDA's
    if gpus is None:
        return list(dict.fromkeys(positions))
    if not all(is_int(g) for g in gpus):
        raise invalid_type("gpus", list(gpus), "a list of int (TensorFlow's /GPU:k indices)")
    if not all(0 <= g < len(positions) for g in gpus):
        raise invalid_value(
            "gpus",
            list(gpus),
            f"indices below {len(positions)}: TensorFlow uses {len(positions)} GPU(s) "
            "(`tf.config.set_visible_devices` / `tfgpu.configure(gpus=...)`), and `gpus` "
            "numbers them as TensorFlow does (`/GPU:0` is 0)",
        )
    return list(dict.fromkeys(positions[g] for g in gpus))


def peak_precision(
    policy: str,
    compute_capabilities: Sequence[tuple[int, int] | None] | tuple[int, int] | None,
    tf32_enabled: bool | None = None,
) -> str | None:
    """The `peak_flops` precision a policy runs at: float32 is "tf32" with TF32 on (None: ask) and
    every cc >= 8.0; None without a rate ("float64"); `compute_capabilities`: a list, pair, None."""
    if policy in ("mixed_bfloat16", "bfloat16"):
        return "bfloat16"
    if policy in ("mixed_float16", "float16"):
        return "float16"
    if policy != "float32":
        return None
    ccs: Sequence[Any] = compute_capabilities or ()
    if len(ccs) == 2 and all(is_int(v) for v in ccs):  # one (major, minor) pair
        ccs = [ccs]
    if tf32_enabled is None:
        tf32_enabled = tf32_execution_enabled()
    ampere = bool(ccs) and all(cc is not None and (int(cc[0]), int(cc[1])) >= (8, 0) for cc in ccs)
    return "tf32" if tf32_enabled and ampere else "float32"
