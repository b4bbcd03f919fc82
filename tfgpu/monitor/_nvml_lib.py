"""Reaching the NVML binding: importing `pynvml`, starting and stopping NVML, reading its errors.

Shared by the inventory (`tfgpu.monitor.nvml`) and the per-GPU readers (`_gpu_reader`).
`pynvml` (from `nvidia-ml-py`) is imported only when a function here runs; never TensorFlow.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

NVML_HINT = (
    "NVML ships with the NVIDIA driver: install or repair the driver until `nvidia-smi` "
    "works; the Python binding is `pip install nvidia-ml-py`."
)


def decode(value: Any) -> str:
    """Text of a value or an exception; never raises (a binding's `__str__` may)."""
    try:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    except Exception:  # any `__str__` may raise anything: the boundary of "never raises"
        return type(value).__name__


def import_pynvml() -> tuple[ModuleType | None, str | None]:
    """Returns the `pynvml` module, or None and why not (with `NVML_HINT`).

    The module returned has the binding's error class, `NVMLError`: every NVML call here
    catches it (with `NVMLLibraryMismatchError` where a call may raise that).
    """
    try:
        import pynvml

        if not issubclass(pynvml.NVMLError, Exception):
            raise TypeError("pynvml.NVMLError is not an exception class")
    except ImportError:
        return None, f"The `pynvml` module is not installed. {NVML_HINT}"
    except Exception as e:  # a broken install raising anything at import (or lacking NVMLError)
        return None, f"The `pynvml` module failed to import ({type(e).__name__}: {e}). {NVML_HINT}"
    return pynvml, None


def start(nv: ModuleType) -> str | None:
    """Initializes NVML (reference counted by NVML itself); returns an error text or None."""
    try:
        nv.nvmlInit()
    except (nv.NVMLError, OSError) as e:  # OSError: a library that fails to load
        return f"NVML could not be initialized ({decode(e) or type(e).__name__}). {NVML_HINT}"
    return None


def stop(nv: ModuleType) -> None:
    """Shuts NVML down (one `start` less); never raises an NVML error."""
    try:
        nv.nvmlShutdown()
    except nv.NVMLError:  # nothing useful to do about a failed shutdown
        pass


def memory_v2(nv: ModuleType, handle: Any) -> Any:
    """`nvmlDeviceGetMemoryInfo` with the v2 struct (used without reserved memory, as
    `nvidia-smi`); raises `TypeError`/`AttributeError` with a binding that lacks it."""
    return nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)


def error_code(nv: ModuleType, name: str, default: int) -> int:
    """The binding's value of the NVML error constant `name`, else `default`."""
    value = getattr(nv, name, default)
    return value if isinstance(value, int) else default
