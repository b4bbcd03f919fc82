"""Reading the facts from this process and machine, one function per section: the only module
of `env` with effects. TensorFlow's GPUs are listed without creating its runtime's context."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import platform
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from tfgpu._internal.adapters import devices
from tfgpu.env._facts import ENV_VARS


def gather_facts() -> dict[str, Any]:
    """Every section of the facts, read now; a section that fails holds `{"error": ...}`."""
    facts: dict[str, Any] = {}
    for name, read in (
        ("tfgpu", _tfgpu_facts), ("python", _python_facts), ("os", _os_facts),
        ("host", _host_facts), ("tensorflow", _tensorflow_facts), ("keras", _keras_facts),
        ("nvml", _nvml_facts), ("env", _env_facts),
    ):  # fmt: skip
        value, error = _attempt(read)
        facts[name] = value if error is None else {"error": error}
    return facts


def _attempt(read: Callable[[], Any]) -> tuple[Any, str | None]:
    """`(read(), None)`, or `(None, "Type: message")` when it raises."""
    try:
        return read(), None
    # The one catch-all of `tfgpu env`: a diagnostic command never crashes on what it
    # diagnoses, and a broken install (TensorFlow, Keras, a driver) raises anything.
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


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
    tf, error = _attempt(lambda: importlib.import_module("tensorflow"))
    if error is not None:  # ImportError, or a broken install raising anything
        return {"importable": False, "error": error}
    build = dict(tf.sysconfig.get_build_info())
    facts: dict[str, Any] = {
        "importable": True,
        "version": tf.__version__,
        "is_cuda_build": bool(build.get("is_cuda_build", False)),
        "is_rocm_build": bool(build.get("is_rocm_build", False)),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or []),
        "runtime_initialized": devices.tf_runtime_initialized(),
        "gpus": [],
    }
    for device in devices.physical_gpus():
        cc = device.compute_capability
        gpu: dict[str, Any] = {
            "name": device.tf_name,
            "device_name": device.device_name,
            "compute_capability": list(cc) if cc else None,
        }
        if device.error is not None:
            gpu["error"] = device.error
        facts["gpus"].append(gpu)
    return facts


def _keras_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"version": None, "backend": None}
    with contextlib.suppress(PackageNotFoundError):
        facts["version"] = version("keras")

    def read() -> None:
        import keras

        facts["version"] = keras.__version__
        facts["backend"] = keras.backend.backend()

    _, error = _attempt(read)
    if error is not None:
        facts["error"] = error
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
    return {name: os.environ.get(name) for name in ENV_VARS}
