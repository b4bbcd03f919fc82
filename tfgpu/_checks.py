"""Keras-style argument errors, shared by every module (no TensorFlow, no Keras).

Each message names the argument, shows what was received and says what is expected:
``Invalid value for argument `steps`. Received: steps=0. Expected an int >= 1.``
`tfgpu.monitor` uses this module too, so it must never import TensorFlow or Keras.
"""

from __future__ import annotations

import math
import numbers
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


def is_int(value: Any, *, numpy: bool = False) -> bool:
    """Whether `value` is an integer and not a bool.

    Args:
        value: any.
        numpy: bool, whether NumPy integers (and other `numbers.Integral`) count too.
            Defaults to `False`: only Python's `int`.

    Returns:
        True for `3`; False for `True`, `3.0` and `"3"`; `np.int64(3)` only with `numpy=True`.

    Example:

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    if numpy:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)


@overload
def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = ...,
    allow_none: Literal[False] = ...,
    numpy: bool = ...,
    expected: str | None = ...,
) -> int: ...


@overload
def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = ...,
    allow_none: bool,
    numpy: bool = ...,
    expected: str | None = ...,
) -> int | None: ...


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = 1,
    allow_none: bool = False,
    numpy: bool = False,
    expected: str | None = None,
) -> int | None:
    """Checks an integer argument with a lower bound; raises ValueError otherwise.

    Args:
        name: str, the argument's name.
        value: any, what the caller passed.
        minimum: int, the smallest valid value. Defaults to `1`.
        allow_none: bool, whether `None` is valid (and returned as is). Defaults to `False`.
        numpy: bool, whether NumPy integers are accepted (see `is_int`). Defaults to `False`.
        expected: str or None, the text after "Expected " in the message. Defaults to
            `None`: "an int >= {minimum}" (plus " or None" with `allow_none`).

    Returns:
        `value` as a Python int, or None.

    Raises:
        ValueError: if `value` is not an int (bools are not) or is below `minimum`.

    Example:

    >>> check_int("steps", 3)
    3
    """
    if allow_none and value is None:
        return None
    if not is_int(value, numpy=numpy) or value < minimum:
        if expected is None:
            expected = f"an int >= {minimum}{' or None' if allow_none else ''}"
        raise invalid_value(name, value, expected)
    return int(value)


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


def is_positive_number(value: Any) -> bool:
    """Whether `value` is a finite real number > 0 (bools are not numbers here).

    Example:

    >>> is_positive_number(0.2), is_positive_number(float("inf")), is_positive_number(True)
    (True, False, False)
    """
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and not value <= 0  # numbers.Real declares only < and <=; isfinite ruled out NaN
    )
