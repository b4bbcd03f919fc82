"""Keras-style argument errors: a wrong type is a `TypeError`, the right type out of range a
`ValueError`; NumPy scalars count as numbers, bools do not. No TensorFlow (the monitor uses it)."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, overload


def invalid_value(
    name: str, value: Any, expected: str, *, received: str | None = None
) -> ValueError:
    """The ValueError for argument `name` (the caller raises it), in the one phrasing of every
    argument error; `received`: what was received, in words, where `name=value` does not say it.

    Example:

    >>> str(invalid_value("steps", 0, "an int >= 1"))
    'Invalid value for argument `steps`. Received: steps=0. Expected an int >= 1.'
    >>> str(invalid_value("data", None, "at least one batch", received="an empty dataset"))
    'Invalid value for argument `data`. Received: an empty dataset. Expected at least one batch.'
    """
    shown = f"{name}={value!r}" if received is None else received
    return ValueError(
        f"Invalid value for argument `{name}`. Received: {shown}. Expected {expected}."
    )


def short_repr(value: Any, limit: int = 80) -> str | None:
    """The repr of `value`, or None when longer than `limit` (arrays, models fill a screen)."""
    text = repr(value)
    return text if len(text) <= limit else None


def invalid_type(name: str, value: Any, expected: str, *, received: str | None = None) -> TypeError:
    """The TypeError for argument `name`, naming the type received (and the value, when its
    repr is short); `received`: what was received, in words, instead.

    Example:

    >>> str(invalid_type("host", "yes", "a bool"))
    "Invalid type for argument `host`. Received: host='yes' (of type str). Expected a bool."
    """
    if received is None:
        shown = short_repr(value)
        kind = type(value).__name__
        received = f"{name} of type {kind}" if shown is None else f"{name}={shown} (of type {kind})"
    return TypeError(
        f"Invalid type for argument `{name}`. Received: {received}. Expected {expected}."
    )


def is_int(value: Any) -> bool:
    """Whether `value` is an integer: Python's `int` or a NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (NumPy scalars included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _bounded(kind: str, low: float | None, high: float | None, strict: bool, none: bool) -> str:
    """The default `expected` of `check_int` and `check_number`: "an int >= 1 and <= 9 or None"."""
    bounds = [] if low is None else [f"{'>' if strict else '>='} {low}"]
    if high is not None:
        bounds.append(f"<= {high}")
    text = f"{kind} {' and '.join(bounds)}" if bounds else kind
    return f"{text} or None" if none else text


@overload
def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = ...,
    maximum: int | None = ...,
    allow_none: Literal[False] = ...,
    expected: str | None = ...,
) -> int: ...
@overload
def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = ...,
    maximum: int | None = ...,
    allow_none: bool,
    expected: str | None = ...,
) -> int | None: ...
def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    allow_none: bool = False,
    expected: str | None = None,
) -> int | None:
    """Checks an integer argument (NumPy's too, not bools) against its bounds; returns an int."""
    if allow_none and value is None:
        return None
    if expected is None:
        expected = _bounded("an int", minimum, maximum, False, allow_none)
    if not is_int(value):
        raise invalid_type(name, value, expected)
    if value < minimum or (maximum is not None and value > maximum):
        raise invalid_value(name, value, expected)
    return int(value)


@overload
def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = ...,
    maximum: float | None = ...,
    exclusive_minimum: bool = ...,
    allow_none: Literal[False] = ...,
    expected: str | None = ...,
) -> float: ...
@overload
def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = ...,
    maximum: float | None = ...,
    exclusive_minimum: bool = ...,
    allow_none: bool,
    expected: str | None = ...,
) -> float | None: ...
def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    allow_none: bool = False,
    expected: str | None = None,
) -> float | None:
    """Checks a finite real argument (NumPy's too, not bools) against bounds; returns a float."""
    if allow_none and value is None:
        return None
    if expected is None:
        expected = _bounded("a finite number", minimum, maximum, exclusive_minimum, allow_none)
    if not is_number(value):
        raise invalid_type(name, value, expected)
    number = float(value)
    too_low = minimum is not None and (number <= minimum if exclusive_minimum else number < minimum)
    if not math.isfinite(number) or too_low or (maximum is not None and number > maximum):
        raise invalid_value(name, value, expected)
    return number


def check_finite_result(what: str, value: float, inputs: str) -> float:
    """Returns `value`; a ValueError naming `what` and its `inputs` ("a=1, b=2") if not finite."""
    if not math.isfinite(value):
        raise ValueError(
            f"Invalid arguments: {inputs} give {what} = {value!r}, which is not a finite "
            "number. Expected arguments whose result fits in a float."
        )
    return value


def conflicting(first: str, second: str, hint: str = "") -> ValueError:
    """The one ValueError for two arguments given together ("batch_size=64"); `hint`: the advice."""
    return ValueError(
        f"Conflicting arguments: {first} and {second}. {hint or 'Pass only one of them.'}"
    )


@overload
def check_dir(
    name: str, value: Any, *, allow_none: Literal[False] = ..., expected: str | None = ...
) -> Path: ...
@overload
def check_dir(
    name: str, value: Any, *, allow_none: bool, expected: str | None = ...
) -> Path | None: ...
def check_dir(
    name: str, value: Any, *, allow_none: bool = False, expected: str | None = None
) -> Path | None:
    """Checks a directory argument; returns it as a `Path` (`~` expanded). It need not exist,
    but neither it nor a parent may be a file (`expected`: a command line's words)."""
    if allow_none and value is None:
        return None
    if expected is None:
        expected = "a directory path (str or os.PathLike)" + (" or None" if allow_none else "")
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
        raise invalid_type(name, value, expected)
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise invalid_value(name, value, expected)
    path = Path(text).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == path else f"is under the file {str(existing)!r}"
        raise invalid_value(name, value, f"a directory; {str(path)!r} {where}")
    return path


def check_log_dir(value: Any) -> Path | None:
    """Checks a `log_dir` argument (None: none) by `check_dir`'s rules; use the path it returns."""
    return check_dir("log_dir", value, allow_none=True)


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> None:
    """Checks a flag argument; raises TypeError unless it is a bool (or None if allowed)."""
    if isinstance(value, bool) or (allow_none and value is None):
        return
    raise invalid_type(name, value, "True, False or None" if allow_none else "True or False")


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a finite real number (NumPy scalars too; bools and NaN are not)."""
    return is_number(value) and math.isfinite(float(value))


# The shortest sampling interval of `Sampler`, `record` and `GPUMonitor`, in seconds: NVML
# refreshes every 1/6 s to 1 s, and below this the sampler thread would take a core.
MIN_INTERVAL = 0.01
_INTERVAL = f"a number of seconds >= {MIN_INTERVAL} (NVML refreshes every 1/6 s to 1 s), e.g. 0.2"
_BUDGET = "a finite number of seconds > 0, or None (no limit)"


def check_time_budget(value: Any) -> float | None:
    """Checks a `time_budget_s` argument: seconds > 0, or None (no limit); returns it."""
    return check_number(
        "time_budget_s", value, minimum=0, exclusive_minimum=True, allow_none=True, expected=_BUDGET
    )


_VALIDATION_SPLIT = "a float in (0, 1), e.g. 0.1, or None"


def check_validation_split(value: Any) -> float | None:
    """Checks `validation_split`: None, or a finite number strictly between 0 and 1."""
    if value is None:
        return None
    if not is_number(value):
        raise invalid_type("validation_split", value, _VALIDATION_SPLIT)
    # A NumPy float as the user wrote it: np.float32(0.2) is 0.2, not 0.20000000298.
    number = float(str(value)) if type(value).__module__ == "numpy" else float(value)
    if not math.isfinite(number) or not 0.0 < number < 1.0:
        raise invalid_value("validation_split", value, _VALIDATION_SPLIT)
    return number


def check_interval(interval: Any) -> float:
    """Checks a sampling interval (seconds, >= `MIN_INTERVAL`); returns it as a float."""
    return check_number("interval", interval, minimum=MIN_INTERVAL, expected=_INTERVAL)


_GPUS_EXPECTED = "None (all GPUs this process uses) or a list of GPU indices (ints), e.g. [0, 1]"


def check_gpus(gpus: Any) -> list[int] | None:
    """Checks the form of a `gpus` argument (the indices are checked against NVML later)."""
    if gpus is None:
        return None
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise invalid_type("gpus", gpus, _GPUS_EXPECTED)
    checked = []
    for g in gpus:
        if not is_int(g):
            raise invalid_type("gpus", list(gpus), _GPUS_EXPECTED)
        if g < 0:
            raise invalid_value(
                "gpus",
                list(gpus),
                "non-negative GPU indices, as TensorFlow numbers them (`/GPU:0` is 0)",
            )
        if int(g) in checked:
            raise invalid_value("gpus", list(gpus), "each GPU index at most once")
        checked.append(int(g))
    return checked


def check_script(name: str, value: Any) -> Path:
    """Checks the path of a user's Python script (`tfgpu run`, `tfgpu tune`); returns it."""
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
        raise invalid_type(name, value, "the path of a Python script (str or os.PathLike)")
    path = Path(value)
    if not path.is_file():
        raise invalid_value(name, value, "an existing Python script that calls `fit`")
    return path
