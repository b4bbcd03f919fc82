"""The `tfgpu` command line: `env`, `--version`, bad commands (report/demo are tested elsewhere)."""

from __future__ import annotations

import json
import os
import re
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
        assert set(finding) == {"severity", "kind", "detail", "recommendation"}


def test_env_works_without_tensorflow(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert main(["env", "--json"]) == 0
    report = _strict_json(capsys.readouterr().out)
    assert report["facts"]["tensorflow"]["importable"] is False
    assert report["findings"][0]["kind"] == "tensorflow-not-importable"


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


def _tfgpu_command() -> list[str]:
    script = Path(sys.executable).with_name("tfgpu")  # the console script, when installed
    return [str(script)] if script.exists() else [sys.executable, "-m", "tfgpu"]


def _run_env(*args: str, log_level: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if log_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = log_level
    return subprocess.run(
        [*_tfgpu_command(), "env", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )


_NOISE = ("cuInit", "absl::InitializeLog", "Could not find cuda drivers", "oneDNN", "I0000")


@pytest.mark.slow
def test_env_output_starts_with_the_report_without_tensorflow_startup_noise():
    result = _run_env()
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    for noise in _NOISE:
        assert noise not in output, output[:2000]
    assert result.stdout.startswith(f"tfgpu {tfgpu.__version__} environment report")
    assert "TF_CPP_MIN_LOG_LEVEL" not in result.stdout  # not set by the user: not reported


@pytest.mark.slow
def test_env_json_as_a_program_reports_the_users_log_level():
    result = _run_env("--json", log_level="0")
    assert result.returncode == 0, result.stderr[-2000:]
    report = _strict_json(result.stdout)
    assert report["facts"]["env"]["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert report["facts"]["tensorflow"]["runtime_initialized"] is False


@pytest.mark.slow
def test_a_log_level_set_to_quiet_tensorflow_still_hides_its_startup_noise():
    # TensorFlow writes these lines before it reads TF_CPP_MIN_LOG_LEVEL: level 2 alone
    # would not hide them (issue 16).
    result = _run_env(log_level="2")
    assert result.returncode == 0, result.stderr[-2000:]
    for noise in _NOISE:
        assert noise not in result.stdout + result.stderr, result.stderr[:2000]
    assert result.stdout.startswith(f"tfgpu {tfgpu.__version__} environment report")


@pytest.mark.parametrize(
    "verbose, level, hold_back",
    [
        (False, None, True),
        (False, "1", True),
        (False, "2", True),
        (False, "3", True),
        (False, "0", False),  # all of TensorFlow's log, asked for
        (False, " 0 ", False),
        (True, None, False),
        (True, "2", False),
    ],
)
def test_startup_log_is_held_back_unless_asked_for(verbose, level, hold_back):
    from tfgpu.cli import _hold_back_startup_log

    environ = {} if level is None else {"TF_CPP_MIN_LOG_LEVEL": level}
    assert _hold_back_startup_log(verbose, environ) is hold_back


def test_startup_noise_is_held_back_and_everything_else_goes_through(capfd):
    from tfgpu._internal.helpers.processes import startup_log_held_back

    lines = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        "I0000 00:00:1795965550.323854   16703 cudart_stub.cc:31] Could not find cuda drivers "
        "on your machine, GPU will not be used.\n",
        "E0000 00:00:1795965552.098812   16703 cuda_platform.cc:52] failed call to cuInit: "
        "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild "
        "TensorFlow with the appropriate compiler flags.\n",
        "W0000 00:00:1795965552.1 16703 gpu_device.cc:2342] Cannot dlopen some GPU libraries.\n",
        "E0000 00:00:1795965552.2 16703 some_op.cc:9] a real error\n",
        "UserWarning: from Python\n",
    ]
    with startup_log_held_back():
        for line in lines:
            os.write(2, line.encode())
    assert capfd.readouterr().err == "".join(lines[4:])
    with startup_log_held_back(enabled=False):
        os.write(2, lines[1].encode())
    assert capfd.readouterr().err == lines[1]


def test_verbose_is_accepted_by_every_command():
    from tfgpu.cli import _build_parser

    parser = _build_parser()
    assert parser.parse_args(["env", "--verbose"]).verbose is True
    assert parser.parse_args(["demo", "-v", "--quick"]).verbose is True
    assert parser.parse_args(["report", "runs/x"]).verbose is False


@pytest.mark.parametrize(
    "argv, verbose",
    [
        (["--verbose", "env"], True),
        (["-v", "env", "--json"], True),
        (["env", "-v"], True),
        (["-v", "env", "-v"], True),
        (["env"], False),
        (["--verbose", "demo", "--quick"], True),
        (["-v", "report", "runs/x", "--out", "o"], True),
    ],
)
def test_verbose_is_accepted_before_or_after_the_command(argv, verbose):
    from tfgpu.cli import _build_parser

    assert _build_parser().parse_args(argv).verbose is verbose


def test_verbose_before_the_command_runs_it(capsys):
    assert main(["--verbose", "env", "--json"]) == 0
    assert set(_strict_json(capsys.readouterr().out)) == {"facts", "findings"}


def test_an_unexpected_os_error_is_an_error_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    import tfgpu.report

    def fail(log_dir, *, out_dir):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(tfgpu.report, "write_report_and_problems", fail)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfgpu report: error: [Errno 13] Permission denied")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["tune", "--time-budget-s", "nan", "{script}"], r"`--time-budget-s`. Received: "
         r"--time-budget-s=nan. Expected a finite number of seconds > 0\.$"),
        (["tune", "--log-dir", "{file}", "{script}"], r"`--log-dir`. Received: --log-dir="),
        (["tune", "{script}", "--time-budget-s", "20"], r"`--time-budget-s`. Received: "
         r"--time-budget-s after SCRIPT.py, where it goes to the script .*train.py'"),
        (["run", "{script}", "--log-dir={dir}"], r"`--log-dir`. Received: --log-dir after "
         r"SCRIPT.py.*Expected tfgpu's options before the script: `tfgpu run --log-dir"),
        (["report", "{file}"], r"`LOG_DIR`. Received: LOG_DIR="),
        (["report", "{dir}", "--out", ""], r"`--out`. Received: --out=''. Expected a directory "
         r"path\.$"),
        (["demo", "--epochs", "0"], r"`--epochs`. Received: --epochs=0. Expected an int >= 1\.$"),
        (["demo", "--dataset", " "], r"`--dataset`. Received: --dataset=' '. Expected a "
         r"TensorFlow Datasets name such as cifar10 \(without --dataset: offline synthetic data\)"),
        (["demo", "--log-dir", "{file}/run"], r"`--log-dir`.*is under the file"),
        (["data-service", "worker", "--dispatcher", "x"], r"`--dispatcher`. Received: "
         r"--dispatcher='x'. Expected host:port or grpc://host:port"),
        (["data-service", "dispatcher", "--worker-timeout-s", "inf"], r"`--worker-timeout-s`"),
        (["data-service", "dispatcher", "--work-dir", "{file}"], r"`--work-dir`.*is a file"),
    ],
)  # fmt: skip
def test_command_line_errors_name_flags_and_values_a_command_line_can_pass(
    argv, match, tmp_path, capsys
):
    (tmp_path / "notes.txt").write_text("kept")
    (tmp_path / "train.py").write_text("print('never run')\n")
    values = {"file": tmp_path / "notes.txt", "script": tmp_path / "train.py", "dir": tmp_path}
    argv = [a.format(**values) for a in argv]
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert "usage: tfgpu" in err and re.search(match, err, re.MULTILINE), err
    for python_only in ("None", "a str", "os.PathLike", "Traceback"):
        assert python_only not in err
    python_name = r"(?<![-\w])(time_budget_s|log_dir|out_dir|work_dir|epochs|dataset)\b"
    assert not re.search(python_name, err), err
    assert (tmp_path / "notes.txt").read_text() == "kept"


def test_a_flag_after_the_script_that_the_script_names_is_the_scripts_own(tmp_path):
    from tfgpu.cli import _build_parser, _check_arguments

    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--steps')\n")
    args = _build_parser().parse_args(["tune", str(script), "--steps", "3"])
    _check_arguments(args)  # the script reads --steps: it goes to the script
    assert args.script_args == ["--steps", "3"] and args.steps == 30
