"""Pure readings of the facts dict `_gather` fills, for the checks and the text: sections
(missing or malformed ones read empty), versions, compute capabilities, visible GPUs."""

from __future__ import annotations

import re
import types
from typing import Any

from tfgpu._internal.helpers.cluster import TFConfigError, parse_tf_config
from tfgpu.monitor.nvml import visible_gpus

# Variables that change how TensorFlow, CUDA or Keras behave, shown in the report when set.
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR",
    "TF_CONFIG", "TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT", "XLA_FLAGS", "TF_XLA_FLAGS",
    "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC", "TF_USE_LEGACY_KERAS", "KERAS_BACKEND",
    "CUDA_CACHE_MAXSIZE", "CUDA_CACHE_DISABLE", "OMP_NUM_THREADS", "LD_LIBRARY_PATH",
)  # fmt: skip


def section(facts: dict[str, Any], name: str) -> dict[str, Any]:
    """The section `name` of `facts`, or `{}` when it is missing or not a dict."""
    value = facts.get(name)
    return value if isinstance(value, dict) else {}


def nvml_gpu_facts(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs NVML lists (all of them, whatever CUDA_VISIBLE_DEVICES says), or `[]`."""
    nvml = section(facts, "nvml")
    return list(nvml.get("gpus") or []) if nvml.get("available") else []


def tf_gpu_facts(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs TensorFlow lists, or `[]`."""
    return list(section(facts, "tensorflow").get("gpus") or [])


def env_value(facts: dict[str, Any], name: str) -> str | None:
    """The value of environment variable `name` when the facts were read, or None."""
    return section(facts, "env").get(name)


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'12.5.1' -> (12, 5, 1); None or unparsable -> None."""
    if not text:
        return None
    m = re.match(r"^\s*(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def parse_arch(entry: str) -> tuple[str, tuple[int, int]] | None:
    """'sm_80' -> ('sm', (8, 0)); 'compute_90' -> ('compute', (9, 0)); '8.6' -> ('sm', (8, 6))."""
    entry = str(entry).strip().lower()
    if m := re.fullmatch(r"(sm|compute)_(\d+)(\d)[a-z]?", entry):  # the last digit: the minor
        return m.group(1), (int(m.group(2)), int(m.group(3)))
    if m := re.fullmatch(r"(\d+)\.(\d+)", entry):
        return "sm", (int(m.group(1)), int(m.group(2)))
    return None


def cc_support(cc: tuple[int, int], compiled: list[str]) -> tuple[str, str | None]:
    """How TensorFlow runs on a GPU of compute capability `cc`: ("native", "sm_80") from a
    binary (sm_XY runs on every X.Z, Z >= Y), ("ptx", "compute_90") from PTX of an equal or
    older architecture JIT-compiled by the driver, else ("unsupported", None)."""
    archs = [a for a in (parse_arch(e) for e in compiled) if a]
    sass = [c for kind, c in archs if kind == "sm" and c[0] == cc[0] and c[1] <= cc[1]]
    if sass:
        return "native", "sm_{}{}".format(*max(sass))
    ptx = [c for kind, c in archs if kind == "compute" and c <= cc]
    if ptx:
        return "ptx", "compute_{}{}".format(*max(ptx))
    return "unsupported", None


def visible_gpu_count(cuda_visible_devices: str | None, gpus: list[dict[str, Any]]) -> int:
    """How many of the GPUs NVML lists survive `CUDA_VISIBLE_DEVICES`, by CUDA's rules
    (`tfgpu.monitor.nvml.visible_gpus`: `""`, `"-1"` or `"none"` hide all)."""
    ids = [
        types.SimpleNamespace(
            uuid=str(g.get("uuid") or ""), pci_bus_id=str(g.get("pci_bus_id") or "")
        )
        for g in gpus
    ]
    return len(visible_gpus(ids, cuda_visible_devices))


def tf_config_problem(raw: str) -> str | None:
    """What is wrong with a TF_CONFIG value, or None if TensorFlow can use it (pure)."""
    try:
        parse_tf_config(raw, strict=False)
    except TFConfigError as e:
        return e.problem
    return None


def cc_str(cc: Any) -> str:
    """(8, 6) -> '8.6'; None -> 'unknown'."""
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"
