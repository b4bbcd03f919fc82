"""Pure readings of the facts dict `_gather` fills, for the checks and the text: sections
(missing or malformed ones read empty), the GPUs each side lists, versions, TF_CONFIG."""

from __future__ import annotations

import re
from typing import Any

from tfgpu._internal.helpers.cluster import TFConfigError, parse_tf_config

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
