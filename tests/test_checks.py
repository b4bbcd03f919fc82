"""tfgpu._checks: the Keras-style argument errors every module raises."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tfgpu._checks import (
    check_bool,
    check_int,
    invalid_type,
    invalid_value,
    is_int,
    is_positive_number,
)


def test_messages_name_the_argument_what_came_and_what_is_expected():
    assert str(invalid_value("steps", 0, "an int >= 1")) == (
        "Invalid value for argument `steps`. Received: steps=0. Expected an int >= 1."
    )
    error = invalid_type("seed", "7", "an int or None")
    assert isinstance(error, TypeError)
    assert str(error) == (
        "Invalid type for argument `seed`. Received: seed='7' (of type str). "
        "Expected an int or None."
    )


def test_is_int_rejects_bools_and_takes_numpy_only_when_asked():
    assert is_int(3) and is_int(-3) and not is_int(True) and not is_int(3.0)
    assert not is_int(np.int64(3)) and is_int(np.int64(3), numpy=True)
    assert not is_int(np.bool_(True), numpy=True) and not is_int("3", numpy=True)


def test_check_int_bounds_none_and_message():
    assert check_int("n", 1) == 1 and check_int("n", 0, minimum=0) == 0
    assert check_int("n", None, allow_none=True) is None
    assert type(check_int("n", np.int32(4), numpy=True)) is int
    with pytest.raises(ValueError, match=r"Received: n=0\. Expected an int >= 1\.$"):
        check_int("n", 0)
    with pytest.raises(ValueError, match=r"Expected an int >= 2 or None\.$"):
        check_int("n", True, minimum=2, allow_none=True)
    with pytest.raises(ValueError, match=r"n=None\. Expected a positive integer\.$"):
        check_int("n", None, expected="a positive integer")


def test_check_bool():
    check_bool("flag", False)
    check_bool("flag", None, allow_none=True)
    with pytest.raises(TypeError, match=r"flag=None \(of type NoneType\)\. Expected True or False"):
        check_bool("flag", None)
    with pytest.raises(TypeError, match=r"Expected True, False or None\.$"):
        check_bool("flag", 1, allow_none=True)


@pytest.mark.parametrize(
    "value, ok",
    [
        (0.2, True),
        (3, True),
        (0, False),
        (-1.0, False),
        (float("nan"), False),
        (float("inf"), False),
        (True, False),
        ("1", False),
    ],
)
def test_is_positive_number(value, ok):
    assert is_positive_number(value) is ok


def test_importing_it_loads_neither_tensorflow_nor_keras():
    code = (
        "import sys, tfgpu._checks, tfgpu._cluster; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('tensorflow', 'keras')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
