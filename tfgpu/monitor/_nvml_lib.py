"""Reaching the NVML binding for the inventory (`nvml`) and the readers (`_gpu_reader`):
importing `pynvml` (only when a function runs), starting and stopping NVML, reading errors.
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
    """Returns the `pynvml` module (with a usable `NVMLError`), or None and why not."""
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


def exported(nv: ModuleType, *names: str) -> list[str]:
    """The `names` the binding has as functions, in order."""
    return [name for name in names if callable(getattr(nv, name, None))]


def error_code(nv: ModuleType, name: str, default: int) -> int:
    """The binding's value of the NVML error constant `name`, else `default`."""
    value = getattr(nv, name, default)
    return value if isinstance(value, int) else default
