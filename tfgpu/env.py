"""Environment facts and findings: what `tfgpu env` prints and `tfgpu.environment()` returns.

The facts come from TensorFlow's build info and physical device list, NVML (through
`tfgpu.monitor.nvml`), the host and the environment variables that change TensorFlow's
behaviour. Reading them does not initialize TensorFlow's devices, so `tfgpu.configure()`
still works afterwards in the same process.

Each finding is decided by a pure function of the facts (`_check_*` below), so every branch
is testable without a GPU. A check that fails is reported, never raised: this is the command
people run when something is already broken.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfgpu import _devices
from tfgpu._cluster import TFConfigError, parse_tf_config
from tfgpu._json import json_safe
from tfgpu.monitor.nvml import visible_gpus

__all__ = ["EnvironmentReport", "Finding", "environment"]

# Variables that change how TensorFlow, CUDA or Keras behave, shown in the report when set.
_ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_GPU_ALLOCATOR",
    "TF_CONFIG",
    "TF_GPU_THREAD_MODE",
    "TF_GPU_THREAD_COUNT",
    "XLA_FLAGS",
    "TF_XLA_FLAGS",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_CPP_MAX_VLOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_USE_LEGACY_KERAS",
    "KERAS_BACKEND",
    "CUDA_CACHE_MAXSIZE",
    "CUDA_CACHE_DISABLE",
    "OMP_NUM_THREADS",
    "LD_LIBRARY_PATH",
)

_SEVERITIES = ("error", "warning", "info")
_AND_CUDA = 'pip install "tfgpu[and-cuda]"'


@dataclass(frozen=True)
class Finding:
    """One problem (or notable fact) about the environment, and how to fix it.

    Args:
        severity: str, `"error"` (GPU training will not work as intended), `"warning"`
            (it works, but slower or surprisingly) or `"info"`.
        code: str, a stable short identifier, e.g. `"tf-sees-no-gpu"`.
        message: str, what is wrong, with the facts that show it.
        fix: str, what to do about it.
    """

    severity: str
    code: str
    message: str
    fix: str


@dataclass
class EnvironmentReport:
    """Facts about TensorFlow, CUDA, the driver, the GPUs and the host, with findings.

    Print it for the human-readable report (`tfgpu env`), or call `to_dict()` for JSON
    (`tfgpu env --json`).

    Args:
        facts: dict, sections `tfgpu`, `python`, `os`, `host`, `tensorflow`, `keras`,
            `nvml`, `env` (see `docs/setup.md`).
        findings: list of `Finding`, errors first.

    Example:

    >>> report = tfgpu.environment()  # doctest: +SKIP
    >>> [f.code for f in report.findings if f.severity == "error"]  # doctest: +SKIP
    []
    """

    facts: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """bool, True when no finding has severity `"error"`."""
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as a JSON-safe dict (NaN becomes None, tuples become lists).

        Returns:
            dict with keys `"facts"` and `"findings"` (a list of dicts with `severity`,
            `code`, `message`, `fix`).
        """
        return json_safe(
            {"facts": self.facts, "findings": [dataclasses.asdict(f) for f in self.findings]}
        )

    def __str__(self) -> str:
        return _render(self)


# --------------------------------------------------------------------------------------------
# Facts (effects: imports and queries, each section guarded)


def environment() -> EnvironmentReport:
    """Collects facts about TensorFlow, CUDA, the driver, the GPUs and the host, with findings.

    Does not initialize TensorFlow's devices: `tfgpu.configure()` still works afterwards.
    Never raises for a broken environment; what could not be read is a fact and a finding.

    Returns:
        `EnvironmentReport`; `str(report)` is the `tfgpu env` output, `report.to_dict()`
        the `tfgpu env --json` output.

    Example:

    >>> import tfgpu
    >>> report = tfgpu.environment()  # doctest: +SKIP
    >>> print(report)  # doctest: +SKIP
    """
    facts = _gather_facts()
    return EnvironmentReport(facts=facts, findings=_findings(facts))


def _gather_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for name, read in (
        ("tfgpu", _tfgpu_facts),
        ("python", _python_facts),
        ("os", _os_facts),
        ("host", _host_facts),
        ("tensorflow", _tensorflow_facts),
        ("keras", _keras_facts),
        ("nvml", _nvml_facts),
        ("env", _env_facts),
    ):
        try:
            facts[name] = read()
        except Exception as e:  # a fact we cannot read must not stop the report
            facts[name] = {"error": f"{type(e).__name__}: {e}"}
    return facts


def _tfgpu_facts() -> dict[str, Any]:
    from tfgpu import __version__

    return {"version": __version__}


def _python_facts() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _os_facts() -> dict[str, Any]:
    release = platform.release()
    return {
        "system": platform.system(),
        "release": release,
        "machine": platform.machine(),
        "wsl": "microsoft" in release.lower(),
    }


def _host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"cpus_logical": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        facts["cpus_available"] = len(os.sched_getaffinity(0))
    try:
        import psutil

        facts["cpus_physical"] = psutil.cpu_count(logical=False)
        mem = psutil.virtual_memory()
        facts["memory_total_mib"] = mem.total / 2**20
        facts["memory_available_mib"] = mem.available / 2**20
    except ImportError:
        facts["error"] = "psutil is not installed (pip install psutil): no memory facts"
    return facts


def _tensorflow_facts() -> dict[str, Any]:
    try:
        import tensorflow as tf
    except Exception as e:  # ImportError, or a broken install raising anything
        return {"importable": False, "error": f"{type(e).__name__}: {e}"}
    build = dict(tf.sysconfig.get_build_info())
    facts: dict[str, Any] = {
        "importable": True,
        "version": tf.__version__,
        "is_cuda_build": bool(build.get("is_cuda_build", False)),
        "is_rocm_build": bool(build.get("is_rocm_build", False)),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or []),
        "runtime_initialized": _devices.tf_runtime_initialized(),
    }
    # _devices lists the devices without creating the runtime's context: logical devices
    # and memory settings can still be changed after.
    gpus = []
    for device in _devices.physical_gpus():
        cc = device.compute_capability
        gpu: dict[str, Any] = {
            "name": device.tf_name,
            "device_name": device.device_name,
            "compute_capability": list(cc) if cc else None,
        }
        if device.error is not None:
            gpu["error"] = device.error
        gpus.append(gpu)
    facts["gpus"] = gpus
    return facts


def _keras_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"version": None, "backend": None}
    try:
        from importlib.metadata import version

        facts["version"] = version("keras")
    except Exception:
        pass
    try:
        import keras

        facts["version"] = keras.__version__
        facts["backend"] = keras.backend.backend()
    except Exception as e:
        facts["error"] = f"{type(e).__name__}: {e}"
        facts["backend"] = os.environ.get("KERAS_BACKEND")
    return facts


def _nvml_facts() -> dict[str, Any]:
    try:
        from tfgpu.monitor.nvml import inventory
    except ImportError as e:
        return {"available": False, "error": f"tfgpu.monitor.nvml is unavailable: {e}", "gpus": []}
    inv = inventory()
    gpus = []
    for g in inv.gpus:
        d = dataclasses.asdict(g) if dataclasses.is_dataclass(g) else dict(vars(g))
        cc = d.get("compute_capability")
        d["compute_capability"] = list(cc) if cc else None
        gpus.append(d)
    return {
        "available": bool(inv.available),
        "error": inv.error,
        "driver_version": inv.driver_version,
        "cuda_driver_version": inv.cuda_driver_version,
        "gpus": gpus,
    }


def _env_facts() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in _ENV_VARS}


# --------------------------------------------------------------------------------------------
# Pure helpers


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'12.5.1' -> (12, 5, 1); None or unparsable -> None."""
    if not text:
        return None
    m = re.match(r"^\s*(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _parse_arch(entry: str) -> tuple[str, tuple[int, int]] | None:
    """'sm_80' -> ('sm', (8, 0)); 'compute_90' -> ('compute', (9, 0)); '8.6' -> ('sm', (8, 6))."""
    entry = str(entry).strip().lower()
    m = re.fullmatch(r"(sm|compute)_(\d+)[a-z]?", entry)
    if m:
        digits = m.group(2)
        if len(digits) < 2:
            return None
        return m.group(1), (int(digits[:-1]), int(digits[-1]))
    m = re.fullmatch(r"(\d+)\.(\d+)", entry)
    if m:
        return "sm", (int(m.group(1)), int(m.group(2)))
    return None


def _cc_support(cc: tuple[int, int], compiled: list[str]) -> tuple[str, str | None]:
    """How TensorFlow runs on a GPU of compute capability `cc`.

    Returns ("native", "sm_80") when a compiled binary (SASS) runs on it: binaries for
    sm_XY run on every X.Z with Z >= Y; ("ptx", "compute_90") when only PTX of an equal or
    older architecture is present, JIT-compiled by the driver; ("unsupported", None)
    otherwise.
    """
    archs = [a for a in (_parse_arch(e) for e in compiled) if a]
    sass = [c for kind, c in archs if kind == "sm" and c[0] == cc[0] and c[1] <= cc[1]]
    if sass:
        best = max(sass)
        return "native", f"sm_{best[0]}{best[1]}"
    ptx = [c for kind, c in archs if kind == "compute" and c <= cc]
    if ptx:
        best = max(ptx)
        return "ptx", f"compute_{best[0]}{best[1]}"
    return "unsupported", None


def _visible_gpu_count(cuda_visible_devices: str | None, gpus: list[dict[str, Any]]) -> int:
    """How many of the GPUs NVML lists survive `CUDA_VISIBLE_DEVICES` (CUDA's parsing rules).

    The rules live in `tfgpu.monitor.nvml.visible_gpus`: entries in order (indices, `GPU-`
    UUID prefixes, PCI bus ids), stopping at the first invalid one, so `""`, `"-1"` or
    `"none"` hide all GPUs.
    """
    ids = [
        types.SimpleNamespace(
            uuid=str(g.get("uuid") or ""), pci_bus_id=str(g.get("pci_bus_id") or "")
        )
        for g in gpus
    ]
    return len(visible_gpus(ids, cuda_visible_devices))


def _tf_config_problem(raw: str) -> str | None:
    """What is wrong with a TF_CONFIG value, or None if TensorFlow can use it (pure)."""
    try:
        parse_tf_config(raw, strict=False)
    except TFConfigError as e:
        return e.problem
    return None


def _cc_str(cc: Any) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


# --------------------------------------------------------------------------------------------
# Checks: each a pure function of the facts returning a list of findings.


def _section(facts: dict[str, Any], name: str) -> dict[str, Any]:
    value = facts.get(name)
    return value if isinstance(value, dict) else {}


def _nvml_gpus(facts: dict[str, Any]) -> list[dict[str, Any]]:
    nvml = _section(facts, "nvml")
    return list(nvml.get("gpus") or []) if nvml.get("available") else []


def _tf_gpus(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return list(_section(facts, "tensorflow").get("gpus") or [])


def _env(facts: dict[str, Any], name: str) -> str | None:
    return _section(facts, "env").get(name)


def _check_tensorflow(facts: dict[str, Any]) -> list[Finding]:
    tf = _section(facts, "tensorflow")
    if tf.get("importable", True) and "error" not in tf:
        return []
    return [
        Finding(
            "error",
            "tensorflow-not-importable",
            f"TensorFlow could not be imported: {tf.get('error')}",
            'pip install "tfgpu" (or "tfgpu[and-cuda]" on a machine with an NVIDIA GPU), '
            "in the same Python environment.",
        )
    ]


def _check_keras(facts: dict[str, Any]) -> list[Finding]:
    keras = _section(facts, "keras")
    out = []
    version = _version_tuple(keras.get("version"))
    if keras.get("error") and not keras.get("version"):
        out.append(
            Finding(
                "error",
                "keras-not-importable",
                f"Keras could not be imported: {keras['error']}",
                'pip install "keras>=3"',
            )
        )
    elif version is not None and version < (3,):
        out.append(
            Finding(
                "error",
                "keras-2",
                f"Keras {keras.get('version')} is installed; tfgpu needs Keras 3.",
                'pip install "keras>=3"',
            )
        )
    backend = keras.get("backend")
    if backend and backend != "tensorflow":
        out.append(
            Finding(
                "error",
                "keras-backend",
                f"Keras uses the {backend!r} backend; tfgpu's strategies, pipelines and "
                "configure() act on TensorFlow.",
                'export KERAS_BACKEND=tensorflow (or set "backend": "tensorflow" in '
                "~/.keras/keras.json) before Python starts.",
            )
        )
    if (_env(facts, "TF_USE_LEGACY_KERAS") or "").strip().lower() in ("1", "true"):
        out.append(
            Finding(
                "warning",
                "legacy-keras",
                "TF_USE_LEGACY_KERAS is set: tf.keras is Keras 2 (tf_keras), while tfgpu's "
                "callbacks and precision policies are Keras 3's.",
                "unset TF_USE_LEGACY_KERAS and use `import keras` (Keras 3).",
            )
        )
    return out


def _check_driver(facts: dict[str, Any]) -> list[Finding]:
    nvml = _section(facts, "nvml")
    if nvml.get("available"):
        return []
    # The monitor's error ends with the driver hint; the fix below says it already.
    reason = str(nvml.get("error") or "NVML is unavailable").split(" NVML ships with")[0]
    reason = reason.rstrip(". ")
    if _tf_gpus(facts):
        return [
            Finding(
                "info",
                "nvml-unavailable",
                f"TensorFlow sees GPUs but NVML cannot be read ({reason}): GPU monitoring "
                "(utilization, memory, power) will record NaN.",
                "NVML (libnvidia-ml.so) ships with the NVIDIA driver: make it visible to this "
                "process (in a container, run with --gpus all or NVIDIA_DRIVER_CAPABILITIES="
                "compute,utility), and pip install nvidia-ml-py.",
            )
        ]
    return [
        Finding(
            "warning",
            "no-nvidia-driver",
            f"No NVIDIA driver found ({reason}): TensorFlow will run on the CPU.",
            "On a machine with an NVIDIA GPU, install the NVIDIA driver (it ships NVML) and "
            "check with `nvidia-smi`; in a container, run it with `--gpus all` (NVIDIA "
            "Container Toolkit). On a machine without a GPU there is nothing to do.",
        )
    ]


def _check_cuda_build(facts: dict[str, Any]) -> list[Finding]:
    tf = _section(facts, "tensorflow")
    if not tf.get("importable") or tf.get("is_cuda_build") or tf.get("is_rocm_build"):
        return []
    nvml_gpus = _nvml_gpus(facts)
    if nvml_gpus:
        return [
            Finding(
                "error",
                "tf-not-cuda-build",
                f"TensorFlow {tf.get('version')} is not a CUDA build, so it cannot use the "
                f"{len(nvml_gpus)} NVIDIA GPU(s) the driver sees.",
                f"{_AND_CUDA} (Linux or WSL2) in place of the CPU-only TensorFlow "
                "(pip uninstall tensorflow-cpu, if installed).",
            )
        ]
    return [
        Finding(
            "info",
            "tf-not-cuda-build",
            f"TensorFlow {tf.get('version')} is a CPU-only build.",
            f"Nothing to do on a machine without a GPU; on a GPU machine, {_AND_CUDA}.",
        )
    ]


def _check_cuda_visible_devices(facts: dict[str, Any]) -> list[Finding]:
    value = _env(facts, "CUDA_VISIBLE_DEVICES")
    if value is None:
        return []
    nvml_gpus = _nvml_gpus(facts)
    if nvml_gpus:
        visible = _visible_gpu_count(value, nvml_gpus)
        if visible == 0:
            return [
                Finding(
                    "error",
                    "cuda-visible-devices-hides-all",
                    f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU from TensorFlow (the "
                    f"driver sees {len(nvml_gpus)}).",
                    "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use by index or UUID, "
                    "e.g. CUDA_VISIBLE_DEVICES=0,1 (see `nvidia-smi -L`).",
                )
            ]
        return []
    if value.strip() in ("", "-1", "none", "None"):
        return [
            Finding(
                "info",
                "cuda-visible-devices-hides-all",
                f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU: TensorFlow runs on the CPU.",
                "unset CUDA_VISIBLE_DEVICES if you meant to use a GPU.",
            )
        ]
    return []


def _unsupported_ccs(facts: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    compiled = _section(facts, "tensorflow").get("cuda_compute_capabilities") or []
    if not compiled:
        return []
    out = []
    for name, cc in _all_gpu_ccs(facts):
        if _cc_support(cc, compiled)[0] == "unsupported":
            out.append((name, cc))
    return out


def _all_gpu_ccs(facts: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    """(name, cc) of every distinct GPU model known from NVML or TensorFlow."""
    seen: dict[tuple[str, tuple[int, int]], None] = {}
    for g in _nvml_gpus(facts):
        if g.get("compute_capability"):
            seen[(str(g.get("name")), tuple(g["compute_capability"]))] = None
    for g in _tf_gpus(facts):
        if g.get("compute_capability"):
            key = (str(g.get("device_name") or g.get("name")), tuple(g["compute_capability"]))
            if key[1] not in {cc for _, cc in seen}:
                seen[key] = None
    return list(seen)  # type: ignore[arg-type]


def _check_tf_sees_no_gpu(facts: dict[str, Any]) -> list[Finding]:
    tf = _section(facts, "tensorflow")
    nvml_gpus = _nvml_gpus(facts)
    if not tf.get("importable") or not tf.get("is_cuda_build") or not nvml_gpus:
        return []
    visible = _visible_gpu_count(_env(facts, "CUDA_VISIBLE_DEVICES"), nvml_gpus)
    tf_count = len(_tf_gpus(facts))
    if visible == 0:
        return []  # CUDA_VISIBLE_DEVICES explains it: its own finding
    unsupported = {cc for _, cc in _unsupported_ccs(facts)}
    if tf_count == 0:
        if unsupported and all(
            tuple(g["compute_capability"]) in unsupported
            for g in nvml_gpus
            if g.get("compute_capability")
        ):
            return []  # the compute-capability finding explains it
        return [
            Finding(
                "error",
                "tf-sees-no-gpu",
                f"The NVIDIA driver sees {len(nvml_gpus)} GPU(s) but TensorFlow sees none: "
                "TensorFlow could not load the CUDA libraries (cudart, cuBLAS, cuDNN) it was "
                f"built against (CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}).",
                f"{_AND_CUDA} (installs TensorFlow's CUDA and cuDNN libraries as pip packages). "
                "To see TensorFlow's own reason, run with TF_CPP_MIN_LOG_LEVEL=0.",
            )
        ]
    if tf_count < visible:
        return [
            Finding(
                "warning",
                "tf-sees-fewer-gpus",
                f"TensorFlow sees {tf_count} GPU(s) of the {visible} visible to this process.",
                "Run with TF_CPP_MIN_LOG_LEVEL=0 and look for 'Ignoring visible gpu device': "
                "usually a compute capability TensorFlow was not built for.",
            )
        ]
    return []


def _check_compute_capability(facts: dict[str, Any]) -> list[Finding]:
    tf = _section(facts, "tensorflow")
    compiled = tf.get("cuda_compute_capabilities") or []
    if not tf.get("is_cuda_build") or not compiled:
        return []
    out = []
    for name, cc in _all_gpu_ccs(facts):
        kind, arch = _cc_support(cc, compiled)
        built = " ".join(compiled)
        if kind == "ptx":
            out.append(
                Finding(
                    "info",
                    "compute-capability-ptx",
                    f"{name} (compute capability {_cc_str(cc)}) has no compiled kernels in "
                    f"TensorFlow {tf.get('version')} (built for {built}); the driver "
                    f"JIT-compiles the {arch} PTX for it.",
                    "It works, but the first start compiles every kernel, which can take many "
                    "minutes; keep the JIT cache (do not set CUDA_CACHE_DISABLE, raise "
                    "CUDA_CACHE_MAXSIZE, e.g. to 4294967296) or use a TensorFlow built for "
                    f"sm_{cc[0]}{cc[1]}.",
                )
            )
        elif kind == "unsupported":
            out.append(
                Finding(
                    "error",
                    "compute-capability-unsupported",
                    f"{name} (compute capability {_cc_str(cc)}) is not among those TensorFlow "
                    f"{tf.get('version')} was built for ({built}), and no PTX covers it: "
                    "TensorFlow will not use it.",
                    "Use a TensorFlow release built for this GPU (older releases support older "
                    "GPUs, e.g. tensorflow<2.16 for compute capability 5.x), or build "
                    "TensorFlow from source with TF_CUDA_COMPUTE_CAPABILITIES="
                    f"{_cc_str(cc)}.",
                )
            )
    return out


def _check_driver_cuda_version(facts: dict[str, Any]) -> list[Finding]:
    tf = _section(facts, "tensorflow")
    nvml = _section(facts, "nvml")
    built = _version_tuple(tf.get("cuda_version"))
    driver = _version_tuple(nvml.get("cuda_driver_version"))
    if not tf.get("is_cuda_build") or not nvml.get("available") or not built or not driver:
        return []
    if driver[:2] >= built[:2]:
        return []
    fix = (
        f"Update the NVIDIA driver to one supporting CUDA {tf.get('cuda_version')} or newer "
        "(see the CUDA release notes' driver table), or install a TensorFlow built for the "
        f"driver's CUDA {nvml.get('cuda_driver_version')}."
    )
    if driver[0] < built[0]:
        return [
            Finding(
                "error",
                "driver-too-old",
                f"The driver supports CUDA {nvml.get('cuda_driver_version')} (driver "
                f"{nvml.get('driver_version')}), older than the CUDA {tf.get('cuda_version')} "
                "TensorFlow was built with: TensorFlow cannot use the GPUs.",
                fix,
            )
        ]
    return [
        Finding(
            "warning",
            "driver-older-than-build",
            f"The driver supports CUDA {nvml.get('cuda_driver_version')} (driver "
            f"{nvml.get('driver_version')}), older than the CUDA {tf.get('cuda_version')} "
            "TensorFlow was built with. CUDA's minor-version compatibility lets it run, but "
            "PTX JIT compilation and some newer features will fail.",
            fix,
        )
    ]


def _check_tf_config(facts: dict[str, Any]) -> list[Finding]:
    raw = _env(facts, "TF_CONFIG")
    if raw is None:
        return []
    problem = _tf_config_problem(raw)
    if problem is None:
        return []
    return [
        Finding(
            "error",
            "tf-config-malformed",
            f"TF_CONFIG is malformed: {problem}.",
            'Set TF_CONFIG to JSON like {"cluster": {"worker": ["host1:12345", '
            '"host2:12345"]}, "task": {"type": "worker", "index": 0}}, with this '
            "process's own task, or unset it for single-machine training.",
        )
    ]


def _check_allow_growth(facts: dict[str, Any]) -> list[Finding]:
    value = _env(facts, "TF_FORCE_GPU_ALLOW_GROWTH")
    if value is None:
        return []
    if value not in ("true", "false"):
        return [
            Finding(
                "warning",
                "allow-growth-invalid",
                f"TF_FORCE_GPU_ALLOW_GROWTH={value!r} is ignored: TensorFlow accepts only "
                "'true' or 'false' (lower case).",
                "export TF_FORCE_GPU_ALLOW_GROWTH=true, or unset it and call "
                "tfgpu.configure() (memory growth is its default).",
            )
        ]
    if _env(facts, "TF_GPU_ALLOCATOR") == "cuda_malloc_async":
        return [
            Finding(
                "warning",
                "allow-growth-with-async-allocator",
                f"TF_FORCE_GPU_ALLOW_GROWTH={value} has no effect with "
                "TF_GPU_ALLOCATOR=cuda_malloc_async: the CUDA driver's memory pool "
                "allocates on demand and ignores it.",
                "Unset one of them: keep cuda_malloc_async (less fragmentation) or TensorFlow's "
                "default allocator with growth.",
            )
        ]
    return []


def _check_allocator(facts: dict[str, Any]) -> list[Finding]:
    value = _env(facts, "TF_GPU_ALLOCATOR")
    if value is None or value == "cuda_malloc_async":
        return []
    if value in ("cuda_malloc", "memory_guard"):
        return [
            Finding(
                "warning",
                "allocator-debug",
                f"TF_GPU_ALLOCATOR={value} selects a debugging allocator: every tensor goes "
                "through cudaMalloc/cudaFree, which is slow.",
                "unset TF_GPU_ALLOCATOR, or use TF_GPU_ALLOCATOR=cuda_malloc_async "
                "(tfgpu.configure(async_allocator=True)).",
            )
        ]
    return [
        Finding(
            "warning",
            "allocator-unknown",
            f"TF_GPU_ALLOCATOR={value!r} is not a TensorFlow allocator; it is ignored.",
            "use TF_GPU_ALLOCATOR=cuda_malloc_async, or unset it.",
        )
    ]


def _check_thread_mode(facts: dict[str, Any]) -> list[Finding]:
    value = _env(facts, "TF_GPU_THREAD_MODE")
    if value is None or value in ("global", "gpu_private", "gpu_shared"):
        return []
    return [
        Finding(
            "warning",
            "thread-mode-invalid",
            f"TF_GPU_THREAD_MODE={value!r} is not one of 'global', 'gpu_private', 'gpu_shared'.",
            "export TF_GPU_THREAD_MODE=gpu_private (dedicated threads launch GPU kernels), or "
            "unset it.",
        )
    ]


def _check_windows(facts: dict[str, Any]) -> list[Finding]:
    system = _section(facts, "os").get("system")
    version = _version_tuple(_section(facts, "tensorflow").get("version"))
    if system != "Windows" or not version or version < (2, 11):
        return []
    return [
        Finding(
            "warning",
            "windows-native",
            f"TensorFlow {'.'.join(map(str, version))} on native Windows has no GPU support "
            "(it ended with 2.10).",
            f"Use WSL2 (Ubuntu) with the Windows NVIDIA driver, then {_AND_CUDA} inside it.",
        )
    ]


def _check_gpu_busy(facts: dict[str, Any]) -> list[Finding]:
    if _section(facts, "tensorflow").get("runtime_initialized"):
        return []  # the memory in use may be this process's own
    out = []
    for g in _nvml_gpus(facts):
        total = g.get("memory_total_mib") or 0
        used = g.get("memory_used_mib") or 0
        util = g.get("utilization_pct")
        busy_util = isinstance(util, int | float) and math.isfinite(util) and util >= 50
        if (total and used / total >= 0.25) or busy_util:
            util_text = f"{util:.0f}%" if busy_util else "n/a"
            out.append(
                Finding(
                    "warning",
                    "gpu-busy",
                    f"GPU {g.get('index')} ({g.get('name')}) is already in use: {used:.0f} of "
                    f"{total:.0f} MiB used, utilization {util_text}.",
                    "Another process shares this GPU, so training may run out of memory or "
                    "slow down: see `nvidia-smi`, or pick a free GPU with CUDA_VISIBLE_DEVICES.",
                )
            )
    return out


def _check_mixed_gpus(facts: dict[str, Any]) -> list[Finding]:
    names = {str(g.get("name")) for g in _nvml_gpus(facts)}
    if len(names) < 2:
        return []
    return [
        Finding(
            "info",
            "mixed-gpus",
            f"The GPUs are of different models ({', '.join(sorted(names))}).",
            "Data-parallel training runs at the pace of the slowest GPU; restrict training to "
            "one model with CUDA_VISIBLE_DEVICES or tfgpu.configure(gpus=[...]).",
        )
    ]


def _check_determinism_env(facts: dict[str, Any]) -> list[Finding]:
    names = [
        n
        for n in ("TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC")
        if (_env(facts, n) or "").strip().lower() in ("1", "true")
    ]
    if not names:
        return []
    return [
        Finding(
            "info",
            "determinism-env",
            f"{' and '.join(names)} set: GPU ops run deterministically, which is slower.",
            "Fine for debugging or reproducibility; unset for speed. "
            "tfgpu.configure(deterministic=True, seed=...) does the same from code.",
        )
    ]


_CHECKS: tuple[Callable[[dict[str, Any]], list[Finding]], ...] = (
    _check_tensorflow,
    _check_keras,
    _check_driver,
    _check_cuda_build,
    _check_tf_sees_no_gpu,
    _check_cuda_visible_devices,
    _check_compute_capability,
    _check_driver_cuda_version,
    _check_tf_config,
    _check_allow_growth,
    _check_allocator,
    _check_thread_mode,
    _check_windows,
    _check_gpu_busy,
    _check_mixed_gpus,
    _check_determinism_env,
)


def _findings(facts: dict[str, Any]) -> list[Finding]:
    """All findings for `facts`, errors first (pure; a failing check becomes a finding)."""
    out: list[Finding] = []
    for check in _CHECKS:
        try:
            out.extend(check(facts))
        except Exception as e:
            out.append(
                Finding(
                    "info",
                    "check-failed",
                    f"The check {check.__name__.removeprefix('_check_')} failed: "
                    f"{type(e).__name__}: {e}",
                    "Please report this with the output of `tfgpu env --json`.",
                )
            )
    return sorted(out, key=lambda f: _SEVERITIES.index(f.severity))


# --------------------------------------------------------------------------------------------
# Text rendering


def _fmt_mib(mib: Any) -> str:
    if not isinstance(mib, int | float) or not math.isfinite(mib):
        return "n/a"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [title, *(f"  {k.ljust(width)}  {v}" for k, v in rows), ""]


def _render(report: EnvironmentReport) -> str:
    f = report.facts
    tfgpu_, py, os_ = _section(f, "tfgpu"), _section(f, "python"), _section(f, "os")
    host, tf, keras = _section(f, "host"), _section(f, "tensorflow"), _section(f, "keras")
    nvml, env = _section(f, "nvml"), _section(f, "env")

    if tf.get("importable"):
        if tf.get("is_cuda_build"):
            build = (
                f"CUDA build: CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}, "
                f"for {' '.join(tf.get('cuda_compute_capabilities') or []) or 'unknown'}"
            )
        elif tf.get("is_rocm_build"):
            build = "ROCm build"
        else:
            build = "CPU-only build"
        tf_text = f"{tf.get('version')} ({build})"
    else:
        tf_text = f"not importable: {tf.get('error')}"
    keras_text = f"{keras.get('version')} (backend: {keras.get('backend')})"
    if keras.get("error"):
        keras_text += f"; import failed: {keras['error']}"
    lines = [f"tfgpu {tfgpu_.get('version')} environment report", ""]
    lines += _rows(
        "Software",
        [
            ("tfgpu", str(tfgpu_.get("version"))),
            ("Python", f"{py.get('version')} ({py.get('implementation')}, {py.get('executable')})"),
            (
                "OS",
                f"{os_.get('system')} {os_.get('release')} {os_.get('machine')}"
                + (" (WSL)" if os_.get("wsl") else ""),
            ),
            ("TensorFlow", tf_text),
            ("Keras", keras_text),
        ],
    )
    cpus = f"{host.get('cpus_logical')} logical"
    if host.get("cpus_physical"):
        cpus += f", {host['cpus_physical']} physical"
    if host.get("cpus_available") is not None:
        cpus += f", {host['cpus_available']} available to this process"
    memory = (
        f"{_fmt_mib(host.get('memory_total_mib'))} total, "
        f"{_fmt_mib(host.get('memory_available_mib'))} available"
    )
    lines += _rows("Host", [("CPUs", cpus), ("Memory", memory)])

    if nvml.get("available"):
        rows = [
            ("Driver", f"{nvml.get('driver_version')} (CUDA {nvml.get('cuda_driver_version')})")
        ]
        for g in nvml.get("gpus") or []:
            util = g.get("utilization_pct")
            util_text = (
                f"{util:.0f}% util"
                if isinstance(util, int | float) and math.isfinite(util)
                else "util n/a"
            )
            rows.append(
                (
                    f"GPU {g.get('index')}",
                    f"{g.get('name')}, cc {_cc_str(g.get('compute_capability'))}, "
                    f"{_fmt_mib(g.get('memory_used_mib'))} / "
                    f"{_fmt_mib(g.get('memory_total_mib'))} used, {util_text}",
                )
            )
        if not nvml.get("gpus"):
            rows.append(("GPUs", "none"))
    else:
        rows = [("Driver", f"not available: {nvml.get('error')}")]
    lines += _rows("NVIDIA driver (NVML)", rows)

    if tf.get("importable"):
        gpu_rows = [
            (
                str(g.get("name")),
                f"{g.get('device_name') or 'unknown'}, cc {_cc_str(g.get('compute_capability'))}",
            )
            for g in tf.get("gpus") or []
        ] or [("GPUs", "none: TensorFlow runs on the CPU")]
        if tf.get("runtime_initialized"):
            gpu_rows.append(("Runtime", "already initialized in this process"))
        lines += _rows("GPUs TensorFlow sees", gpu_rows)

    set_vars = [
        (k, v if len(v) <= 200 else v[:197] + "...") for k, v in env.items() if v is not None
    ]
    lines += _rows(
        "Environment variables",
        set_vars or [("(none)", f"none of the {len(_ENV_VARS)} variables tfgpu checks is set")],
    )

    lines.append("Findings")
    if not report.findings:
        lines.append("  No problems found.")
    for finding in report.findings:
        lines.append(f"  [{finding.severity}] {finding.message}")
        lines.append(f"  {' ' * (len(finding.severity) + 2)} fix: {finding.fix}")
    return "\n".join(lines)
