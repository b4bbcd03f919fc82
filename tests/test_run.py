"""`tfgpu run SCRIPT.py` (tfgpu/run/): the script runs as under `python SCRIPT.py` (its output,
its History and callbacks, its exit status), every `fit` is recorded into its own directory, the
longest diagnosed, the report written and summed up; an exception, `sys.exit` and Ctrl-C leave
complete records. Tiny scripts; the ones in this process skip the diagnosis unless marked slow."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import pytest

from tests.conftest import REPO
from tfgpu._internal.helpers.processes import raise_if_signalled
from tfgpu.cli import main
from tfgpu.run import _run, _summary
from tfgpu.run._run import run_script
from tfgpu.run._watch import FitRecord, Quiet

_SCRIPT = """\
import sys
import numpy as np
import keras

x = np.random.default_rng(0).random((256, 4), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(x, y, 32, 2, verbose=0{callbacks})
{check}
print("the script's own line")
{end}
"""


_NOTHING_ADDED = 'assert sorted(history.history) == ["loss"], history.history'


def _script(tmp_path: Path, *, callbacks: str = "", end: str = "", check=_NOTHING_ADDED) -> Path:
    path = tmp_path / "train.py"
    path.write_text(_SCRIPT.format(callbacks=callbacks, end=end, check=check))
    return path


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_each_fit_is_recorded_and_the_script_is_left_as_it_is(tmp_path, capsys):
    script = _script(tmp_path, end="model.fit(x, y, epochs=1, verbose=0)")
    status = run_script(script, [], log_dir=tmp_path / "run", diagnose=False)
    out, err = capsys.readouterr()
    assert status == 0
    assert out == "the script's own line\n"  # its stdout is the script's alone
    for k in (1, 2):
        fit = tmp_path / "run" / f"fit-{k}"
        assert len(_rows(fit / "steps.csv")) >= 1  # StepTimer's rows
        assert _rows(fit / "timeline.csv")  # GPUMonitor's samples
        assert (fit / "report.md").read_text().startswith("# tfgpu run report:")
    assert len(_rows(tmp_path / "run" / "fit-1" / "steps.csv")) == 16  # 2 epochs of 8 steps
    summary = (tmp_path / "run" / "summary.md").read_text()
    first = "tfgpu run: train.py ended (exit status 0) after 2 fit(s) in "
    assert first in summary and first in err
    assert f"fit 1 ({script}:9): 2 epoch(s) in " in err and " examples/s" in err
    assert f"report: {tmp_path / 'run' / 'fit-2' / 'report.md'}" in err


def test_the_scripts_own_tfgpu_callbacks_are_not_added_twice(tmp_path, capsys):
    mine = tmp_path / "mine"
    callbacks = f", callbacks=[__import__('tfgpu').callbacks.StepTimer(log_dir={str(mine)!r})]"
    script = _script(tmp_path, callbacks=callbacks, check="")
    assert run_script(script, [], log_dir=tmp_path / "run", diagnose=False) == 0
    err = capsys.readouterr().err
    assert (mine / "steps.csv").exists()
    assert not (tmp_path / "run" / "fit-1" / "steps.csv").exists()  # not a second StepTimer
    assert (tmp_path / "run" / "fit-1" / "timeline.csv").exists()  # GPUMonitor added
    assert f"StepTimer (the script's own, log_dir={mine}): not added again" in err


@pytest.mark.parametrize(
    ("end", "status", "ended", "stderr"),
    [
        ("raise ValueError('boom')", 1, "raised ValueError", "ValueError: boom"),
        ("sys.exit(3)", 3, "exited", ""),
        ("sys.exit('bad input')", 1, "exited", "bad input\n"),
        ("sys.exit(0)", 0, "ended", ""),
    ],
)
def test_how_the_script_ends_is_its_exit_status_with_complete_records(
    tmp_path, capsys, end, status, ended, stderr
):
    assert (
        run_script(_script(tmp_path, end=end), [], log_dir=tmp_path / "run", diagnose=False)
        == status
    )
    err = capsys.readouterr().err
    assert stderr in err
    if "Error" in stderr:  # the traceback as Python prints it, from the script's frame
        assert f'File "{tmp_path / "train.py"}", line 12, in <module>' in err
        assert "runpy" not in err and "tfgpu" not in err.split("tfgpu run:")[0]
    assert f"train.py {ended} (exit status {status})" in err
    assert len(_rows(tmp_path / "run" / "fit-1" / "steps.csv")) == 16
    assert (tmp_path / "run" / "fit-1" / "report.md").exists()


def test_a_fit_that_raises_leaves_its_records_and_says_so(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """\
            import numpy as np
            import keras

            class Stop(keras.callbacks.Callback):
                def on_train_batch_end(self, batch, logs=None):
                    if batch == 4:
                        raise RuntimeError("the data went away")

            x = np.zeros((256, 4), "float32")
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            model.fit(x, x[:, :1], epochs=3, verbose=0, callbacks=[Stop()])
            """
        )
    )
    assert run_script(script, [], log_dir=tmp_path / "run", diagnose=False) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: the data went away" in err
    assert "stopped by RuntimeError: the data went away" in err
    assert "no epoch ended (the report has its steps)" in err
    # Each step whose end StepTimer saw (the script's callback raised before it saw the 5th).
    assert len(_rows(tmp_path / "run" / "fit-1" / "steps.csv")) == 4
    assert (tmp_path / "run" / "fit-1" / "report.md").exists()


@pytest.mark.skipif(os.name != "posix", reason="SIGTERM: POSIX")
@pytest.mark.parametrize(
    ("sig", "status", "ended"),
    [(signal.SIGINT, 130, "was interrupted by Ctrl-C"), (signal.SIGTERM, 143, "exited")],
    ids=["Ctrl-C", "SIGTERM"],
)
@pytest.mark.parametrize(("at", "rows"), [(4, 5), (7, 8)], ids=["mid-epoch", "last batch"])
def test_a_signal_whose_exception_was_swallowed_still_ends_the_fit_and_the_script(
    tmp_path, capsys, sig, status, ended, at, rows
):
    # The handler's exception can be raised inside a Python call that TensorFlow's C++ makes
    # and clears; then the script would train on for all its epochs (seen with both signals
    # in full suites). Swallowed here on purpose.
    swallowed = tmp_path / "swallowed"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import pathlib, signal
            import numpy as np
            import keras

            class Swallow(keras.callbacks.Callback):
                def on_train_batch_end(self, batch, logs=None):
                    if batch == {at}:
                        try:
                            signal.raise_signal({int(sig)})  # its handler runs in here
                        except BaseException:
                            pathlib.Path({str(swallowed)!r}).write_text("swallowed")

            try:  # caught by the script before its fit, on purpose: the fit runs on
                signal.raise_signal({int(sig)})
            except BaseException:
                pass
            x = np.zeros((256, 4), "float32")
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile("sgd", "mse")
            model.fit(x, x[:, :1], epochs={1 if at == 7 else 3}, verbose=0, callbacks=[Swallow()])
            print("after the fit")
            """
        )
    )
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as under `python`
    try:
        assert run_script(script, [], log_dir=tmp_path / "run", diagnose=False) == status
    finally:
        signal.signal(signal.SIGINT, before)
    assert swallowed.exists()
    out, err = capsys.readouterr()
    assert f"train.py {ended} (exit status {status})" in err and "after the fit" not in out
    assert len(_rows(tmp_path / "run" / "fit-1" / "steps.csv")) == rows  # no batch after it
    raise_if_signalled()  # the record ends with `tfgpu run`


def test_a_script_without_fit_says_so(tmp_path, capsys):
    script = tmp_path / "nofit.py"
    script.write_text("print('hello')\n")
    assert run_script(script, [], log_dir=tmp_path / "run") == 0
    err = capsys.readouterr().err
    assert "after no fit" in err and "nothing to diagnose: the script called no fit" in err


def test_the_default_run_directory_is_named_after_the_script(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "nofit.py"
    script.write_text("print('hello')\n")
    assert run_script(script, [], diagnose=False) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("nofit-") and (run / "summary.md").exists()
    assert f"records in runs/{run.name}" in capsys.readouterr().err


def test_the_callbacks_run_on_a_copy_of_the_logs():
    seen = []

    class Adds(keras.callbacks.Callback):
        async_safe = True

        def on_epoch_end(self, epoch, logs=None):
            logs["examples_per_s"] = 10.0

        def on_train_batch_end(self, batch, logs=None):
            seen.append((batch, dict(logs)))
            logs["extra"] = 1

    quiet = Quiet(Adds())
    shared = {"loss": 1.0}
    quiet.on_train_batch_end(3, shared)  # positional logs, as Keras passes them
    quiet.on_train_batch_end(4, logs=shared)
    quiet.on_epoch_end(0, shared)
    assert shared == {"loss": 1.0}  # the script's logs: untouched
    assert seen == [(3, {"loss": 1.0}), (4, {"loss": 1.0})]
    assert quiet.epochs == [{"loss": 1.0, "examples_per_s": 10.0}] and quiet.async_safe
    record = FitRecord(1, None, Path("x"), added=[quiet])
    assert record.figure("examples_per_s") == 10.0 and math.isnan(record.figure("mfu"))


def test_the_longest_fit_is_the_one_diagnosed():
    records = [
        FitRecord(k, None, Path(f"fit-{k}"), seconds=s) for k, s in ((1, 5.0), (2, 9.0), (3, 9.0))
    ]
    assert _run._longest(records).index == 2
    assert _run._longest([]) is None


def test_the_summary_says_how_it_ended_and_where_to_change(tmp_path):
    class Finding:
        kind, title = "host_overhead", "Host-overhead-bound: steps are so short"
        recommendation = "`model.compile(..., steps_per_execution=16)`"

    class Diagnosis:
        examples_per_s, time_s, bottleneck, findings = 1234.0, 8.0, "host_overhead", [Finding]

    class Call:
        def where(self, kind):
            return {"compile": "train.py:7 (the model's compile call)"}[kind]

    record = FitRecord(1, None, tmp_path, Call(), seconds=3.0, ended="KeyboardInterrupt")
    outcome = _summary.Outcome(Path("train.py"), 130, 4.0, tmp_path, "was interrupted by Ctrl-C")
    outcome.diagnosis, outcome.notes = Diagnosis(), ["a note"]
    lines = _summary.summary_lines(outcome, [record], record)
    assert lines[0].startswith("tfgpu run: train.py was interrupted by Ctrl-C (exit status 130)")
    assert "no epoch ended" in lines[1] and "stopped by KeyboardInterrupt" in lines[1]
    assert lines[2:] == [
        "  diagnosis of fit 1 (8 s): bottleneck host_overhead · 1,234 examples/s measured",
        "    Host-overhead-bound: steps are so short",
        "    change: `model.compile(..., steps_per_execution=16)`",
        "    where: train.py:7 (the model's compile call)",
        "  to try every setting on it, measured: tfgpu tune train.py",
        "  note: a note",
    ]
    assert _summary.ending(KeyboardInterrupt(), 130) == "was interrupted by Ctrl-C"
    assert _summary.ending(SystemExit(143), 143) == "exited"


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["run", "missing.py"], r"argument `SCRIPT\.py`\. Received: SCRIPT\.py='missing\.py'"),
        (["run", "--diagnose-budget-s", "0", "{script}"], r"--diagnose-budget-s=0\.0"),
        (["run", "--log-dir", "{script}", "{script}"], r"argument `--log-dir`.*is a file"),
    ],
)
def test_the_command_line_checks_its_arguments_first(tmp_path, capsys, argv, match):
    import re

    script = _script(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([a.format(script=script) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tfgpu run" in err and re.search(match, err), err


@pytest.mark.slow
def test_the_longest_fit_is_diagnosed_with_where_to_change(tmp_path, capsys):
    script = _script(tmp_path)
    assert run_script(script, [], log_dir=tmp_path / "run", diagnose_budget_s=10) == 0
    out, err = capsys.readouterr()
    assert out == "the script's own line\n"  # diagnose's lines go to stderr
    saved = json.loads((tmp_path / "run" / "fit-1" / "diagnosis.json").read_text())
    assert saved["bottleneck"] in ("input", "host_overhead", "compute", "inconclusive")
    assert "## Diagnosis" in (tmp_path / "run" / "fit-1" / "report.md").read_text()
    assert "diagnosis of fit 1 (" in err and "bottleneck " in err


# Ctrl-C: the script is stopped inside its fit by SIGINT, as a terminal sends it.
_LONG = """\
import pathlib, sys
import numpy as np
import keras

class Started(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 3:
            pathlib.Path(sys.argv[1]).write_text("fitting")

x = np.zeros((4096, 4), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(x, x[:, :1], batch_size=8, epochs=10000, verbose=0, callbacks=[Started()])
"""


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="signals to a process: POSIX")
@pytest.mark.parametrize(
    ("sig", "status", "ended"),
    [
        (signal.SIGINT, 130, "was interrupted by Ctrl-C"),
        (signal.SIGTERM, 143, "exited"),
    ],
    ids=["Ctrl-C", "SIGTERM"],
)
def test_a_stopped_script_leaves_complete_records_the_diagnosis_and_the_report(
    tmp_path, sig, status, ended
):
    script, started, log = tmp_path / "long.py", tmp_path / "started", tmp_path / "run"
    script.write_text(_LONG)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfgpu", "run", "--log-dir", str(log),
         "--diagnose-budget-s", "5", str(script), str(started)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # As from a terminal: a suite started in the background (`make test &`) hands its
        # children SIGINT ignored, which Python then keeps ignoring.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        for _ in range(2400):  # TensorFlow starts first
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), proc.communicate()[1][-3000:]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err[-3000:]
    assert f"long.py {ended} (exit status {status})" in err
    assert ("KeyboardInterrupt" in err) == (sig == signal.SIGINT)  # Python's traceback
    rows = _rows(log / "fit-1" / "steps.csv")
    assert len(rows) >= 4 and all(float(r["step_time_s"]) > 0 for r in rows)  # complete rows
    assert (log / "fit-1" / "diagnosis.json").exists()  # stopped once: the diagnosis still ran
    assert (log / "fit-1" / "report.md").exists() and (log / "summary.md").exists()
