"""`tfgpu tune SCRIPT.py` (tfgpu/tuning/_script.py): the settings that need a fresh process.

The search runs on scripted child runs and a scripted clock (no test depends on this
machine's speed); one real run of a tiny script in child processes checks the structure only.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO, ScriptedTiming
from tests.test_processes import ended_within
from tfgpu.cli import main
from tfgpu.tuning import TuneResult, _script
from tfgpu.tuning._candidates import process_settings
from tfgpu.tuning._script import ChildRun, child_outcome

XLA = "XLA auto-clustering"
THREADS = "thread counts"


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('never run by the scripted tests')\n")
    return path


@pytest.fixture
def clock(monkeypatch):
    """The scripted engine's clock, from 0 (each child run advances it by 10 s)."""
    engine = ScriptedTiming(monkeypatch)
    engine.clock = 0.0
    return engine


def _scripted(monkeypatch, clock, times, *, batch=32, gpus=0, calls=None, search=None):
    """Child runs whose step time comes from `times(change, n)` (n: the nth run of that
    setting); None -> the child failed. The in-process search's child gives `search` (a
    `TuneResult.to_dict()`; None: a search that found nothing to try)."""
    counts: dict[str, int] = {}

    def run(script, script_args, change, steps, warmup, timeout_s, search_s=None):
        clock.clock += 10.0
        if search_s is not None:
            if calls is not None:
                calls.append({"search": search_s})
            return ChildRun(tune=search or {"trials": [], "speedup": None, "notes": []})
        key = json.dumps(change, sort_keys=True)
        n = counts.get(key, 0)
        counts[key] = n + 1
        if calls is not None:
            calls.append(dict(change))
        value = times(change, n)
        if value is None:
            return ChildRun(error="the script failed (exit status 1): boom", gpus=gpus, wall_s=10)
        return ChildRun(value, batch, gpus, wall_s=10.0)

    monkeypatch.setattr(_script, "_run_child", run)


def _which(change):
    if "TF_XLA_FLAGS" in change and "TF_NUM_INTEROP_THREADS" in change:
        return "both"
    if "TF_XLA_FLAGS" in change:
        return "xla"
    if "TF_NUM_INTEROP_THREADS" in change:
        return "threads"
    return "base"


def test_a_setting_that_clearly_helps_is_kept_one_within_noise_is_not(monkeypatch, clock, script):
    wobble = itertools.cycle([0.97, 1.04, 0.99, 1.06, 1.0, 0.95, 1.03])

    def times(change, n):
        which = _which(change)
        return {"base": 0.010, "xla": 0.006, "threads": 0.010 * next(wobble)}[which]

    _scripted(monkeypatch, clock, times)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert isinstance(result, TuneResult)
    xla, threads = result.trial(XLA), result.trial(THREADS)
    assert xla.status == "kept" and xla.gain.value == pytest.approx(0.010 / 0.006)
    assert threads.status == "no measurable gain"
    assert result.settings == {"TF_XLA_FLAGS": xla.change["TF_XLA_FLAGS"]}
    # Where to set it: the shell that starts the script, or the top of the script.
    assert result.lines == [
        f"in the shell that starts the script: {xla.line}",
        f"or {script}:1 (the top of the script, before it imports TensorFlow): import os; "
        f"os.environ['TF_XLA_FLAGS'] = {xla.change['TF_XLA_FLAGS']!r}",
    ]
    assert result.diff.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+os.environ['TF_XLA_FLAGS'] = " in result.diff
    assert result.speedup.value == pytest.approx(0.010 / 0.006)
    assert result.baseline_examples_per_s == pytest.approx(32 / 0.010)
    # Without a GPU, the GPU settings are listed as untried, with the reason.
    gpu_only = [t for t in result.trials if "TF_GPU" in json.dumps(t.change)]
    assert len(gpu_only) == 2
    assert all(t.status == "untried" and "needs a GPU" in t.reason for t in gpu_only)
    assert "kept" in str(result) and "export TF_XLA_FLAGS=" in str(result)
    # Fresh-process settings each alone, against the baseline; the header says so.
    assert str(result).startswith("tune: each setting against the best so far (in the script's")
    assert "or the baseline (fresh processes)" in str(result).splitlines()[0]


def test_a_setting_that_clearly_hurts_is_rejected_after_one_round(monkeypatch, clock, script):
    calls: list[dict] = []

    def times(change, n):
        return {"base": 0.010, "xla": 0.030, "threads": 0.010}[_which(change)]

    _scripted(monkeypatch, clock, times, calls=calls)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert result.trial(XLA).status == "slower"
    assert sum(1 for c in calls if _which(c) == "xla") == 1  # not run again
    assert result.settings == {} and result.lines == [] and result.speedup.value == 1.0


def test_gpu_settings_are_tried_where_the_script_sees_a_gpu(monkeypatch, clock, script):
    calls: list[dict] = []
    _scripted(monkeypatch, clock, lambda change, n: 0.010, gpus=1, calls=calls)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert {"TF_GPU_THREAD_MODE": "gpu_private"} in calls
    assert {"TF_GPU_ALLOCATOR": "cuda_malloc_async"} in calls
    assert all(t.status == "no measurable gain" for t in result.trials)


def test_kept_settings_are_verified_together_and_the_weakest_dropped(monkeypatch, clock, script):
    def times(change, n):
        # Each helps alone, but together they are no faster than XLA alone... and the
        # verification against the baseline still clears the margin with XLA only.
        return {"base": 0.010, "xla": 0.006, "threads": 0.008, "both": 0.0099}[_which(change)]

    _scripted(monkeypatch, clock, times)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert result.trial(XLA).status == "kept"
    threads = result.trial(THREADS)
    assert threads.status == "borderline" and "together" in threads.reason
    assert set(result.settings) == {"TF_XLA_FLAGS"}
    assert result.speedup.value == pytest.approx(0.010 / 0.006)
    assert any("dropped at the verification" in n for n in result.notes)


def test_kept_settings_verified_together_give_the_combined_speedup(monkeypatch, clock, script):
    def times(change, n):
        return {"base": 0.010, "xla": 0.006, "threads": 0.008, "both": 0.005}[_which(change)]

    _scripted(monkeypatch, clock, times)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert set(result.settings) == {"TF_XLA_FLAGS", "TF_NUM_INTEROP_THREADS"}
    assert result.speedup.value == pytest.approx(2.0)
    exports = result.lines[0]
    assert "export TF_XLA_FLAGS=" in exports and "export TF_NUM_INTEROP_THREADS=1" in exports


def test_a_setting_whose_run_fails_is_reported_failed(monkeypatch, clock, script):
    def times(change, n):
        return None if _which(change) == "threads" else 0.010

    _scripted(monkeypatch, clock, times)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    threads = result.trial(THREADS)
    assert threads.status == "failed" and "boom" in threads.reason


def test_a_baseline_that_fails_raises_with_the_scripts_error(monkeypatch, clock, script):
    _scripted(monkeypatch, clock, lambda change, n: None)
    with pytest.raises(RuntimeError, match=r"did not reach a timed fit: .*boom"):
        _script.tune_script(script, time_budget_s=None, verbose=0)


def test_the_budget_is_respected(monkeypatch, clock, script):
    calls: list[dict] = []
    _scripted(monkeypatch, clock, lambda change, n: 0.010, calls=calls)
    # 10 s per child: after the baseline, 15 s hold one more run and no search.
    result = _script.tune_script(script, time_budget_s=25.0, verbose=0)
    assert calls == [{}, {"TF_XLA_FLAGS": process_settings(False)[0][1]["TF_XLA_FLAGS"]}]
    # The one that ran is said as measured once; the other was never started, and says so.
    assert result.trial(XLA).status == "untried"
    assert result.trial(XLA).reason == (
        "time budget spent after 1 of 3 rounds (x1.00); then a run was not started (5 s left, a "
        "run of the script takes about 10 s here)"
    )
    threads = result.trial(THREADS)
    assert threads.status == "untried"
    assert threads.reason == (
        "time budget spent: a run was not started (5 s left, a run of the script takes about "
        "10 s here)"
    )
    assert result.settings == {}
    search = result.trial(_script.SEARCH)
    assert search.status == "untried"
    assert (
        search.reason == "time budget spent: 15 s left, a run of the script takes about 10 s here"
    )
    # Never "nothing helped" about what was not measured.
    assert "nothing to change" not in str(result)
    assert "not measured: 3 of 5 candidates untried (time budget spent" in str(result)


def test_tune_json_and_the_waterfall_are_written(monkeypatch, clock, script, tmp_path):
    def times(change, n):
        return {"base": 0.010, "xla": 0.005, "threads": 0.010}[_which(change)]

    _scripted(monkeypatch, clock, times)
    _script.tune_script(script, time_budget_s=None, verbose=0, log_dir=tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "tune.json").read_text())
    assert saved["settings"] == {"TF_XLA_FLAGS": process_settings(False)[0][1]["TF_XLA_FLAGS"]}
    assert (tmp_path / "run" / "tune.png").stat().st_size > 0


def test_environment_changes_append_to_xla_flags():
    from tfgpu.tuning._candidates import merged

    env = merged({"TF_XLA_FLAGS": "--a", "X": "1"}, {"TF_XLA_FLAGS": "--b", "Y": "2"})
    assert env == {"TF_XLA_FLAGS": "--a --b", "X": "1", "Y": "2"}
    assert merged({}, {"TF_XLA_FLAGS": "--b"}) == {"TF_XLA_FLAGS": "--b"}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"script": 3}, TypeError, "Invalid type for argument `script`"),
        ({"script": "missing.py"}, ValueError, "Invalid value for argument `script`"),
        ({"script_args": "--epochs 1"}, TypeError, "argument `script_args`"),
        ({"steps": 2}, ValueError, "argument `steps`"),
        ({"warmup": 1.5}, TypeError, "argument `warmup`"),
        ({"time_budget_s": 0}, ValueError, "argument `time_budget_s`"),
        ({"verbose": "loud"}, ValueError, "argument `verbose`"),
    ],
)
def test_bad_arguments_raise_before_any_run(monkeypatch, script, kwargs, error, match):
    monkeypatch.setattr(_script, "_run_child", lambda *a: pytest.fail("a child ran"))
    kwargs = {"script": script, **kwargs}
    with pytest.raises(error, match=match):
        _script.tune_script(**kwargs)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["--time-budget-s", "nan"],
            r"--time-budget-s=nan\. Expected a finite number of seconds > 0\.",
        ),
        (["--time-budget-s", "inf"], r"--time-budget-s=inf\."),
        (["--time-budget-s", "1e999"], r"--time-budget-s=inf\."),  # overflows to inf
        (["--time-budget-s", "-5"], r"--time-budget-s=-5\.0\."),
        (["--time-budget-s", "0"], r"--time-budget-s=0\.0\."),
        (["--steps", "2"], r"argument `--steps`\. Received: --steps=2\. Expected an int >= 3"),
        (["--steps", str(10**30)], r"argument `--steps`.*<= 1000000"),
        (["--warmup", "0"], r"argument `--warmup`\. Received: --warmup=0\."),
        (
            ["--log-dir", ""],
            r"argument `--log-dir`\. Received: --log-dir=''\. Expected a directory path\.",
        ),
        (["--log-dir", "{script}"], r"argument `--log-dir`.*train\.py' is a file"),
        (["--log-dir", "{script}/sub"], r"argument `--log-dir`.*is under the file"),
    ],
)
def test_the_command_line_names_its_flags_and_values_it_can_pass(
    monkeypatch, script, argv, match, capsys
):
    monkeypatch.setattr(_script, "_run_child", lambda *a: pytest.fail("a child ran"))
    argv = [a.format(script=script) for a in argv]
    with pytest.raises(SystemExit) as e:
        main(["tune", *argv, str(script)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tfgpu tune" in err and re.search(match, err), err
    for python_only in ("None", "time_budget_s", "log_dir", "os.PathLike", "Traceback"):
        assert python_only not in err


def test_a_missing_script_is_named_as_the_command_line_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["tune", str(tmp_path / "missing.py")])
    assert "argument `SCRIPT.py`. Received: SCRIPT.py=" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("status", "report", "output", "error"),
    [
        (0, "", "", "the script ended (exit status 0) without calling `fit`"),
        (0, "{torn", "I0000 start-up", "the script ended (exit status 0) without calling `fit`"),
        (
            3,
            "",
            "one\ntwo\nusage: train.py\ntrain.py: error: bad\n",
            "the script exited with status 3: one; two; usage: train.py; train.py: error: bad",
        ),
        (1, "", "", "the script exited with status 1"),
        (-9, "", "", "the script was killed by SIGKILL"),
        (-200, "", "", "the script was killed by signal 200"),
        (
            0,
            '{"error": "the script called sys.exit(0) without calling `fit`", "gpus": 1}',
            "",
            "the script called sys.exit(0) without calling `fit`",
        ),
        (0, '{"error": "fit failed: ValueError: x", "gpus": 0}', "", "fit failed: ValueError: x"),
    ],
)
def test_what_a_child_run_says_is_told_in_words(status, report, output, error):
    assert child_outcome(status, report, output).error == error


def test_a_child_run_that_timed_its_fit_reports_its_numbers():
    run = child_outcome(0, '{"step_s": 0.01, "batch": 32, "gpus": 2}', "noise")
    assert run == ChildRun(0.01, 32, 2)


def test_the_command_prints_the_table_and_the_lines_to_set(monkeypatch, clock, script, capsys):
    def times(change, n):
        return {"base": 0.010, "xla": 0.005, "threads": 0.010}[_which(change)]

    _scripted(monkeypatch, clock, times)
    from tfgpu.cli import _build_parser

    parser = _build_parser()
    # tfgpu's options come before SCRIPT.py; everything after it is the script's.
    args = parser.parse_args(["tune", "--time-budget-s", "1000", str(script), "--epochs", "3"])
    assert args.script_args == ["--epochs", "3"] and args.time_budget_s == 1000.0
    assert _script.run_command(args) == 0
    out = capsys.readouterr().out
    assert "in the shell that starts the script: export TF_XLA_FLAGS=" in out

    bad = parser.parse_args(["tune", "--steps", "1", str(script)])
    assert _script.run_command(bad) == 2
    assert "tfgpu tune: error:" in capsys.readouterr().err


_TINY_SCRIPT = """
import sys
import numpy as np
import keras

marker = sys.argv[1]
x = np.random.default_rng(0).random((256, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(x, y, batch_size=16, epochs=50, verbose=0)
open(marker, "w").write("the script went on after the first fit")
"""


@pytest.mark.slow
def test_a_real_script_runs_in_child_processes_and_stops_after_its_first_fit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_TINY_SCRIPT))
    marker = tmp_path / "after_fit.txt"
    run = _script._run_child(script, [str(marker)], {}, 3, 1, 120.0)
    assert run.error == "" and run.step_s is not None and run.step_s > 0
    assert run.batch == 16 and run.gpus >= 0
    assert not marker.exists()  # nothing after the first fit ran

    # A child applies a setting it verifies, and the policy set before the script runs.
    run = _script._run_child(
        script,
        [str(marker)],
        {"steps_per_execution": 4, "precision": "mixed_bfloat16"},
        8,
        4,
        120.0,
    )
    assert run.error == "" and run.policy == "mixed_bfloat16" and run.data == "arrays"
    assert run.places["compile"] == [str(script), 11] and run.places["fit"] == [str(script), 12]
    assert run.loss is not None and math.isfinite(run.loss)
    assert not marker.exists()


@pytest.mark.slow
def test_tune_on_an_unchanged_script_end_to_end(tmp_path):
    """The command on a real script in real children: the baseline, the search in the
    script's process, fresh processes; structure only (no speed is asserted)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_TINY_SCRIPT))
    marker, log = tmp_path / "after_fit.txt", tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "tfgpu", "tune", "--time-budget-s", "60", "--steps", "6",
         "--warmup", "2", "--log-dir", str(log), str(script), str(marker)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((log / "tune.json").read_text())
    by_name = {t["name"]: t for t in saved["trials"]}
    assert XLA in by_name and THREADS in by_name  # the fresh-process settings' rows
    # The search in the script's process ran, or its row says that the budget left it out (a
    # heavily loaded machine: the baseline's runs took the budget).
    if _script.SEARCH in by_name:
        search = by_name[_script.SEARCH]
        assert search["status"] == "untried", search
        assert search["reason"].startswith("time budget spent: "), search
    else:
        ladder = [t for name, t in by_name.items() if name.startswith("steps_per_execution=")]
        assert "steps_per_execution=4" in by_name
        for row in ladder:  # measured, or why not (the budget, a slower rung below, ...)
            assert row["status"] != "untried" or row["reason"], row
    assert "needs a fresh process" not in proc.stdout
    for line in saved["lines"]:  # each kept setting with its place in the script
        assert str(script) in line or line.startswith("in the shell"), line
    assert saved["time_s"] <= 60 * 1.1
    assert not marker.exists()


@pytest.mark.slow
def test_a_script_that_exits_before_fit_is_told_so(tmp_path):
    script = tmp_path / "early.py"
    script.write_text("import sys\nprint('preparing')\nsys.exit(0)\n")
    run = _script._run_child(script, [], {}, 3, 1, 120.0)
    assert run.error == "the script called sys.exit(0) without calling `fit`"


# The script starts a process of its own, writes both pids, and waits (it never reaches fit).
_HANGS = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {helper.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""

_TUNE_COMMAND = (
    "import argparse, sys; from tfgpu.tuning._script import run_command; "
    "sys.exit(run_command(argparse.Namespace(script=sys.argv[1], script_args=sys.argv[2:], "
    "steps=3, warmup=1, time_budget_s=None, log_dir=None)))"
)


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="process groups and signals: POSIX")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_tune_leaves_no_process_and_no_file_behind(tmp_path, sig):
    script, pids, temp = tmp_path / "hangs.py", tmp_path / "pids", tmp_path / "tmp"
    script.write_text(textwrap.dedent(_HANGS))
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(temp)}
    with open(tmp_path / "tune.log", "wb") as log:
        parent = subprocess.Popen(
            [sys.executable, "-c", _TUNE_COMMAND, str(script), str(pids)],
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        for _ in range(3600):  # both processes import TensorFlow before the script runs
            if pids.exists() or parent.poll() is not None:
                break
            time.sleep(0.05)
        assert pids.exists(), (tmp_path / "tune.log").read_text()[-3000:]
        runner, helper = map(int, pids.read_text().split())
        parent.send_signal(sig)
        parent.wait(120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert parent.returncode == (128 + sig if sig == signal.SIGTERM else -sig)
    assert ended_within(runner)  # the script's process: with its group, or by the death signal
    if sig == signal.SIGTERM:
        assert ended_within(helper)  # the script's own process, ended with its group
    else:  # a SIGKILLed parent runs no code: what the script started is the script's own
        os.kill(helper, signal.SIGKILL)
    assert list(temp.iterdir()) == []  # the report travelled through no named file


# The in-process search on scripted steps: the script's own model and data handed to
# `tfgpu.tune` in this process (as the child does), the time children scripted.

_HOST_BOUND = """\
import numpy as np
import keras

x = np.random.default_rng(0).random((512, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse"{jit})
model.fit(x, y, 32, 2, validation_split=0.25)
raise SystemExit("nothing after the first fit runs in a child")
"""


@pytest.fixture
def in_process(monkeypatch):
    """A CPU without native bfloat16, one core, and a batch-size search that finds nothing
    faster (tune's own tests do the same); the global policy put back."""
    import keras

    import tfgpu.batch_size
    from tests.conftest import CPU_FACTS, FoundOneSize
    from tfgpu._internal.measure import facts as facts_module

    monkeypatch.setattr(facts_module, "device_facts", lambda: {**CPU_FACTS, "cpu_count": 1})
    monkeypatch.setattr(
        tfgpu.batch_size, "find_batch_size", lambda model, data, **k: FoundOneSize(32)
    )
    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


def _children_here(monkeypatch, clock, times, calls):
    """Children run in this process: the search one runs `tfgpu.tune` on the script's first
    fit (steps from `clock`, the scripted engine), the first time one the real first fit for
    its facts and places (the others reuse them), each step time scripted by `times(change)`."""
    facts: dict = {}

    def run(script, script_args, change, steps, warmup, timeout_s, search_s=None):
        calls.append({"search": search_s} if search_s else dict(change))
        if search_s:
            data = _script.run_to_first_fit(
                script, script_args, {"mode": "search", "search_s": search_s}
            )
            clock.clock += 10.0
            return ChildRun(tune=data.get("tune"), error=data.get("error", ""))
        if not facts:
            spec = {"mode": "time", "steps": 3, "warmup": 1, "settings": {}, "policy": ""}
            facts.update(_script.run_to_first_fit(script, script_args, spec))
            assert not facts.get("error"), facts
        data = facts
        clock.clock += 10.0
        return ChildRun(
            times(change), data["batch"], 0, wall_s=10.0, places=data["places"],
            data=data["data"], policy=data["policy"], loss=data["loss"],
        )  # fmt: skip

    monkeypatch.setattr(_script, "_run_child", run)


@pytest.mark.slow
def test_a_host_bound_script_keeps_steps_per_execution_with_its_compile_line(
    monkeypatch, tmp_path, in_process
):
    spe_times = {1: 0.004, 4: 0.0015, 16: 0.0014, 64: 0.0014}
    engine = ScriptedTiming(monkeypatch, lambda m, d: spe_times[int(m.steps_per_execution)])
    engine.clock = 0.0
    script = tmp_path / "train.py"
    script.write_text(_HOST_BOUND.format(jit=""))
    calls: list[dict] = []
    _children_here(monkeypatch, engine, lambda change: 0.010, calls)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert result.settings.get("steps_per_execution", 1) > 1
    spe = result.settings["steps_per_execution"]
    assert set(result.settings) == {"steps_per_execution"}
    assert result.lines == [
        f"{script}:7 (the model's compile call): model.compile(..., steps_per_execution={spe})"
    ]
    assert (
        f'-model.compile(optimizer="adam", loss="mse")\n'
        f'+model.compile(optimizer="adam", loss="mse", steps_per_execution={spe})\n'
    ) in result.diff
    # One table: the in-process trials, then each fresh-process setting measured in children.
    names = [t.name for t in result.trials]
    assert names[0] == "steps_per_execution=4" and names.count(XLA) == 1
    assert result.trial(XLA).status == "no measurable gain"
    assert "needs a fresh process" not in str(result)  # tune's own "untried" rows replaced
    assert "verified together in the script's process by tfgpu.tune" in result.notes
    # The search timed the fit as the script calls it: batch 32, the validation part cut off.
    assert any("of 12 batches" in n for n in result.notes)  # 384 examples / 32
    assert calls[1] == {"search": _script.rules.SEARCH_BUDGET_S}


@pytest.mark.slow
def test_an_xla_slowed_script_keeps_jit_compile_false(monkeypatch, tmp_path, in_process):
    engine = ScriptedTiming(monkeypatch, lambda m, d: 0.05 if m.jit_compile else 0.01)
    engine.clock = 0.0
    script = tmp_path / "train.py"
    script.write_text(_HOST_BOUND.format(jit=", jit_compile=True"))
    _children_here(monkeypatch, engine, lambda change: 0.010, [])
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert result.settings.get("jit_compile") is False
    assert result.trial("jit_compile=False").status == "kept"
    assert result.lines[0].startswith(f"{script}:7 (the model's compile call): model.compile(")
    assert "jit_compile=False" in result.lines[0]
    assert '+model.compile(optimizer="adam", loss="mse", jit_compile=False' in result.diff


def test_a_policy_the_search_cannot_try_is_tried_in_a_fresh_process_and_verified_with_the_rest(
    monkeypatch, clock, script
):
    from tfgpu.tuning._candidates import FRESH_PROCESS, NEEDS_FACTORY

    record = {
        "trials": [
            {"name": "steps_per_execution=4", "change": {"steps_per_execution": 4},
             "gain": {"value": 1.5, "low": 1.3, "high": 1.6}, "status": "kept",
             "reason": "over 3 rounds", "line": "model.compile(..., steps_per_execution=4)"},
            {"name": "precision mixed_bfloat16", "change": {"precision": "mixed_bfloat16"},
             "gain": None, "status": "untried", "reason": NEEDS_FACTORY, "line": "configure"},
            {"name": XLA, "change": {}, "gain": None, "status": "untried",
             "reason": FRESH_PROCESS, "line": "export TF_XLA_FLAGS=..."},
        ],
        "speedup": {"value": 1.5, "low": 1.3, "high": 1.6},
        "notes": ["each timed fit ran 1 whole epoch(s)"],
    }  # fmt: skip
    calls: list[dict] = []

    def times(change, n):
        if change.get("precision") and change.get("steps_per_execution"):
            return 0.004  # together
        return 0.006 if change.get("precision") else 0.010

    _scripted(monkeypatch, clock, times, calls=calls, search=record)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    policy = result.trial("precision mixed_bfloat16")
    assert policy.status == "kept" and policy.gain.value == pytest.approx(0.010 / 0.006)
    assert {"precision": "mixed_bfloat16"} in calls  # its own fresh processes
    together = {"precision": "mixed_bfloat16", "steps_per_execution": 4}
    assert together in calls  # verified in fresh processes, the child applying the rest
    assert result.speedup.value == pytest.approx(0.010 / 0.004)
    assert result.settings == together
    assert [t.name for t in result.trials].count(XLA) == 1  # tried here, not listed twice
    assert any(
        "mixed_precision.set_global_policy('mixed_bfloat16')" in line for line in result.lines
    )
    assert "in the script's process: each timed fit ran 1 whole epoch(s)" in result.notes


def test_a_setting_a_child_cannot_apply_stays_kept_out_of_the_verification(
    monkeypatch, clock, script
):
    record = {
        "trials": [
            {"name": "static batch shape", "change": {"drop_remainder": True},
             "gain": {"value": 1.2, "low": 1.1, "high": 1.3}, "status": "kept",
             "reason": "over 3 rounds", "line": "dataset = dataset.batch(32, drop_remainder=True)"},
        ],
        "speedup": {"value": 1.2, "low": 1.1, "high": 1.3},
    }  # fmt: skip
    calls: list[dict] = []

    def times(change, n):
        return {"base": 0.010, "xla": 0.005, "threads": 0.010}[_which(change)]

    _scripted(monkeypatch, clock, times, calls=calls, search=record)
    result = _script.tune_script(script, time_budget_s=None, verbose=0)
    assert result.trial("static batch shape").status == "kept"
    assert not any("drop_remainder" in c for c in calls)  # no child was asked to apply it
    assert any(
        n.startswith("static batch shape: kept in the script's process") for n in result.notes
    )
    assert result.speedup.value == pytest.approx(2.0)  # XLA alone, against the baseline


def test_a_child_whose_script_sets_its_own_policy_fails_the_policy_setting(
    monkeypatch, clock, script
):
    runs = _script.ProcessVariants(script, [], 3, 1, _script_budget(None), _Quiet())

    def run(script, script_args, change, steps, warmup, timeout_s, search_s=None):
        return ChildRun(0.01, 32, policy="float32", wall_s=1.0)

    monkeypatch.setattr(_script, "_run_child", run)
    with pytest.raises(_script.ChildFailed, match=r"sets its own precision policy \(float32\)"):
        runs.run_for({"precision": "mixed_bfloat16"}, "precision")(None, None)

    def nan_loss(script, script_args, change, steps, warmup, timeout_s, search_s=None):
        return ChildRun(0.01, 32, policy="mixed_bfloat16", loss=float("nan"), wall_s=1.0)

    monkeypatch.setattr(_script, "_run_child", nan_loss)
    with pytest.raises(_script.ChildFailed, match="unsafe numerics: the loss is not finite"):
        runs.run_for({"precision": "mixed_bfloat16"}, "precision")(None, None)


def test_a_child_cut_by_the_budget_is_said_so(monkeypatch, clock, script):
    def run(script, script_args, change, steps, warmup, timeout_s, search_s=None):
        clock.clock += 10.0
        if search_s is not None:
            return ChildRun(tune={"trials": []})
        if change:  # every setting's run is longer than the budget left: the budget cuts it
            clock.clock += timeout_s
            return ChildRun(
                error=f"time budget spent: a run was cut by the time budget after {timeout_s:.0f} s",
                cut=True,
                wall_s=timeout_s,
            )
        return ChildRun(0.01, 32, wall_s=10.0)

    monkeypatch.setattr(_script, "_run_child", run)
    result = _script.tune_script(script, time_budget_s=100.0, verbose=0)
    xla = result.trial(XLA)
    assert xla.status == "untried"
    assert xla.reason.startswith("time budget spent: a run was cut by the time budget after ")


@pytest.mark.parametrize(
    ("left", "typical", "fresh", "expected"),
    [
        (math.inf, 20.0, 3, 300.0),  # no limit: tune's own default
        (900.0, 20.0, 3, 300.0),  # what the fresh runs leave, at most tune's default
        (400.0, 20.0, 3, 180.0),  # 400 - 6 x 4 x 20 = -80: half of it, less a run
        (30.0, 20.0, 3, None),  # under the least worth a search
    ],
)
def test_the_search_gets_what_the_fresh_processes_leave(left, typical, fresh, expected):
    assert _script.search_budget(left, typical, fresh) == expected


def test_a_child_applies_the_settings_it_verifies(tmp_path):
    import keras
    import numpy as np
    import tensorflow as tf

    from tfgpu._internal.adapters.script import Interception

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 2)), np.zeros((8, 1)))).batch(4)
    seen = {}

    def on_fit(call):
        _script.apply_settings(call, {"steps_per_execution": 4, "private_threadpool_size": 1})
        seen.update(spe=call.model.steps_per_execution, ds=call.arguments["x"])
        with pytest.raises(ValueError, match="drop_remainder cannot be applied"):
            _script.apply_settings(call, {"drop_remainder": True})

    with Interception(on_fit):
        model.fit(ds)
    assert seen["spe"] == 4
    assert seen["ds"].options().threading.private_threadpool_size == 1


class _Quiet:
    def phase(self, text):
        pass


def _script_budget(seconds):
    from tfgpu._internal.measure import timing

    return timing.Budget(seconds)
