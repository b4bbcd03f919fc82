"""`tfgpu report`: plots and summary from a run directory; host-only runs; bad input."""

from __future__ import annotations

import base64
import datetime
import itertools
import json
import math
import pathlib
import re
import time
import warnings

import pytest

from tfgpu import monitor
from tfgpu.cli import main
from tfgpu.report import ReportPath, write_report

_HOST = monitor.timeline_columns(0)
_GPU = [c.removeprefix("gpu0_") for c in monitor.timeline_columns(1)[len(_HOST) :]]


def _write_run(path, *, gpus: int, rows: int = 20, steps: bool = True, diagnosis=None, extra=None):
    """A run directory per the run-directory contract, with known values.

    `extra` maps per-GPU column names (without `gpu{i}_`) to `f(k, i)`, the value of row `k`
    for GPU `i`; other columns the monitor records are NaN (unsupported).
    """
    extra = extra or {}
    path.mkdir(parents=True, exist_ok=True)
    t0 = 1_700_000_000.0
    meta = {
        "tfgpu_version": "0.1.0",
        "start_time": t0,
        "hostname": "box",
        "worker": None,
        "interval": 0.5,
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA A100-SXM4-40GB",
                "uuid": f"GPU-{i}",
                "memory_total_mib": 40960.0,
                "compute_capability": [8, 0],
            }
            for i in range(gpus)
        ],
    }
    (path / "run.json").write_text(json.dumps(meta))
    names = _GPU + [c for c in extra if c not in _GPU]
    cols = _HOST + [f"gpu{i}_{c}" for i in range(gpus) for c in names]
    lines = [",".join(cols)]
    for k in range(rows):
        epoch = 0 if k < rows // 2 else 1
        host = [t0 + 0.5 * k, 0.5 * k, epoch, k, 50.0, 1000.0 + k, 40.0]
        per_gpu = []
        for i in range(gpus):
            known = {
                "util_pct": 0.0 if k % 4 == 0 else 80.0,  # a quarter of samples idle
                "mem_util_pct": 30.0,
                "mem_used_mib": 20000.0 + k,
                "mem_total_mib": 40960.0,
                "proc_mem_mib": 19000.0,
                "power_w": 250.0,
                "power_limit_w": 400.0,
                "temp_c": 60.0,
                "sm_clock_mhz": 1400.0,
                **{c: f(k, i) for c, f in extra.items()},
            }
            per_gpu += [known.get(c, math.nan) for c in names]  # the rest unsupported: nan
        lines.append(",".join("nan" if v != v else repr(float(v)) for v in host + per_gpu))
    (path / "timeline.csv").write_text("\n".join(lines) + "\n")
    if steps:
        s = ["time,epoch,step,step_time_s,examples_per_s"]
        for k in range(10):
            s.append(f"{t0 + 1 + k},{k // 5},{k % 5},{0.1 + 0.01 * k},{640.0}")
        (path / "steps.csv").write_text("\n".join(s) + "\n")
    if diagnosis is not None:
        (path / "diagnosis.json").write_text(json.dumps(diagnosis))
    return path


@pytest.mark.slow
def test_gpu_run_gets_plots_and_summary(tmp_path):
    run = _write_run(tmp_path / "run", gpus=2, diagnosis={"text": "Bottleneck: input (high)"})
    summary = write_report(run)
    assert summary == run / "report.md"
    text = summary.read_text()
    for png in ("utilization.png", "memory.png", "power.png", "step_time.png"):
        assert (run / png).stat().st_size > 1000
        assert png in text
    # GPU 0 row: util mean 60 (80 on 3 of 4 samples), max 80, idle share 25%.
    assert "| 0 | 60.0 | 80.0 | 25% |" in text
    assert "| 1 | 60.0 | 80.0 | 25% |" in text
    assert "A100" in text
    assert "Bottleneck: input (high)" in text
    # Epochs numbered as Keras prints them; step times in ms (0.100 .. 0.140 s in epoch 1).
    # Median and p90 as StepTimer logs them: without the first row, linearly interpolated.
    assert "| 1 | 5 | 125.00 | 137.00 | 100.00 | 0.60 |" in text
    assert "| 2 | 5 |" in text and "| 0 | 5 |" not in text
    assert "host metrics only" not in text
    assert "compute capability 8.0" in text
    # The header reads as a date, and says nothing of a worker outside a cluster.
    start = datetime.datetime.fromtimestamp(1_700_000_000).astimezone()
    assert f"started {start.isoformat(sep=' ', timespec='seconds')}," in text
    assert "worker" not in text and "1700000000" not in text


def test_steps_per_execution_rows_count_all_their_steps(tmp_path):
    run = _write_run(tmp_path / "run", gpus=0, steps=False)
    rows = ["time,epoch,step,step_time_s,examples_per_s"]
    rows += [f"{1_700_000_001 + k},0,{16 * k + 15},0.002,32000" for k in range(4)]
    (run / "steps.csv").write_text("\n".join(rows) + "\n")
    text = write_report(run).read_text()
    # 4 rows of 16 steps, 2 ms each: 64 steps, 0.128 s in steps.
    assert "| 1 | 64 | 2.00 | 2.00 | 2.00 | 0.13 |" in text


def test_host_only_run_says_so_and_skips_gpu_plots(tmp_path):
    run = _write_run(tmp_path / "run", gpus=0, steps=False)
    out = tmp_path / "out"
    summary = write_report(run, out_dir=out)
    text = summary.read_text()
    assert summary.parent == out
    assert text.count("host metrics only") == 1  # said once, where the timeline is
    assert (out / "utilization.png").exists() and (out / "memory.png").exists()
    assert not (out / "power.png").exists()
    assert not (run / "report.md").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:tfgpu.monitor records no GPU metrics")
def test_report_of_a_real_sampler_run(tmp_path):
    from tfgpu.monitor import record

    with record(tmp_path, interval=0.05) as sampler:
        sampler.mark(epoch=0, step=0)
        time.sleep(0.2)
        sampler.mark(epoch=1, step=0)
        time.sleep(0.2)
    text = write_report(tmp_path).read_text()
    assert "## Timeline `timeline.csv`" in text
    assert (tmp_path / "utilization.png").exists()


@pytest.mark.slow
def test_diagnosis_findings_without_text(tmp_path):
    diag = {
        "bottleneck": "host_overhead",
        "findings": [{"title": "Host overhead", "recommendation": "steps_per_execution=16"}],
    }
    run = _write_run(tmp_path / "run", gpus=1, diagnosis=diag)
    text = write_report(run).read_text()
    assert "**host_overhead**" in text and "steps_per_execution=16" in text


def test_bad_directories_get_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        write_report(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match=r"argument `log_dir`.*file\.txt.* is a file"):
        write_report(tmp_path / "file.txt")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="holds no tfgpu run"):
        write_report(tmp_path / "foreign")


@pytest.mark.slow
def test_cli_report_exit_codes(tmp_path, capsys):
    run = _write_run(tmp_path / "run", gpus=1)
    assert main(["report", str(run)]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def _appended_run(path):
    """Three `fit` calls appended to one run directory: elapsed_s and epochs restart."""
    path.mkdir(parents=True, exist_ok=True)
    t0 = 1_700_000_000.0
    lines = [",".join(_HOST)]
    for session, start in enumerate((0.0, 0.18, 0.37)):  # 15 samples over 0.47 s
        for k in range(5):
            elapsed = 0.025 * k
            lines.append(",".join(map(repr, [t0 + start + elapsed, elapsed, 0.0, float(k),
                                             10.0 * (session + 1), 900.0, 40.0])))  # fmt: skip
    (path / "timeline.csv").write_text("\n".join(lines) + "\n")
    steps = ["time,epoch,step,step_time_s,examples_per_s"]
    for session, start in enumerate((0.0, 0.18, 0.37)):
        for k in range(4):  # each fit: epoch 0, steps 0..3, 20 ms (fit 1) / 10 ms each
            ms = 0.02 if session == 0 else 0.01
            steps.append(f"{t0 + start + 0.02 * (k + 1)},0,{k},{ms},3200")
    (path / "steps.csv").write_text("\n".join(steps) + "\n")
    return path


def test_a_run_appended_by_several_fits_is_split_into_sessions(tmp_path):
    from tfgpu.report._read import Problems, read_table
    from tfgpu.report._series import time_axis, timeline_sessions

    run = _appended_run(tmp_path / "run")
    text = write_report(run).read_text()
    # The true span of the data, not the last session's elapsed_s.
    assert "15 samples over 0.47 s in 3 sessions" in text, text
    # Each fit's epoch 1 on its own row (not one merged epoch of 12 steps).
    assert "from 3 `fit` calls" in text
    assert "| fit | epoch | steps |" in text
    assert "| 1 | 1 | 4 | 20.00 | 20.00 | 20.00 | 0.08 |" in text
    assert "| 2 | 1 | 4 | 10.00 |" in text and "| 3 | 1 | 4 | 10.00 |" in text
    assert "| 1 | 12 |" not in text
    # The plots' time axis: seconds since the first sample, across sessions, never backwards.
    table = read_table(run / "timeline.csv", ["time"], "timeline", Problems())
    starts = timeline_sessions(table)
    assert starts == [0, 5, 10]
    axis = time_axis(table, starts)
    assert axis[0] == 0.0 and axis[-1] == pytest.approx(0.47)
    assert all(b > a for a, b in itertools.pairwise(axis))
    for png in ("utilization.png", "memory.png", "step_time.png"):
        assert (run / png).stat().st_size > 1000


def test_without_a_time_column_sessions_are_laid_end_to_end(tmp_path):
    from tfgpu.report._read import Table
    from tfgpu.report._series import time_axis, timeline_sessions

    rows = [{"elapsed_s": e} for e in (0.0, 0.1, 0.2, 0.0, 0.1)]
    table = Table(tmp_path, ["elapsed_s"], rows)
    starts = timeline_sessions(table)
    assert starts == [0, 3]
    assert time_axis(table, starts) == pytest.approx([0.0, 0.1, 0.2, 0.2, 0.3])


# ---- damaged run directories: the rest of the report, `error:` naming the file, exit 2 -----


@pytest.fixture
def no_plots(monkeypatch):
    """Skips drawing (the slow part) where a test reads only report.md."""
    from tfgpu.report import _plots

    monkeypatch.setattr(_plots, "_plot_lines", lambda *args, **kw: None)


def _long_line(run):
    text = (run / "timeline.csv").read_text().splitlines()
    text.insert(3, "1," + "9" * 200_000)  # beyond the csv module's field limit (131072)
    (run / "timeline.csv").write_text("\n".join(text) + "\n")


def _no_permission(run, monkeypatch):
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self.name == "timeline.csv":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)


_GARBAGE = bytes(range(256)) * 8


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda run: (run / "run.json").write_text("[1, 2]"), r"run\.json` holds a JSON list"),
        (lambda run: (run / "run.json").write_text(""), r"run\.json` is not valid JSON"),
        (lambda run: (run / "run.json").write_bytes(_GARBAGE), r"run\.json` is not valid JSON"),
        (lambda run: (run / "diagnosis.json").write_text("3"), r"diagnosis\.json` holds a JSON"),
        (_long_line, r"timeline\.csv`, line 4: field larger than field limit"),
        (lambda run: (run / "timeline.csv").write_bytes(_GARBAGE), r"timeline\.csv` is not a CSV"),
        (lambda run: (run / "timeline.csv").write_text(""), r"timeline\.csv` is empty"),
        (lambda run: (run / "timeline.csv").write_text("a,b\n1,2\n"), "not a tfgpu timeline"),
        (lambda run: (run / "steps.csv").write_bytes(_GARBAGE), r"steps\.csv` is not a CSV"),
        (lambda run: (run / "steps.csv").write_text("\n"), r"steps\.csv` is empty"),
        (lambda run: (run / "timeline.2.csv").mkdir(), r"timeline\.2\.csv` cannot be read"),
        ("no permission", r"timeline\.csv` cannot be read \(Permission denied\)"),
        (
            lambda run: (run / "tune.json").symlink_to("tune.json"),
            r"tune\.json` cannot be read \(Too many levels of symbolic links\)",
        ),
        (
            lambda run: (run / "scaling.json").symlink_to(run / "gone.json"),
            r"scaling\.json` cannot be read \(No such file or directory\)",
        ),
        (
            lambda run: (run / "timeline.csv").unlink() or (run / "timeline.csv").symlink_to("x"),
            r"timeline\.csv` cannot be read \(No such file or directory\)",
        ),
        (
            lambda run: (run / "scaling.json").write_text('{"gradient_bytes": ' + "9" * 5000 + "}"),
            r"scaling\.json` cannot be read as JSON \(Exceeds the limit \(4300 digits\)",
        ),
        (
            lambda run: (run / "run.json").write_text("[" * 100_000),
            r"run\.json` cannot be read as JSON \(maximum recursion depth",
        ),
    ],
    ids=[
        "run.json-list",
        "run.json-empty",
        "run.json-binary",
        "diagnosis.json-number",
        "timeline-line-beyond-field-limit",
        "timeline-binary",
        "timeline-empty",
        "timeline-foreign-header",
        "steps-binary",
        "steps-empty",
        "timeline-is-a-directory",
        "timeline-unreadable",
        "tune.json-symlink-loop",
        "scaling.json-dangling-link",
        "timeline-dangling-link",
        "scaling.json-5000-digit-integer",
        "run.json-nested-100000-deep",
    ],
)
def test_a_damaged_file_is_named_and_the_rest_is_written(
    damage, message, tmp_path, capsys, monkeypatch, no_plots
):
    run = _write_run(tmp_path / "run", gpus=1, diagnosis={"text": "Bottleneck: input"})
    if damage == "no permission":
        _no_permission(run, monkeypatch)
    else:
        damage(run)
    assert main(["report", str(run)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    error = [line for line in captured.err.splitlines() if line.startswith("tfgpu report: error:")]
    assert len(error) == 1 and re.search(message, error[0]), captured.err
    text = (run / "report.md").read_text()
    assert "## Problems reading this run directory" in text
    assert re.search(message, text)
    # The rest is there: the steps table, or the timeline, or the diagnosis.
    undamaged = [
        s for s in ("## Steps `steps.csv`", "| 0 | 60.0 |", "Bottleneck: input") if s in text
    ]
    assert len(undamaged) >= 2, text


def test_a_long_line_keeps_the_rows_before_it(tmp_path, no_plots):
    run = _write_run(tmp_path / "run", gpus=0, steps=False)
    _long_line(run)
    with pytest.warns(UserWarning, match="read up to that line only"):
        text = write_report(run).read_text()
    assert "2 samples over 0.50 s" in text  # the two rows before line 4


@pytest.mark.parametrize(
    "content, expected",
    [
        ("header only", "No samples: the file has a header only"),
        ("not numbers", "3 cell(s) that are not numbers read as missing"),
        ("short rows", "2 row(s) with another number of fields than the header's 7 skipped"),
        ("nan everywhere", "Host: CPU mean n/a%"),
    ],
)
def test_what_the_report_works_around_is_noted_without_an_error(
    content, expected, tmp_path, capsys, no_plots
):
    run = _write_run(tmp_path / "run", gpus=0, rows=6)
    lines = (run / "timeline.csv").read_text().splitlines()
    if content == "header only":
        lines = lines[:1]
    elif content == "not numbers":
        lines[2] = lines[2].replace("50.0", "busy", 1)
        lines[3] = lines[3].replace("50.0", "x", 1).replace("40.0", "?", 1)
    elif content == "short rows":
        lines[2] = lines[2][: len(lines[2]) // 2]
        lines.append("1,2")
    else:
        lines = lines[:1] + [",".join(["nan"] * len(_HOST))] * 5
    (run / "timeline.csv").write_text("\n".join(lines) + "\n")
    assert main(["report", str(run)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "error:" not in captured.err
    text = (run / "report.md").read_text()
    assert expected in text, text
    assert "## Steps `steps.csv`" in text


def test_run_json_with_odd_values_still_reports(tmp_path, capsys, no_plots):
    run = _write_run(tmp_path / "run", gpus=1)
    odd = {"gpus": "abc", "start_time": "yesterday", "interval": None, "earlier_sessions": 7}
    (run / "run.json").write_text(json.dumps(odd))
    (run / "diagnosis.json").write_text(json.dumps({"text": 5, "findings": [1, {"x": 2}]}))
    assert main(["report", str(run)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if "tfgpu report: error:" in line]
    named = ("`gpus` is", "`start_time` is", "`earlier_sessions` is", "`text` is", "`findings` is")
    assert len(errors) == len(named) and all(any(n in e for e in errors) for n in named)
    text = (run / "report.md").read_text()
    assert (
        "started ?," in text and "`earlier_sessions` is 7 (a number), not a list of objects" in text
    )
    assert "| 0 | 60.0 |" in text  # the rest is reported


_TUNE_RECORD = {
    "speedup": {"value": 1.5, "low": 1.4, "high": 1.6},
    "text": "tune: each setting against the best so far",
    "trials": [],
}


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("run.json", {"gpus": "A100"}, r'`gpus` is "A100" \(a string\), not a list of objects\.'),
        ("run.json", {"start_time": "yesterday"}, r'`start_time` is "yesterday" \(a string\), '
         r"not a Unix time in seconds \(a number\)\."),
        ("run.json", {"start_time": 1e300}, r"`start_time` is 1e\+300 \(a number\), not a Unix"),
        ("run.json", {"start_time": True}, r"`start_time` is true \(a boolean\)"),
        ("run.json", {"hostname": ["a", "b"]}, r'`hostname` is \["a", "b"\] \(a list\), not a '
         r"string\."),
        ("run.json", {"interval": "fast"}, r"`interval` is \"fast\" \(a string\), not a number"),
        ("run.json", {"gpus": [{"index": "0", "name": "A100"}]}, r'`gpus\[0\]\.index` is "0" '
         r"\(a string\), not an integer\."),
        ("run.json", {"gpus": [{"index": 0, "compute_capability": "8.0"}]},
         r"`gpus\[0\]\.compute_capability` is \"8\.0\" \(a string\), not a list of integers"),
        ("run.json", {"earlier_sessions": {"a": 1}}, r"`earlier_sessions` is \{\"a\": 1\} \(an "
         r"object\), not a list of objects\."),
        ("run.json", {"earlier_sessions": [{"start_time": "x"}]},
         r"`earlier_sessions\[0\]\.start_time` is \"x\""),
        ("tune.json", {"trials": [None, 3]}, r"`trials` is \[null, 3\] \(a list\), not a list "
         r"of objects\."),
        ("tune.json", {"trials": [{"name": 3}]}, r"`trials\[0\]\.name` is 3 \(a number\)"),
        ("tune.json", {"speedup": "x2"}, r'`speedup` is "x2" \(a string\), not a gain'),
        ("tune.json", {"speedup": {"value": 2}}, r'`speedup` is \{"value": 2\} \(an object\)'),
        ("tune.json", {"lines": "export A=1"}, r"`lines` is \"export A=1\" \(a string\), not a "
         r"list of strings\."),
        ("diagnosis.json", {"findings": [1]}, r"`findings` is \[1\] \(a list\)"),
        ("diagnosis.json", {"bottleneck": {"x": 1}}, r"`bottleneck` is \{\"x\": 1\} \(an object\)"),
        ("diagnosis.json", {"findings": [{"title": 5}]}, r"`findings\[0\]\.title` is 5"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_kind_is_named_and_the_rest_is_reported(
    name, damage, message, tmp_path, capsys, no_plots
):
    run = _write_run(tmp_path / "run", gpus=1, diagnosis={"text": "Bottleneck: input"})
    path = run / name
    record = json.loads(path.read_text()) if path.exists() else dict(_TUNE_RECORD)
    path.write_text(json.dumps({**record, **damage}))
    assert main(["report", str(run)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if "tfgpu report: error:" in line]
    assert len(errors) == 1 and re.search(message, errors[0]), captured.err
    assert errors[0].startswith(f"tfgpu report: error: `{path}`: ")
    text = (run / "report.md").read_text()
    assert "## Problems reading this run directory" in text and re.search(message, text)
    for rest in ("| 0 | 60.0 |", "## Steps `steps.csv`", "## Diagnosis"):
        assert rest in text  # the rest of the report is there


def test_records_as_tfgpu_writes_them_have_no_damaged_field(tmp_path, capsys, no_plots):
    run = _write_run(tmp_path / "run", gpus=2, diagnosis={"text": "Bottleneck: input"})
    meta = json.loads((run / "run.json").read_text())
    meta["earlier_sessions"] = [{**meta, "gpus": [], "timeline": "timeline.csv"}]
    meta.update(worker=0, task_type="chief", timeline="timeline.csv", pid=1, nvml_error=None)
    meta["gpus"][0].update(memory_total_mib=None, compute_capability=None)  # NaN and unknown
    (run / "run.json").write_text(json.dumps(meta))
    trial = {"name": "XLA", "change": {}, "gain": None, "gain_low": None, "gain_high": None,
             "status": "untried", "reason": "", "line": ""}  # fmt: skip
    record = {**_TUNE_RECORD, "trials": [trial], "settings": {}, "lines": [], "notes": ["n"],
              "baseline_examples_per_s": None, "time_s": 3.5, "compared_with": "the baseline"}  # fmt: skip
    (run / "tune.json").write_text(json.dumps(record))
    assert main(["report", str(run)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "{run}", "--out", "{file}"], r"`--out`.*'.*notes\.txt' is a file"),
        (["report", "{run}", "--out", "{file}/sub"], r"`--out`.*is under the file"),
        (["report", "{file}"], r"`LOG_DIR`. Received: LOG_DIR='.*notes\.txt'.*is a file"),
        (
            ["report", "{run}", "--out", ""],
            r"`--out`. Received: --out=''. Expected a directory path\.$",
        ),
    ],
)
def test_paths_that_cannot_be_directories_get_usage_errors(argv, message, tmp_path, capsys):
    run = _write_run(tmp_path / "run", gpus=0)
    (tmp_path / "notes.txt").write_text("keep me")
    argv = [a.format(run=run, file=tmp_path / "notes.txt") for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tfgpu report" in err and re.search(message, err, re.MULTILINE), err
    assert "Traceback" not in err and "None" not in err and "out_dir" not in err
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert not (run / "report.md").exists()


def test_a_missing_run_directory_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "tfgpu report: error: Run directory not found" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"log_dir": 123}, TypeError, r"argument `log_dir`. Received: log_dir=123"),
        ({"log_dir": b"run"}, TypeError, "argument `log_dir`"),
        ({"log_dir": None}, TypeError, "argument `log_dir`"),
        ({"log_dir": ""}, ValueError, "argument `log_dir`"),
        ({"out_dir": 1.5}, TypeError, r"argument `out_dir`. Received: out_dir=1.5"),
        ({"out_dir": "{file}"}, ValueError, r"argument `out_dir`.*is a file"),
        ({"out_dir": "{file}/x/y"}, ValueError, r"argument `out_dir`.*is under the file"),
        ({"log_dir": "{file}/x"}, ValueError, r"argument `log_dir`.*is under the file"),
    ],
)
def test_bad_arguments_raise_before_any_work(kwargs, error, match, tmp_path):
    run = _write_run(tmp_path / "run", gpus=0)
    (tmp_path / "f").write_text("x")
    kwargs = {"log_dir": run, **kwargs}
    kwargs = {
        k: v.format(file=tmp_path / "f") if isinstance(v, str) else v for k, v in kwargs.items()
    }
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(error, match=match):
        write_report(**kwargs)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_repeated_reports_and_a_report_after_a_failure(tmp_path, no_plots):
    run = _write_run(tmp_path / "run", gpus=1)
    (run / "diagnosis.json").write_text("{")
    with pytest.warns(UserWarning, match="diagnosis"):
        write_report(run)
    (run / "diagnosis.json").write_text(json.dumps({"text": "fixed"}))
    first = write_report(run).read_text()
    assert write_report(run).read_text() == first
    assert "Problems" not in first and "fixed" in first


# ---- the rotated layout: timeline.1.csv, steps.1.csv, run.json's earlier_sessions ----------


def _rotated_run(path):
    """Session 1 sampled 2 GPUs (moved aside to timeline.1.csv); session 2 sampled none."""
    old = _write_run(path / "old", gpus=2)
    new = _write_run(path, gpus=0, rows=8)
    (new / "timeline.1.csv").write_bytes((old / "timeline.csv").read_bytes())
    (new / "steps.1.csv").write_bytes((old / "steps.csv").read_bytes())
    for name in ("timeline.csv", "run.json", "steps.csv"):
        (old / name).unlink()
    old.rmdir()
    earlier = json.loads((new / "run.json").read_text())
    earlier["gpus"] = [{"index": i, "name": "NVIDIA H100"} for i in range(2)]
    earlier["timeline"] = "timeline.1.csv"
    newest = {**earlier, "gpus": [], "start_time": 1_700_000_100.0, "timeline": "timeline.csv"}
    newest["earlier_sessions"] = [earlier]
    (new / "run.json").write_text(json.dumps(newest))
    return new


@pytest.mark.slow
def test_every_session_of_a_rotated_run_directory_is_reported(tmp_path, capsys):
    run = _rotated_run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    text = (run / "report.md").read_text()
    assert "2 sessions recorded in `run.json`, oldest first" in text
    assert "| 1 |" in text and "| 2 (newest) |" in text and "2 (NVIDIA H100)" in text
    assert "`timeline.1.csv`, `steps.1.csv`" in text
    # Each file its own section, oldest first, and its own plots.
    older, newer = (
        text.index("## Timeline `timeline.1.csv`"),
        text.index("## Timeline `timeline.csv`"),
    )
    assert older < newer
    assert "| 1 | 60.0 | 80.0 | 25% |" in text[older:newer]  # the 2-GPU session's table
    assert "host metrics only" in text[newer:]
    assert text.index("## Steps `steps.1.csv`") < text.index("## Steps `steps.csv`")
    for png in ("utilization.1.png", "power.1.png", "step_time.1.png", "utilization.png"):
        assert (run / png).stat().st_size > 1000 and png in text
    assert not (run / "power.png").exists()


def test_a_session_whose_timeline_is_gone_is_noted(tmp_path, no_plots):
    run = _rotated_run(tmp_path / "run")
    (run / "timeline.1.csv").unlink()
    text = write_report(run).read_text()
    assert "`run.json` names `timeline.1.csv`, which is not here" in text
    assert "## Timeline `timeline.csv`" in text


def test_a_rotated_timeline_alone_is_a_run(tmp_path):
    (tmp_path / "timeline.3.csv").write_text(",".join(_HOST) + "\n")
    text = write_report(tmp_path).read_text()
    assert "## Timeline `timeline.3.csv`" in text and "No samples" in text


@pytest.mark.slow
def test_extreme_values_neither_crash_nor_warn(tmp_path, capsys):
    run = _write_run(tmp_path / "run", gpus=1)
    lines = (run / "timeline.csv").read_text().splitlines()
    lines[3] = lines[3].replace("50.0", "1e308").replace("1700000001.0", "inf", 1)
    lines.append(",".join(["1e308"] * len(lines[1].split(","))))
    lines.append(",".join(["-inf"] * len(lines[1].split(","))))
    (run / "timeline.csv").write_text("\n".join(lines) + "\n")
    steps = "time,epoch,step,step_time_s,examples_per_s\n1e308,-5,1e308,-1,inf\n"
    steps += "inf,1e300,3,0,0\n1700000001,0,0,1e308,1\n1700000002,0,1,0.1,1\n"
    (run / "steps.csv").write_text(steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", str(run)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert "## Steps `steps.csv`" in (run / "report.md").read_text()


def test_outputs_that_cannot_be_written_are_errors(tmp_path, capsys):
    run = _write_run(tmp_path / "run", gpus=0, steps=False)
    (run / "memory.png").mkdir()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: `.*memory\.png` not drawn", err) and "Traceback" not in err
    assert "utilization.png" in (run / "report.md").read_text()
    (run / "report.md").unlink()
    (run / "report.md").mkdir()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: .*cannot write '.*report\.md'", err) and "Traceback" not in err


def test_earlier_diagnoses_and_moved_aside_records_are_listed(tmp_path, no_plots):
    run = _write_run(tmp_path / "run", gpus=0, diagnosis={"text": "newest: input-bound"})
    (run / "diagnosis.1.json").write_text(json.dumps({"bottleneck": "host_overhead"}))
    (run / "diagnosis.2.json").write_text("[]")
    (run / "run.1.json").write_text("{damaged")
    with pytest.warns(UserWarning, match=r"diagnosis\.2\.json` holds a JSON list"):
        text = write_report(run).read_text()
    assert "Earlier diagnoses, kept when a later one was saved: `diagnosis.1.json`" in text
    assert "moved aside because a later session could not read them (damaged): `run.1.json`" in text
    first = text.index("## Earlier diagnosis `diagnosis.1.json`")
    assert (
        first < text.index("## Earlier diagnosis `diagnosis.2.json`") < text.index("## Diagnosis")
    )
    assert "**host_overhead**" in text[first:] and "newest: input-bound" in text


# ---- multi-worker runs: each task's run-{task}{k}.json, like run.json -----------------------


def _multi_worker_run(path, workers=(0, 1, 10)):
    """A multi-worker run directory: per worker `run-worker{k}.json`, `timeline-worker{k}.csv`
    and `steps-worker{k}.csv`; worker 0 (the chief) also in `run.json`. Worker 1 sampled 2
    H100s on `node-1` after an earlier session; the others 1 GPU each."""
    path.mkdir(parents=True)
    for k in workers:
        one = _write_run(path / f"w{k}", gpus=2 if k == 1 else 1)
        meta = json.loads((one / "run.json").read_text())
        meta.update(hostname=f"node-{k}", worker=k, task_type="worker")
        meta["timeline"] = f"timeline-worker{k}.csv"
        if k == 1:
            meta["gpus"] = [{"index": i, "name": "NVIDIA H100"} for i in range(2)]
            meta["earlier_sessions"] = [{**meta, "start_time": 1_699_999_000.0}]
        (path / f"run-worker{k}.json").write_text(json.dumps(meta))
        if k == 0:
            (path / "run.json").write_text(json.dumps(meta))
        for stem in ("timeline", "steps"):
            (one / f"{stem}.csv").rename(path / f"{stem}-worker{k}.csv")
        (one / "run.json").unlink()
        one.rmdir()
    return path


def test_each_workers_record_is_listed_like_run_json(tmp_path, no_plots):
    run = _multi_worker_run(tmp_path / "run")
    text = write_report(run).read_text()
    assert "## Workers" in text
    w0, w1, w10 = (text.index(f"### `run-worker{k}.json`") for k in (0, 1, 10))
    assert w0 < w1 < w10  # by number, not by name
    assert "host `node-0`, worker 0" in text[w0:w1]
    worker1 = text[w1:w10]
    assert "2 sessions recorded in `run-worker1.json`, oldest first" in worker1
    assert "host `node-1`, worker 1" in worker1 and "- GPU 1: NVIDIA H100" in worker1
    assert "host `node-10`, worker 10" in text[w10:]
    for k in (0, 1, 10):  # each worker's files keep their own sections
        assert f"## Timeline `timeline-worker{k}.csv`" in text
        assert f"## Steps `steps-worker{k}.csv`" in text
    assert "which is not here" not in text  # each record's timeline was found
    lone = write_report(_write_run(tmp_path / "lone", gpus=1)).read_text()
    assert "Workers" not in lone


def test_a_damaged_worker_record_is_named_and_the_others_are_listed(tmp_path, capsys, no_plots):
    run = _multi_worker_run(tmp_path / "run", workers=(0, 1))
    (run / "run-worker1.json").write_text("{damaged")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: `.*run-worker1\.json` is not valid JSON", err), err
    text = (run / "report.md").read_text()
    assert "host `node-0`, worker 0" in text and "## Timeline `timeline-worker1.csv`" in text
    assert "### `run-worker1.json`\n\nSkipped (see Problems)." in text


# ---- what utilization hides: SM/tensor activity, PCIe, energy per example (issue 15) --------


def _hand_timeline(path, columns, rows):
    """A timeline written by hand: `rows` are lists of values in `columns` order."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [",".join(columns)]
    lines += [",".join("nan" if v != v else repr(float(v)) for v in row) for row in rows]
    (path / "timeline.csv").write_text("\n".join(lines) + "\n")
    return path


def _steps(path, rows):
    """steps.csv rows (time, epoch, step, step_time_s, examples_per_s)."""
    text = ["time,epoch,step,step_time_s,examples_per_s"]
    text += [",".join(str(v) for v in row) for row in rows]
    (path / "steps.csv").write_text("\n".join(text) + "\n")


_T0 = 1_700_000_000.0


@pytest.mark.slow
def test_sm_and_tensor_activity_are_plotted_next_to_utilization(tmp_path):
    run = _write_run(
        tmp_path / "run",
        gpus=2,
        extra={
            "sm_active_pct": lambda k, i: 35.0,
            "tensor_active_pct": lambda k, i: 2.0 if i == 0 else math.nan,  # GPU 1: not read
            "pcie_tx_mib_s": lambda k, i: 100.0 + k,
            "pcie_rx_mib_s": lambda k, i: 50.0,
        },
    )
    text = write_report(run).read_text()
    assert (run / "activity.png").stat().st_size > 1000
    assert "![activity](activity.png)" in text
    assert (
        "| GPU | util mean % | SM active mean % | tensor active mean % | PCIe tx mean MiB/s | "
        "PCIe rx mean MiB/s |" in text
    )
    assert "| 0 | 60.0 | 35.0 | 2.0 | 109.5 | 50.0 |" in text
    assert "| 1 | 60.0 | 35.0 | n/a | 109.5 | 50.0 |" in text
    assert "SM active is the share of SMs busy" in text


def test_without_activity_or_energy_values_the_report_is_as_before(tmp_path, no_plots):
    old = ["time", "elapsed_s", "epoch", "gpu0_util_pct", "gpu0_power_w"]  # an older tfgpu
    rows = [[_T0 + k, float(k), 0.0, 80.0, 200.0] for k in range(5)]
    for run, columns, values in (
        (tmp_path / "old", old, rows),
        # Columns present but all NaN: a GPU without GPM, PCIe or energy counters.
        (
            tmp_path / "no_gpm",
            [*old, "gpu0_sm_active_pct", "gpu0_tensor_active_pct", "gpu0_energy_j"],
            [[*r, math.nan, math.nan, math.nan] for r in rows],
        ),
        # One energy value: nothing to subtract.
        (
            tmp_path / "one_energy",
            [*old, "gpu0_energy_j"],
            [[*r, 5000.0 if k == 2 else math.nan] for k, r in enumerate(rows)],
        ),
    ):
        _hand_timeline(run, columns, values)
        _steps(run, [[_T0 + 1, 0, 0, 0.1, 640.0]])
        text = write_report(run).read_text()
        assert "SM active" not in text and "## Energy" not in text, run.name
        assert "| 0 | 80.0 | 80.0 | 0% |" in text
        assert not (run / "activity.png").exists()


def test_energy_per_example_over_the_span_the_steps_share(tmp_path, no_plots):
    # 20 samples every 0.5 s; the counter rises 125 J per sample: 2375 J over 9.5 s (250 W).
    columns = ["time", "elapsed_s", "epoch", "gpu0_util_pct", "gpu0_energy_j"]
    rows = [[_T0 + 0.5 * k, 0.5 * k, 0.0, 90.0, 1e6 + 125.0 * k] for k in range(20)]
    run = _hand_timeline(tmp_path / "run", columns, rows)
    # 64 examples per row (640/s x 0.1 s); rows ending at T0+1 ... T0+9 fall in the span,
    # the one at T0+10 ends after the last sample.
    _steps(run, [[_T0 + 1 + k, 0, k, 0.1, 640.0] for k in range(10)])
    text = write_report(run).read_text()
    assert "## Energy" in text
    assert "| `timeline.csv` | 0 | 2.375 | 9.5 | 250.0 | 576 | 4.123 |" in text
    # Rows of several steps (steps_per_execution) count all their examples.
    _steps(run, [[_T0 + 2, 0, 3, 0.1, 640.0], [_T0 + 4, 0, 7, 0.1, 640.0]])  # 4 steps each
    text = write_report(run).read_text()
    assert "| 2.375 | 9.5 | 250.0 | 512 | 4.639 |" in text


def test_energy_of_several_gpus_and_sessions_counts_only_within_sessions(tmp_path, no_plots):
    columns = ["time", "elapsed_s", "epoch", "gpu0_util_pct", "gpu0_energy_j",
               "gpu1_util_pct", "gpu1_energy_j"]  # fmt: skip
    rows = []
    for k in range(5):  # session 1: 100 J per second on GPU 0, 50 on GPU 1
        rows.append([_T0 + k, float(k), 0.0, 90.0, 1000.0 + 100 * k, 90.0, 500.0 + 50 * k])
    for k in range(5):  # session 2, an hour later: the GPUs ran other work in between
        t = _T0 + 3600 + k
        rows.append([t, float(k), 0.0, 90.0, 90000.0 + 100 * k, 90.0, 40000.0 + 50 * k])
    run = _hand_timeline(tmp_path / "run", columns, rows)
    _steps(
        run,
        [
            [_T0 + 2, 0, 0, 0.1, 1000.0],
            [_T0 + 3602, 0, 0, 0.1, 1000.0],
            [_T0 + 1800, 0, 1, 0.1, 1000.0],
        ],
    )  # fmt: skip  (the last: between sessions)
    text = write_report(run).read_text()
    assert "| `timeline.csv` | 0 | 0.800 | 8.0 | 100.0 | 200 | 4 |" in text
    assert "| `timeline.csv` | 1 | 0.400 | 8.0 | 50.0 | 200 | 2 |" in text
    assert "| `timeline.csv` | all | 1.200 | n/a | n/a | 200 | 6 |" in text


def test_energy_without_steps_or_batch_size_or_with_a_counter_reset(tmp_path, no_plots):
    columns = ["time", "elapsed_s", "epoch", "gpu0_util_pct", "gpu0_energy_j"]
    rows = [[_T0 + k, float(k), 0.0, 90.0, 1000.0 + 100 * k] for k in range(5)]
    run = _hand_timeline(tmp_path / "run", columns, rows)
    text = write_report(run).read_text()  # no steps.csv: energy, no examples
    assert "| `timeline.csv` | 0 | 0.400 | 4.0 | 100.0 | n/a | n/a |" in text
    _steps(run, [[_T0 + 2, 0, 0, 0.1, "nan"]])  # StepTimer without a batch size
    assert "| 100.0 | n/a | n/a |" in write_report(run).read_text()
    reset = [[*r[:4], 1000.0 - 100 * k] for k, r in enumerate(rows)]  # driver reloaded
    _hand_timeline(run, columns, reset)
    text = write_report(run).read_text()
    assert "1 session(s) skipped where the energy counter went backwards" in text


# ---- findings from the GPU counters, with the rules diagnose uses (tfgpu._internal.adapters.gpu_counters) ----

_COUNTERS = ["time", "elapsed_s", "epoch", "gpu0_util_pct", "gpu0_power_w", "gpu0_power_limit_w",
             "gpu0_sm_clock_mhz", "gpu0_throttle_reasons", "gpu0_sm_active_pct",
             "gpu0_tensor_active_pct", "gpu0_pcie_tx_mib_s", "gpu0_pcie_rx_mib_s"]  # fmt: skip


def _counter_rows(n=10, t0=_T0, **kw):
    """Rows of `_COUNTERS`: a busy H100 with GPM, healthy unless `kw` says otherwise."""
    base = dict(util=90.0, power=500.0, limit=700.0, clock=1980.0, reasons=0.0, sm=85.0,
                tensor=40.0, tx=60.0, rx=40.0)  # fmt: skip
    v = {**base, **kw}
    order = ("util", "power", "limit", "clock", "reasons", "sm", "tensor", "tx", "rx")
    rows = [[t0 + k, float(k), 0.0, *(v[c] for c in order)] for k in range(n)]
    if "reasons_once" in v and n > 3:  # one sample with other throttle reasons
        rows[3][7] = v["reasons_once"]
    return rows


def _findings(text):
    start = text.index("## Findings from the GPU counters")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_the_report_names_what_utilization_hides_from_the_timeline(tmp_path, no_plots):
    rows = _counter_rows(util=95.0, sm=30.0, tensor=1.0, power=200.0, reasons=1.0,
                         reasons_once=float(0x1 | 0x4))  # fmt: skip
    run = _hand_timeline(tmp_path / "run", _COUNTERS, rows)
    _steps(run, [[_T0 + 1 + k, 0, k, 0.05, 640.0] for k in range(5)])  # 50 ms per step
    text = _findings(write_report(run).read_text())
    assert "- **GPU 0**, moderate: **Tensor cores nearly idle while the GPU is busy**. " in text
    assert "Tensor-core activity 1.0% (GPM) at 95% utilization" in text
    assert 'precision="mixed_bfloat16"' in text and "multiples of 8" in text
    assert "TF32" in text and "`tfgpu.diagnose(model, data)` names the layers" in text
    assert "**Utilization high, SM activity low: kernels too small to fill the GPU**" in text
    assert "find_batch_size" in text and "a larger `steps_per_execution`" in text
    assert "moderate: **Clocks throttled: SW power cap**" in text
    assert "29% of the 700 W limit at 1980 MHz" in text and "`nvidia-smi -pl`" in text
    # PCIe: 100 MiB/s x 50 ms = 5 MiB per step, told, not judged (the batch's bytes unknown).
    assert "info: **PCIe traffic per step (not judged" in text
    assert "5.0 MiB crossed PCIe per step (100.0 MiB/s sent and received x 50.00 ms" in text
    assert "`tfgpu.diagnose(model, data)` knows the batch's bytes" in text
    assert "No finding" not in text and "Not seen" not in text


def test_a_healthy_run_says_no_finding_and_pcie_needs_the_step_time(tmp_path, no_plots):
    run = _hand_timeline(tmp_path / "run", _COUNTERS, _counter_rows())
    text = _findings(write_report(run).read_text())  # no steps.csv: no step time
    assert "No finding on GPU 0." in text and "PCIe" not in text
    _steps(run, [[_T0 + 100, 0, 0, 0.05, 640.0]])  # a step outside the timeline's span
    assert "PCIe" not in _findings(write_report(run).read_text())


def test_a_gpu_without_gpm_uses_what_exists_and_says_once_what_it_cannot_see(tmp_path, no_plots):
    columns = ["time", "elapsed_s", "epoch"]
    for i in (0, 1):
        columns += [f"gpu{i}_{c}" for c in ("util_pct", "power_w", "power_limit_w",
                    "throttle_reasons", "sm_active_pct", "tensor_active_pct")]  # fmt: skip
    nan = math.nan
    rows = [
        [
            _T0 + k,
            float(k),
            0.0,
            92.0,
            60.0,
            150.0,
            32.0,
            nan,
            nan,
            92.0,
            140.0,
            150.0,
            0.0,
            nan,
            nan,
        ]
        for k in range(6)
    ]
    run = _hand_timeline(tmp_path / "run", columns, rows)
    text = _findings(write_report(run).read_text())
    assert "- **GPU 0**, moderate: **Clocks throttled: SW thermal slowdown**" in text
    assert "GPU 1**" not in text
    assert text.count("tensor/SM activity not measured") == 1
    assert (
        "- Not seen on GPU 0 and 1: tensor/SM activity not measured: GPM needs a Hopper or "
        "newer GPU; utilization alone cannot tell idle SMs from busy ones." in text
    )
    assert "PCIe traffic not measured" not in text  # no PCIe column: an older monitor


def test_older_timelines_and_host_only_runs_get_no_counter_section(tmp_path, no_plots):
    old = ["time", "elapsed_s", "epoch", "gpu0_util_pct", "gpu0_power_w", "gpu0_power_limit_w",
           "gpu0_throttle_reasons"]  # fmt: skip
    host = ["time", "elapsed_s", "epoch", "host_cpu_pct"]
    for run, columns, rows in (
        (tmp_path / "old", old, [[_T0 + k, float(k), 0.0, 80.0, 300.0, 400.0, 0.0] for k in range(4)]),
        (tmp_path / "host", host, [[_T0 + k, float(k), 0.0, 50.0] for k in range(4)]),
        (tmp_path / "empty", _COUNTERS, []),
    ):  # fmt: skip
        _hand_timeline(run, columns, rows)
        _steps(run, [[_T0 + 1, 0, 0, 0.1, 640.0]])
        assert "Findings from the GPU counters" not in write_report(run).read_text(), run.name
    # ...but an older timeline's throttled clocks are still named (the columns exist).
    rows = [[_T0 + k, float(k), 0.0, 80.0, 100.0, 400.0, 64.0] for k in range(4)]
    _hand_timeline(tmp_path / "old", old, rows)
    text = _findings(write_report(tmp_path / "old").read_text())
    assert "high: **Clocks throttled: HW thermal slowdown**" in text and "Not seen" not in text


@pytest.mark.slow
def test_counter_findings_are_per_session_and_odd_values_do_not_crash(tmp_path, capsys):
    rows = _counter_rows(5) + [
        [*r[:1], *r[1:4], 100.0, *r[5:7], 0x40, *r[8:]] for r in _counter_rows(5, _T0 + 3600)
    ]
    run = _hand_timeline(tmp_path / "run", _COUNTERS, rows)
    text = _findings(write_report(run).read_text())
    assert "- **GPU 0** (session 2), high: **Clocks throttled: HW thermal slowdown**" in text
    assert "(session 1)" not in text
    odd = [[*r[:7], v, *r[8:]] for r, v in zip(_counter_rows(4), (1e300, -4.0, math.inf, 2.5))]
    odd[0][8] = 1e308  # an SM activity past anything real
    _hand_timeline(run, _COUNTERS, odd)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", str(run)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_the_report_and_diagnose_share_one_threshold(tmp_path, no_plots, monkeypatch):
    from tfgpu._internal.adapters import gpu_counters

    run = _hand_timeline(tmp_path / "run", _COUNTERS, _counter_rows(tensor=3.0))
    assert "Tensor cores nearly idle" in _findings(write_report(run).read_text())
    monkeypatch.setattr(gpu_counters, "TENSOR_ACTIVE_LOW_PCT", 2.0)
    assert "No finding on GPU 0." in _findings(write_report(run).read_text())


# ---- step_time.png never starts before time 0 (issue 16) ------------------------------------


@pytest.fixture
def drawn(monkeypatch):
    """What each plot would draw, by file name: `(series, epochs, keywords)`, no PNG made."""
    from tfgpu.report import _plots

    plots = {}

    def record(out, title, ylabel, series, epochs, **kw):
        plots[out.name] = (series, epochs, kw)
        return None

    monkeypatch.setattr(_plots, "_plot_lines", record)
    return plots


def _xs_of_step_plot(plot):
    series, epochs, kw = plot
    xs = [x for _, line, _, _ in series for x in line if math.isfinite(x)]
    return xs, [t for t, _ in epochs], list(kw["sessions"])


def test_a_row_never_begins_before_the_previous_one_ended():
    from tfgpu.report._series import step_begins

    # Row 2 claims 16 steps of 100 ms between ends 1.0 and 1.2: it begins when row 1 ended.
    begins = step_begins([1.0, 1.2, 1.3], [100.0, 100.0, 50.0], [1, 16, 1])
    assert begins == pytest.approx([0.9, 1.0, 1.25])
    # A new session (row 1) is not bounded by the previous session's end; NaN stays NaN.
    begins = step_begins([5.0, 1.0, math.nan], [10.0, 10.0, 10.0], [1, 1, 1], starts=[0, 1])
    assert begins[:2] == pytest.approx([4.99, 0.99]) and math.isnan(begins[2])


@pytest.mark.parametrize("timeline", [True, False], ids=["with-timeline", "steps-only"])
def test_step_time_plot_starts_at_0_when_rows_claim_more_steps_than_ran(timeline, tmp_path, drawn):
    # What StepTimer wrote with steps_per_execution=16 over 4 batches: each execution counts
    # 16 steps (step 15), so epoch 1's first row claims 16 x 85 ms = 1.35 s of steps, ending
    # 0.36 s after the first sample: taken as written, epoch 1 began at -1.0 s.
    run = _hand_timeline(
        tmp_path / "run",
        ["time", "elapsed_s", "epoch", "step", "host_cpu_pct"],
        [[_T0 + 0.2 * k, 0.2 * k, 0.0, 0.0, 50.0] for k in range(3)],
    )
    if not timeline:
        (run / "timeline.csv").unlink()
    _steps(
        run,
        [
            (_T0 + 0.356, 0, 15, 0.0846, 189.1),
            (_T0 + 0.383, 1, 15, 0.000776, 20625),
            (_T0 + 0.410, 2, 15, 0.000902, 17730),
        ],
    )
    write_report(run)
    xs, epochs, sessions = _xs_of_step_plot(drawn["step_time.png"])
    assert min(xs + epochs + sessions) >= 0.0
    assert epochs[0] == 0.0 and sessions == [0.0]  # epoch 1 begins at time 0, not -1.0 s
    assert drawn["step_time.png"][2]["xmin"] == 0.0  # no margin drawn before time 0
    if timeline:  # the timeline's clock: the points end where the rows say
        assert xs == pytest.approx([0.356, 0.383, 0.410])
    else:
        assert drawn["step_time.png"][2]["xlabel"] == "seconds since the first step began"


# ---- the report shown in a notebook or printed (issue 16) ----------------------------------

_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def _report_dir(path):
    """A report.md as write_report writes it, with two plots (one of them missing)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "utilization.png").write_bytes(_PNG)
    (path / "step_time.png").write_bytes(_PNG)
    text = [
        "# tfgpu run report: `run`",
        "",
        "| gpu | util |",
        "| --- | --- |",
        "| 0 | 60.0 |",
        "",
        "## Plots",
        "",
        "![utilization](utilization.png)",
        "![memory](memory.png)",
        "![step_time](step_time.png)",
        "",
    ]
    (path / "report.md").write_text("\n".join(text))
    return ReportPath(path / "report.md")


def test_write_report_returns_a_path_that_shows_itself(tmp_path, no_plots):
    run = _write_run(tmp_path / "run", gpus=0, steps=False)
    report = write_report(run)
    assert isinstance(report, ReportPath) and isinstance(report, pathlib.Path)
    assert report == run / "report.md" and str(report) == str(run / "report.md")
    assert "# tfgpu run report" in report.read_text()


def test_show_prints_the_text_and_where_the_plots_are(tmp_path, capsys):
    report = _report_dir(tmp_path / "run")
    report.show()
    out = capsys.readouterr().out
    assert "| 0 | 60.0 |" in out
    assert f"[plot: {tmp_path / 'run' / 'utilization.png'}]" in out
    assert f"[plot: {tmp_path / 'run' / 'step_time.png'}]" in out
    assert "![memory](memory.png)" in out  # a plot whose file is gone stays a link
    assert "![utilization]" not in out


@pytest.fixture
def kernel_shell(tmp_path, monkeypatch):
    """An IPython shell that passes for a notebook kernel; its rich outputs are captured."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # not the user's profile
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    shell.kernel = object()  # what tells a kernel (ipykernel's shell) from a terminal
    yield shell
    InteractiveShell.clear_instance()


def test_show_in_a_notebook_displays_the_markdown_and_each_plot(tmp_path, kernel_shell):
    from IPython.utils.capture import capture_output

    report = _report_dir(tmp_path / "run")
    with capture_output() as captured:
        report.show()
    kinds = ["image/png" if "image/png" in o.data else "text/markdown" for o in captured.outputs]
    assert kinds == ["text/markdown", "image/png", "text/markdown", "image/png"]
    first, _, missing, _ = (o.data for o in captured.outputs)
    assert "| 0 | 60.0 |" in first["text/markdown"]
    assert missing["text/markdown"] == "![memory](memory.png)"
    assert captured.stdout == ""


def test_show_in_a_terminal_ipython_prints_the_text(tmp_path, kernel_shell, capsys):
    del kernel_shell.kernel  # a terminal IPython: a shell, but no kernel to show pictures
    _report_dir(tmp_path / "run").show()
    assert "[plot: " in capsys.readouterr().out


def test_a_cell_ending_with_the_report_renders_it_with_the_plots_inlined(tmp_path):
    report = _report_dir(tmp_path / "run")
    markdown = report._repr_markdown_()
    assert "| 0 | 60.0 |" in markdown
    assert markdown.count("](data:image/png;base64,") == 2
    assert "![memory](memory.png)" in markdown
    assert report.parent._repr_markdown_() is None  # a path derived from it is a path
    (tmp_path / "run" / "report.md").unlink()
    assert report._repr_markdown_() is None  # gone: the plain repr
    with pytest.raises(FileNotFoundError):
        report.show()


def test_the_report_shows_tune_json_and_its_waterfall(tmp_path):
    # `tfgpu.tune(..., log_dir=)` writes tune.json (with its printed table) and tune.png.
    run = tmp_path / "run"
    run.mkdir()
    (run / "diagnosis.json").write_text(json.dumps({"bottleneck": "compute", "findings": []}))
    table = "tune: each setting against the best so far\n  steps_per_execution=16  x1.80  kept"
    speedup = {"value": 1.8, "low": 1.7, "high": 1.9}
    (run / "tune.json").write_text(json.dumps({"speedup": speedup, "text": table}))
    (run / "tune.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    out = tmp_path / "elsewhere"
    text = write_report(run, out_dir=out).read_text()
    assert "## Tuning" in text and "steps_per_execution=16  x1.80  kept" in text
    assert "![tune](../run/tune.png)" in text  # relative to report.md, wherever it is written


def test_a_damaged_tune_json_is_a_problem_not_a_crash(tmp_path):
    (tmp_path / "diagnosis.json").write_text(json.dumps({"bottleneck": "compute"}))
    (tmp_path / "tune.json").write_text("{not json")
    with pytest.warns(UserWarning):
        text = write_report(tmp_path).read_text()
    assert "## Tuning" in text and "could not be read" in text


def test_the_report_shows_scaling_json_and_its_plot_and_names_a_damaged_field(tmp_path):
    # `tfgpu.scaling(..., log_dir=)` writes scaling.json (with its printed table) and scaling.png.
    from tfgpu._internal.measure.rules import Gain
    from tfgpu.scalability._result import Point, ScalingResult

    point = Point(2, "weak", 128, 64, 0.02, 6400.0, speedup=Gain(1.2, 1.1, 1.3))
    base = Point(1, "both", 64, 64, 0.01, 6400.0, speedup=Gain(1.0, 1.0, 1.0))
    for p in (base, point):
        p.explain(base, "GPU", 2**20)
    result = ScalingResult([base, point], [], {}, 2**20, "GPU", "NcclAllReduce", None, [])
    run = tmp_path / "run"
    result.write(run)
    text = write_report(run, out_dir=tmp_path / "elsewhere").read_text()
    assert "## Scaling" in text and "Scaling on GPUs: 1.0 MiB of gradients" in text
    assert point.reason in text
    assert "![scaling](../run/scaling.png)" in text
    record = json.loads((run / "scaling.json").read_text())
    record["points"][1]["efficiency"] = "60%"
    (run / "scaling.json").write_text(json.dumps(record))
    with pytest.warns(UserWarning, match=r"`points\[1\]\.efficiency` is \"60%\" \(a string\)"):
        write_report(run)


def test_a_batch_size_record_gets_its_section_and_alone_is_a_run(tmp_path, capsys, no_plots):
    from tfgpu.batch_size._result import BatchSizeResult, BatchSizeTrial

    trials = [
        BatchSizeTrial(64, 64, True, "ok", None, 0.01, 6400.0),
        BatchSizeTrial(128, 128, False, "oom", None, math.nan, math.nan),
    ]
    result = BatchSizeResult(64, 64, 64, 64, 1, trials, None, "CPU:0", time_s=2.0)
    run = tmp_path / "run"
    run.mkdir()
    result.write(run)
    assert (run / "batch_size.json").exists()
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    text = (run / "report.md").read_text()
    assert "## Batch size" in text and "largest that fits: 64" in text
    assert "Problems reading" not in text

    record = json.loads((run / "batch_size.json").read_text())
    (run / "batch_size.json").write_text(json.dumps({**record, "largest": "64"}))
    assert main(["report", str(run)]) == 2  # the damaged field is named, the rest written
    assert '`largest` is "64" (a string), not an integer' in capsys.readouterr().err
    assert "## Batch size" in (run / "report.md").read_text()
