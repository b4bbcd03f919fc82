"""The `tfgpu` command line: `env`, `--version`, bad commands (report/demo are tested elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tfgpu
from tests.conftest import REPO
from tfgpu.cli import main


def _strict_json(text):
    def reject(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=reject)


def test_env_prints_the_readable_report(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tfgpu {tfgpu.__version__} environment report")
    for heading in ("Software", "Host", "NVIDIA driver (NVML)", "GPUs TensorFlow sees", "Findings"):
        assert f"\n{heading}\n" in out
    assert "TensorFlow  2." in out


def test_env_json_is_one_strict_json_object(capsys):
    assert main(["env", "--json"]) == 0
    report = _strict_json(capsys.readouterr().out)
    assert set(report) == {"facts", "findings"}
    assert report["facts"]["tfgpu"]["version"] == tfgpu.__version__
    for finding in report["findings"]:
        assert set(finding) == {"severity", "code", "message", "fix"}


def test_env_works_without_tensorflow(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert main(["env", "--json"]) == 0
    report = _strict_json(capsys.readouterr().out)
    assert report["facts"]["tensorflow"]["importable"] is False
    assert report["findings"][0]["code"] == "tensorflow-not-importable"


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"tfgpu {tfgpu.__version__}"


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "required: COMMAND"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["env", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_commands_exit_2_with_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tfgpu" in err and message in err


@pytest.mark.slow
def test_env_json_as_a_program():
    script = Path(sys.executable).with_name("tfgpu")  # the console script, when installed
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tfgpu"]
    result = subprocess.run(
        [*command, "env", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = _strict_json(result.stdout)
    assert report["facts"]["tensorflow"]["runtime_initialized"] is False
