"""Imports of heavy or optional packages, with the exact install line when one is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

_INSTALL_HINTS = {  # module name -> what to install to get it
    "tensorflow": 'pip install "tfgpu"  (or "tfgpu[and-cuda]" on a machine with an NVIDIA GPU)',
    "keras": 'pip install "keras>=3"',
    "tensorflow_datasets": "pip install tensorflow-datasets",
    "pynvml": "pip install nvidia-ml-py  (NVML itself ships with the NVIDIA driver)",
    "psutil": "pip install psutil",
    "matplotlib": "pip install matplotlib",
}


def import_optional(name: str) -> ModuleType:
    """Imports `name`, or raises an `ImportError` that holds the pip command to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        top = name.split(".")[0]
        hint = _INSTALL_HINTS.get(top, f"pip install {top}")
        raise ImportError(
            f"tfgpu needs the `{top}` package for this feature. Install it with: {hint}"
        ) from e
