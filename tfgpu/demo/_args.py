"""The demo's argument checks and its run directory (no TensorFlow): refused before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.checks import (
    check_bool,
    check_dir,
    check_int,
    invalid_type,
    invalid_value,
)
from tfgpu._internal.helpers.files import new_run_dir


def check_arguments(
    quick: Any, dataset: Any, log_dir: Any, epochs: Any, *, flags: bool = False
) -> Path:
    """Raises `TypeError`/`ValueError` for bad arguments, before any work (no TensorFlow);
    returns the run directory (`log_dir`, or a new `runs/demo-YYYYmmdd-HHMMSS`). `flags`:
    the run directory's error names `--log-dir`, as `tfgpu demo` takes it."""
    check_bool("quick", quick)
    expected = "None (offline synthetic data) or a TensorFlow Datasets name such as 'cifar10'"
    if dataset is not None and not isinstance(dataset, str):
        raise invalid_type("dataset", dataset, expected)
    if dataset is not None and not dataset.strip():
        raise invalid_value("dataset", dataset, expected)
    check_int("epochs", epochs, minimum=1, allow_none=True)
    name = "--log-dir" if flags else "log_dir"
    return check_log_dir(default_log_dir() if log_dir is None else log_dir, name)


def check_log_dir(log_dir: Any, name: str = "log_dir") -> Path:
    """The run directory, which must be new or empty: a demo never writes into an earlier
    run. `name`: the argument as the caller takes it (`log_dir`, or `--log-dir`)."""
    path = check_dir(name, log_dir)
    if path.is_dir() and any(path.iterdir()):
        raise invalid_value(
            name,
            log_dir,
            f"a new or empty directory; {str(path)!r} is not empty, and a demo never writes "
            "into an earlier run (nothing there is touched): pass another directory, or leave "
            f"{name} out for a fresh runs/demo-YYYYmmdd-HHMMSS",
        )
    return path


def claim_log_dir(path: Path) -> None:
    """Creates the run directory, checking again that it is empty (another run may have
    started there since the arguments were checked)."""
    path.mkdir(parents=True, exist_ok=True)
    check_log_dir(path)


def default_log_dir() -> Path:
    """`runs/demo-YYYYmmdd-HHMMSS`, or `...-2`, `-3`, ... when that exists already."""
    return new_run_dir("demo")
