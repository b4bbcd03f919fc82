"""Checks about the driver, TensorFlow's CUDA build and the GPUs, with the pure rules they
apply: each `check_*` takes the facts and yields findings, in the order of `_findings.CHECKS`."""

from __future__ import annotations

import math
import re
import types
from collections.abc import Iterator
from typing import Any

from tfgpu.env._facts import cc_str, env_value, nvml_gpu_facts, section, tf_gpu_facts, version_tuple
from tfgpu.env._result import AND_CUDA, Finding
from tfgpu.monitor.nvml import visible_gpus


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


def check_driver(facts: dict[str, Any]) -> Iterator[Finding]:
    nvml = section(facts, "nvml")
    if nvml.get("available"):
        return
    # The monitor's error ends with the driver hint; the fix below says it already.
    reason = str(nvml.get("error") or "NVML is unavailable").split(" NVML ships with")[0]
    reason = reason.rstrip(". ")
    if tf_gpu_facts(facts):
        yield Finding(
            "info",
            "nvml-unavailable",
            f"TensorFlow sees GPUs but NVML cannot be read ({reason}): GPU monitoring "
            "(utilization, memory, power) will record NaN.",
            "NVML (libnvidia-ml.so) ships with the NVIDIA driver: make it visible to this "
            "process (in a container, run with --gpus all or NVIDIA_DRIVER_CAPABILITIES="
            "compute,utility), and pip install nvidia-ml-py.",
        )
    else:
        yield Finding(
            "warning",
            "no-nvidia-driver",
            f"No NVIDIA driver found ({reason}): TensorFlow will run on the CPU.",
            "On a machine with an NVIDIA GPU, install the NVIDIA driver (it ships NVML) and "
            "check with `nvidia-smi`; in a container, run it with `--gpus all` (NVIDIA "
            "Container Toolkit). On a machine without a GPU there is nothing to do.",
        )


def check_cuda_build(facts: dict[str, Any]) -> Iterator[Finding]:
    tf = section(facts, "tensorflow")
    if not tf.get("importable") or tf.get("is_cuda_build") or tf.get("is_rocm_build"):
        return
    nvml_gpus = nvml_gpu_facts(facts)
    if nvml_gpus:
        yield Finding(
            "error",
            "tf-not-cuda-build",
            f"TensorFlow {tf.get('version')} is not a CUDA build, so it cannot use the "
            f"{len(nvml_gpus)} NVIDIA GPU(s) the driver sees.",
            f"{AND_CUDA} (Linux or WSL2) in place of the CPU-only TensorFlow "
            "(pip uninstall tensorflow-cpu, if installed).",
        )
    else:
        yield Finding(
            "info",
            "tf-not-cuda-build",
            f"TensorFlow {tf.get('version')} is a CPU-only build.",
            f"Nothing to do on a machine without a GPU; on a GPU machine, {AND_CUDA}.",
        )


def check_cuda_visible_devices(facts: dict[str, Any]) -> Iterator[Finding]:
    value = env_value(facts, "CUDA_VISIBLE_DEVICES")
    if value is None:
        return
    nvml_gpus = nvml_gpu_facts(facts)
    if nvml_gpus and visible_gpu_count(value, nvml_gpus) == 0:
        yield Finding(
            "error",
            "cuda-visible-devices-hides-all",
            f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU from TensorFlow (the "
            f"driver sees {len(nvml_gpus)}).",
            "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use by index or UUID, "
            "e.g. CUDA_VISIBLE_DEVICES=0,1 (see `nvidia-smi -L`).",
        )
    elif not nvml_gpus and value.strip() in ("", "-1", "none", "None"):
        yield Finding(
            "info",
            "cuda-visible-devices-hides-all",
            f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU: TensorFlow runs on the CPU.",
            "unset CUDA_VISIBLE_DEVICES if you meant to use a GPU.",
        )


def _all_gpu_ccs(facts: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    """(name, cc) of every distinct GPU model known from NVML or TensorFlow."""
    seen: dict[tuple[str, tuple[int, int]], None] = {}
    for g in nvml_gpu_facts(facts):
        if g.get("compute_capability"):
            seen[(str(g.get("name")), tuple(g["compute_capability"]))] = None
    for g in tf_gpu_facts(facts):
        if g.get("compute_capability"):
            key = (str(g.get("device_name") or g.get("name")), tuple(g["compute_capability"]))
            if key[1] not in {cc for _, cc in seen}:
                seen[key] = None
    return list(seen)  # type: ignore[arg-type]


def check_tf_sees_no_gpu(facts: dict[str, Any]) -> Iterator[Finding]:
    tf = section(facts, "tensorflow")
    nvml_gpus = nvml_gpu_facts(facts)
    if not tf.get("importable") or not tf.get("is_cuda_build") or not nvml_gpus:
        return
    visible = visible_gpu_count(env_value(facts, "CUDA_VISIBLE_DEVICES"), nvml_gpus)
    tf_count = len(tf_gpu_facts(facts))
    if visible == 0:
        return  # CUDA_VISIBLE_DEVICES explains it: its own finding
    if tf_count == 0:
        compiled = tf.get("cuda_compute_capabilities") or []
        ccs = [tuple(g["compute_capability"]) for g in nvml_gpus if g.get("compute_capability")]
        if compiled and ccs and all(cc_support(cc, compiled)[0] == "unsupported" for cc in ccs):
            return  # the compute-capability finding explains it
        yield Finding(
            "error",
            "tf-sees-no-gpu",
            f"The NVIDIA driver sees {len(nvml_gpus)} GPU(s) but TensorFlow sees none: "
            "TensorFlow could not load the CUDA libraries (cudart, cuBLAS, cuDNN) it was "
            f"built against (CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}).",
            f"{AND_CUDA} (installs TensorFlow's CUDA and cuDNN libraries as pip packages). "
            "To see TensorFlow's own reason, run with TF_CPP_MIN_LOG_LEVEL=0.",
        )
    elif tf_count < visible:
        yield Finding(
            "warning",
            "tf-sees-fewer-gpus",
            f"TensorFlow sees {tf_count} GPU(s) of the {visible} visible to this process.",
            "Run with TF_CPP_MIN_LOG_LEVEL=0 and look for 'Ignoring visible gpu device': "
            "usually a compute capability TensorFlow was not built for.",
        )


def check_compute_capability(facts: dict[str, Any]) -> Iterator[Finding]:
    tf = section(facts, "tensorflow")
    compiled = tf.get("cuda_compute_capabilities") or []
    if not tf.get("is_cuda_build") or not compiled:
        return
    built = " ".join(compiled)
    for name, cc in _all_gpu_ccs(facts):
        kind, arch = cc_support(cc, compiled)
        if kind == "ptx":
            yield Finding(
                "info",
                "compute-capability-ptx",
                f"{name} (compute capability {cc_str(cc)}) has no compiled kernels in "
                f"TensorFlow {tf.get('version')} (built for {built}); the driver "
                f"JIT-compiles the {arch} PTX for it.",
                "It works, but the first start compiles every kernel, which can take many "
                "minutes; keep the JIT cache (do not set CUDA_CACHE_DISABLE, raise "
                "CUDA_CACHE_MAXSIZE, e.g. to 4294967296) or use a TensorFlow built for "
                f"sm_{cc[0]}{cc[1]}.",
            )
        elif kind == "unsupported":
            yield Finding(
                "error",
                "compute-capability-unsupported",
                f"{name} (compute capability {cc_str(cc)}) is not among those TensorFlow "
                f"{tf.get('version')} was built for ({built}), and no PTX covers it: "
                "TensorFlow will not use it.",
                "Use a TensorFlow release built for this GPU (older releases support older "
                "GPUs, e.g. tensorflow<2.16 for compute capability 5.x), or build "
                f"TensorFlow from source with TF_CUDA_COMPUTE_CAPABILITIES={cc_str(cc)}.",
            )


def check_driver_cuda_version(facts: dict[str, Any]) -> Iterator[Finding]:
    tf = section(facts, "tensorflow")
    nvml = section(facts, "nvml")
    built = version_tuple(tf.get("cuda_version"))
    driver = version_tuple(nvml.get("cuda_driver_version"))
    if not tf.get("is_cuda_build") or not nvml.get("available") or not built or not driver:
        return
    if driver[:2] >= built[:2]:
        return
    older = (
        f"The driver supports CUDA {nvml.get('cuda_driver_version')} (driver "
        f"{nvml.get('driver_version')}), older than the CUDA {tf.get('cuda_version')} "
        "TensorFlow was built with"
    )
    fix = (
        f"Update the NVIDIA driver to one supporting CUDA {tf.get('cuda_version')} or newer "
        "(see the CUDA release notes' driver table), or install a TensorFlow built for the "
        f"driver's CUDA {nvml.get('cuda_driver_version')}."
    )
    if driver[0] < built[0]:
        yield Finding("error", "driver-too-old", f"{older}: TensorFlow cannot use the GPUs.", fix)
    else:
        yield Finding(
            "warning",
            "driver-older-than-build",
            f"{older}. CUDA's minor-version compatibility lets it run, but PTX JIT compilation "
            "and some newer features will fail.",
            fix,
        )


def check_gpu_busy(facts: dict[str, Any]) -> Iterator[Finding]:
    if section(facts, "tensorflow").get("runtime_initialized"):
        return  # the memory in use may be this process's own
    for g in nvml_gpu_facts(facts):
        total = g.get("memory_total_mib") or 0
        used = g.get("memory_used_mib") or 0
        util = g.get("utilization_pct")
        busy_util = isinstance(util, int | float) and math.isfinite(util) and util >= 50
        if (total and used / total >= 0.25) or busy_util:
            util_text = f"{util:.0f}%" if busy_util else "n/a"
            yield Finding(
                "warning",
                "gpu-busy",
                f"GPU {g.get('index')} ({g.get('name')}) is already in use: {used:.0f} of "
                f"{total:.0f} MiB used, utilization {util_text}.",
                "Another process shares this GPU, so training may run out of memory or "
                "slow down: see `nvidia-smi`, or pick a free GPU with CUDA_VISIBLE_DEVICES.",
            )


def check_mixed_gpus(facts: dict[str, Any]) -> Iterator[Finding]:
    names = {str(g.get("name")) for g in nvml_gpu_facts(facts)}
    if len(names) > 1:
        yield Finding(
            "info",
            "mixed-gpus",
            f"The GPUs are of different models ({', '.join(sorted(names))}).",
            "Data-parallel training runs at the pace of the slowest GPU; restrict training to "
            "one model with CUDA_VISIBLE_DEVICES or tfgpu.configure(gpus=[...]).",
        )
