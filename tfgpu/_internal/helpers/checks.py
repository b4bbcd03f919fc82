"""Keras-style argument errors, shared by every module (no TensorFlow, no Keras).

Each message names the argument, shows what was received and says what is expected:
``Invalid value for argument `steps`. Received: steps=0. Expected an int >= 1.``
`tfgpu.monitor` uses this module too, so it must never import TensorFlow or Keras.

One rule everywhere: a value of the wrong type (a float where an int is expected, a str
where a number is, a bool where either is) raises `TypeError`; a value of the right type
that is out of range, unknown or not finite raises `ValueError`. NumPy scalars count as the
Python numbers they hold (`np.float32(1e-3)` is a float, `np.int64(8)` an int).
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any, Literal, overload


def invalid_value(name: str, value: Any, expected: str) -> ValueError:
    """Returns the ValueError for argument `name` (the caller raises it).

    Args:
        name: str, the argument's name.
        value: any, what the caller passed.
        expected: str, what would have been valid, after "Expected ", e.g. `"a positive int"`.

    Returns:
        A `ValueError` reading ``Invalid value for argument `name`. Received: name=...
        Expected ....``

    Example:

    >>> str(invalid_value("steps", 0, "an int >= 1"))
    'Invalid value for argument `steps`. Received: steps=0. Expected an int >= 1.'
    """
    return ValueError(
        f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected {expected}."
    )


def invalid_type(name: str, value: Any, expected: str) -> TypeError:
    """Returns the TypeError for argument `name`, naming the type received.

    Args:
        name: str, the argument's name.
        value: any, what the caller passed.
        expected: str, what would have been valid, after "Expected ", e.g. `"a bool"`.

    Returns:
        A `TypeError` reading ``Invalid type for argument `name`. Received: name=... (of
        type T). Expected ....``

    Example:

    >>> str(invalid_type("host", "yes", "a bool"))
    "Invalid type for argument `host`. Received: host='yes' (of type str). Expected a bool."
    """
    return TypeError(
        f"Invalid type for argument `{name}`. Received: {name}={value!r} "
        f"(of type {type(value).__name__}). Expected {expected}."
    )


def is_int(value: Any) -> bool:
    """Whether `value` is an integer: Python's `int` or a NumPy integer, not a bool.

    Example:

    >>> import numpy as np
    >>> is_int(3), is_int(np.int64(3)), is_int(True), is_int(3.0)
    (True, True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (NumPy scalars included), not a bool.

    Example:

    >>> import numpy as np
    >>> is_number(0.5), is_number(np.float32(1e-3)), is_number(True), is_number("1")
    (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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
    """Checks an integer argument (NumPy integers too) against its bounds.

    The rule every tfgpu function follows: a value of the wrong type (a float, a str, a bool)
    is a `TypeError`; an int out of range is a `ValueError`.

    Args:
        name: str, the argument's name.
        value: any, what the caller passed.
        minimum: int, the smallest valid value. Defaults to `1`.
        maximum: int or None, the largest valid value. Defaults to `None`: no upper bound.
        allow_none: bool, whether `None` is valid (and returned as is). Defaults to `False`.
        expected: str or None, the text after "Expected " in the message. Defaults to
            `None`: "an int >= {minimum}" (plus the maximum, and " or None" with
            `allow_none`).

    Returns:
        `value` as a Python int, or None.

    Raises:
        TypeError: if `value` is not an integer (bools are not).
        ValueError: if it is below `minimum` or above `maximum`.

    Example:

    >>> check_int("steps", 3)
    3
    """
    if allow_none and value is None:
        return None
    if expected is None:
        expected = f"an int >= {minimum}"
        if maximum is not None:
            expected += f" and <= {maximum}"
        if allow_none:
            expected += " or None"
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
    """Checks a finite real argument (ints and NumPy scalars too) against its bounds.

    Args:
        name: str, the argument's name.
        value: any, what the caller passed.
        minimum: float or None, the lower bound. Defaults to `None`: none.
        maximum: float or None, the (inclusive) upper bound. Defaults to `None`: none.
        exclusive_minimum: bool, whether `minimum` itself is invalid. Defaults to `False`.
        allow_none: bool, whether `None` is valid (and returned as is). Defaults to `False`.
        expected: str or None, the text after "Expected " in the message. Defaults to
            `None`: built from the bounds.

    Returns:
        `value` as a Python float, or None.

    Raises:
        TypeError: if `value` is not a real number (bools and strings are not).
        ValueError: if it is NaN, infinite, or out of bounds.

    Example:

    >>> check_number("interval", 0.2, minimum=0, exclusive_minimum=True)
    0.2
    """
    if allow_none and value is None:
        return None
    if expected is None:
        parts = []
        if minimum is not None:
            parts.append(f"{'>' if exclusive_minimum else '>='} {minimum}")
        if maximum is not None:
            parts.append(f"<= {maximum}")
        expected = "a finite number" + (f" {' and '.join(parts)}" if parts else "")
        if allow_none:
            expected += " or None"
    if not is_number(value):
        raise invalid_type(name, value, expected)
    number = float(value)
    too_low = minimum is not None and (number <= minimum if exclusive_minimum else number < minimum)
    if not math.isfinite(number) or too_low or (maximum is not None and number > maximum):
        raise invalid_value(name, value, expected)
    return number


def check_finite_result(what: str, value: float, inputs: str) -> float:
    """Raises ValueError when a computed result is not finite (an overflow, say).

    Args:
        what: str, what was computed, e.g. "the scaled learning rate".
        value: float, the result.
        inputs: str, the arguments it came from, as the user wrote them.

    Returns:
        `value`, when finite.

    Raises:
        ValueError: naming the result and the inputs, when `value` is NaN or infinite.

    Example:

    >>> check_finite_result("the global batch size", 256.0, "per_replica=128, replicas=2")
    256.0
    """
    if not math.isfinite(value):
        raise ValueError(
            f"Invalid arguments: {inputs} give {what} = {value!r}, which is not a finite "
            "number. Expected arguments whose result fits in a float."
        )
    return value


def conflicting(first: str, second: str, hint: str = "") -> ValueError:
    """Returns the one ValueError for two arguments that cannot be given together.

    Args:
        first: str, the first argument as the user wrote it, e.g. "batch_size=64".
        second: str, the second one, e.g. "per_replica_batch_size=32".
        hint: str, what to do instead. Defaults to "": "Pass only one of them."

    Returns:
        A `ValueError` reading ``Conflicting arguments: first and second. hint``.

    Example:

    >>> str(conflicting("batch_size=64", "per_replica_batch_size=32"))
    'Conflicting arguments: batch_size=64 and per_replica_batch_size=32. Pass only one of them.'
    """
    return ValueError(
        f"Conflicting arguments: {first} and {second}. {hint or 'Pass only one of them.'}"
    )


def check_dir(name: str, value: Any, *, allow_none: bool = False) -> Path | None:
    """Checks a directory argument (a run directory, a backup directory) before any work.

    The directory need not exist yet (it is created when written to), but neither it nor
    any of its parents may be an existing file. `~` is expanded.

    Args:
        name: str, the argument's name, e.g. `"log_dir"`.
        value: any, what the caller passed.
        allow_none: bool, whether `None` is valid (and returned as is). Defaults to `False`.

    Returns:
        The directory as a `Path` (user-expanded), or None.

    Raises:
        TypeError: if `value` is neither a str nor path-like.
        ValueError: if it is empty, or it or one of its parents is a file.

    Example:

    >>> check_dir("log_dir", "runs/exp1")
    PosixPath('runs/exp1')
    """
    if allow_none and value is None:
        return None
    expected = "a directory path (str or os.PathLike)" + (" or None" if allow_none else "")
    if not isinstance(value, (str, os.PathLike)) or isinstance(value, bytes):
        raise invalid_type(name, value, expected)
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise invalid_value(name, value, expected)
    path = Path(text).expanduser()
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = (
                    "is a file" if candidate == path else f"is under the file {str(candidate)!r}"
                )
                raise invalid_value(name, value, f"a directory; {str(path)!r} {where}")
            break
    return path


def check_log_dir(value: Any) -> Path | None:
    """Checks a `log_dir` argument (a run directory, or None for none); returns it as a Path.

    Call it once per call, with the other arguments, and use the path it returns: the check
    and the path then cannot disagree. The rules are `check_dir`'s.

    Args:
        value: any, what the caller passed as `log_dir`.

    Returns:
        The run directory as a `Path` (user-expanded), or None.

    Raises:
        TypeError: if `value` is neither None, a str nor path-like.
        ValueError: if it is empty, or it or one of its parents is a file.

    Example:

    >>> check_log_dir("runs/exp1"), check_log_dir(None)
    (PosixPath('runs/exp1'), None)
    """
    return check_dir("log_dir", value, allow_none=True)


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> None:
    """Checks a flag argument; raises TypeError unless it is a bool (or None if allowed).

    Args:
        name: str, the argument's name.
        value: any, what the caller passed.
        allow_none: bool, whether `None` is valid too. Defaults to `False`.

    Raises:
        TypeError: if `value` is not `True`/`False` (nor `None` with `allow_none`).

    Example:

    >>> check_bool("shuffle", True)
    """
    if isinstance(value, bool) or (allow_none and value is None):
        return
    raise invalid_type(name, value, "True, False or None" if allow_none else "True or False")


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a finite real number (NumPy scalars too; bools and NaN are not).

    Example:

    >>> is_finite_number(0.2), is_finite_number(float("nan")), is_finite_number(True)
    (True, False, False)
    """
    return is_number(value) and math.isfinite(float(value))


def check_time_budget(value: Any) -> float | None:
    """Checks a `time_budget_s` argument: seconds > 0, or None (no limit); returns it.

    Raises:
        TypeError: for a value that is not a number (a bool included).
        ValueError: for a value <= 0 or not finite.
    """
    return check_number(
        "time_budget_s",
        value,
        minimum=0,
        exclusive_minimum=True,
        allow_none=True,
        expected="a finite number of seconds > 0, or None (no limit)",
    )
