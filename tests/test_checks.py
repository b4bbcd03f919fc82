"""tfgpu._internal.helpers.checks: the Keras-style argument errors every module raises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfgpu._internal.helpers.checks import (
    check_bool,
    check_dir,
    check_finite_result,
    check_int,
    check_log_dir,
    check_number,
    conflicting,
    invalid_type,
    invalid_value,
    is_finite_number,
    is_int,
    is_number,
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


def test_is_int_takes_numpy_integers_and_rejects_bools():
    assert is_int(3) and is_int(-3) and is_int(np.int64(3)) and is_int(np.uint8(3))
    assert not is_int(True) and not is_int(3.0) and not is_int(np.bool_(True))
    assert not is_int("3")


def test_is_number_takes_numpy_scalars_and_rejects_bools():
    assert is_number(0.5) and is_number(3) and is_number(np.float32(1e-3))
    assert not is_number(True) and not is_number(np.bool_(True)) and not is_number("1")


def test_check_int_wrong_type_is_typeerror_out_of_range_is_valueerror():
    assert check_int("n", 1) == 1 and check_int("n", 0, minimum=0) == 0
    assert check_int("n", None, allow_none=True) is None
    assert type(check_int("n", np.int32(4))) is int
    with pytest.raises(ValueError, match=r"Received: n=0\. Expected an int >= 1\.$"):
        check_int("n", 0)
    with pytest.raises(ValueError, match=r"Received: n=9\. Expected an int >= 1 and <= 8\.$"):
        check_int("n", 9, maximum=8)
    with pytest.raises(TypeError, match=r"n=True \(of type bool\)\. Expected an int >= 2 or None"):
        check_int("n", True, minimum=2, allow_none=True)
    with pytest.raises(TypeError, match=r"n=2\.5 \(of type float\)"):
        check_int("n", 2.5)
    with pytest.raises(
        TypeError, match=r"n=None \(of type NoneType\)\. Expected a positive integer"
    ):
        check_int("n", None, expected="a positive integer")


def test_check_number_bounds_types_and_non_finite():
    assert check_number("x", np.float32(0.5), minimum=0, exclusive_minimum=True) == 0.5
    assert check_number("x", 3) == 3.0 and check_number("x", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"x=0\. Expected a finite number > 0\.$"):
        check_number("x", 0, minimum=0, exclusive_minimum=True)
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="Expected a finite number"):
            check_number("x", bad)
    with pytest.raises(ValueError, match=r"Expected a finite number >= 0 and <= 1"):
        check_number("x", 1.5, minimum=0, maximum=1)
    for bad in ("1", True, None, [1]):
        with pytest.raises(TypeError, match="Invalid type for argument `x`"):
            check_number("x", bad)


def test_check_finite_result_names_the_inputs():
    assert check_finite_result("the rate", 2.0, "lr=1.0") == 2.0
    with pytest.raises(ValueError, match=r"lr=1e\+308, replicas=10 give the rate = inf"):
        check_finite_result("the rate", float("inf"), "lr=1e+308, replicas=10")


def test_conflicting_has_one_phrasing():
    assert str(conflicting("a=1", "b=2")) == (
        "Conflicting arguments: a=1 and b=2. Pass only one of them."
    )
    assert str(conflicting("a=1", "b=2", "Use b.")).endswith("Use b.")


def test_check_dir_rejects_files_and_paths_under_files(tmp_path):
    assert check_dir("log_dir", tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert check_dir("log_dir", str(tmp_path)) == tmp_path
    assert check_dir("log_dir", None, allow_none=True) is None
    assert check_dir("log_dir", "~/x") == Path.home() / "x"
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"Invalid value for argument `log_dir`.*is a file"):
        check_dir("log_dir", a_file)
    with pytest.raises(ValueError, match=r"`log_dir`.*is under the file .*f\.txt"):
        check_dir("log_dir", a_file / "sub" / "run")
    for bad in (123, b"runs", None):
        with pytest.raises(TypeError, match="Invalid type for argument `log_dir`"):
            check_dir("log_dir", bad)
    with pytest.raises(ValueError, match="Invalid value for argument `log_dir`"):
        check_dir("log_dir", "")


def test_check_log_dir_is_check_dir_for_the_run_directory(tmp_path):
    assert check_log_dir(None) is None
    assert check_log_dir(tmp_path / "run") == tmp_path / "run"
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"argument `log_dir`.*is under the file .*f\.txt"):
        check_log_dir(a_file / "run")
    with pytest.raises(TypeError, match=r"log_dir=123 \(of type int\)\. Expected a directory"):
        check_log_dir(123)


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
        (0, True),
        (-1.0, True),
        (np.float32(1.0), True),
        (float("nan"), False),
        (float("inf"), False),
        (True, False),
        ("1", False),
        (None, False),
    ],
)
def test_is_finite_number(value, ok):
    assert is_finite_number(value) is ok


def test_importing_it_loads_neither_tensorflow_nor_keras():
    code = (
        "import sys, tfgpu._internal.helpers.checks, tfgpu._internal.helpers.cluster; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('tensorflow', 'keras')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
