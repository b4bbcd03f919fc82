"""The NVML binding (`pynvml`, imported when a function runs); `nvml_query` makes every call."""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Failure:
    """A failed call: the exception's class and text (not the exception: its traceback would hold
    the caller's frames in a reference cycle), NVML's error code (None for another error), and
    whether the driver or the binding lacks the function (an older one may answer instead)."""

    kind: type
    text: str
    code: int | None = None
    missing: bool = False

    @classmethod
    def of(cls, error: Exception, code: int | None = None, missing: bool = False) -> Failure:
        return cls(type(error), decode(error) or type(error).__name__, code, missing)


def nvml_failure(nv: ModuleType, code: int) -> Failure:
    """The `Failure` of NVML's error `code` (a field value's own error, a function not found)."""
    return Failure.of(nv.NVMLError(code), code, code == _function_not_found(nv))


def nvml_query(nv: ModuleType, name: str, *args: Any, default: Any = Failure, **kwargs: Any) -> Any:
    """`nv.<name>(*args, **kwargs)`, or `default` where it fails (`Failure`: the `Failure`); a
    function the binding lacks fails as FUNCTION_NOT_FOUND. Which errors are caught and why:
    docs/architecture.md, "Exceptions"; anything else goes to the caller's boundary."""
    fn = getattr(nv, name, None)
    if not callable(fn):
        return nvml_failure(nv, _function_not_found(nv)) if default is Failure else default
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    mismatches = (mismatch,) if isinstance(mismatch, type) else ()
    try:
        return fn(*args, **kwargs)
    except (nv.NVMLError, *mismatches, TypeError, AttributeError, UnicodeDecodeError, OSError) as e:
        if default is not Failure:
            return default
        code = getattr(e, "value", None) if isinstance(e, nv.NVMLError) else None
        return Failure.of(e, code, code == _function_not_found(nv) or isinstance(e, mismatches))


def _function_not_found(nv: ModuleType) -> int:
    return constant(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)


def start(nv: ModuleType) -> str | None:
    """Initializes NVML (reference counted by NVML itself); returns an error text or None."""
    failure = nvml_query(nv, "nvmlInit")
    if isinstance(failure, Failure):
        return f"NVML could not be initialized ({failure.text}). {NVML_HINT}"
    return None


def stop(nv: ModuleType) -> None:
    """Shuts NVML down (one `start` less); a failed shutdown is ignored (nothing to do)."""
    nvml_query(nv, "nvmlShutdown", default=None)


def exported(nv: ModuleType, *names: str) -> list[str]:
    """The `names` the binding has as functions, in order."""
    return [name for name in names if callable(getattr(nv, name, None))]


def constant(nv: ModuleType, name: str, default: int) -> int:
    """The binding's int constant `name` (an error code, a metric id, an index), else
    `default`. nvidia-ml-py writes some as `NVML_P2P_CAPS_INDEX_READ = 0,` (copied from
    nvml.h's enum): a tuple, which ctypes refuses as an argument; its one element is the value."""
    value = getattr(nv, name, default)
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else default
