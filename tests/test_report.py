"""`tfgpu report`: plots and summary from a run directory; host-only runs; bad input."""

from __future__ import annotations

import datetime
import itertools
import json
import math
import time

import pytest

from tfgpu import monitor
from tfgpu.cli import main
from tfgpu.report import write_report

_HOST = monitor.timeline_columns(0)
_GPU = [c.removeprefix("gpu0_") for c in monitor.timeline_columns(1)[len(_HOST) :]]


def _write_run(path, *, gpus: int, rows: int = 20, steps: bool = True, diagnosis=None):
    """A run directory per the run-directory contract, with known values."""
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
    cols = _HOST + [f"gpu{i}_{c}" for i in range(gpus) for c in _GPU]
    lines = [",".join(cols)]
    for k in range(rows):
        epoch = 0 if k < rows // 2 else 1
        host = [t0 + 0.5 * k, 0.5 * k, epoch, k, 50.0, 1000.0 + k, 40.0]
        per_gpu = []
        for _ in range(gpus):
            util = 0.0 if k % 4 == 0 else 80.0  # a quarter of samples idle
            per_gpu += [util, 30.0, 20000.0 + k, 40960.0, 19000.0, 250.0, 400.0, 60.0, 1400.0]
            per_gpu.append(math.nan)  # throttle reasons unsupported -> nan
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
    assert "| 1 | 5 | 120.00 | 140.00 | 100.00 | 0.60 |" in text
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
    with pytest.raises(NotADirectoryError, match=r"file\.txt"):
        write_report(tmp_path / "file.txt")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="holds no tfgpu run"):
        write_report(tmp_path / "foreign")


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
    from tfgpu.report import _read_csv, _time_axis, _timeline_sessions

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
    table = _read_csv(run / "timeline.csv")
    starts = _timeline_sessions(table)
    assert starts == [0, 5, 10]
    axis = _time_axis(table, starts)
    assert axis[0] == 0.0 and axis[-1] == pytest.approx(0.47)
    assert all(b > a for a, b in itertools.pairwise(axis))
    for png in ("utilization.png", "memory.png", "step_time.png"):
        assert (run / png).stat().st_size > 1000


def test_without_a_time_column_sessions_are_laid_end_to_end(tmp_path):
    from tfgpu.report import _Table, _time_axis, _timeline_sessions

    rows = [{"elapsed_s": e} for e in (0.0, 0.1, 0.2, 0.0, 0.1)]
    table = _Table(tmp_path, ["elapsed_s"], rows)
    starts = _timeline_sessions(table)
    assert starts == [0, 3]
    assert _time_axis(table, starts) == pytest.approx([0.0, 0.1, 0.2, 0.2, 0.3])
