"""tfgpu._internal.helpers.stats: one percentile, one mean, one byte format; History and report.md agree."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tfgpu._internal.helpers import stats


def test_percentile_is_numpy_s_linear_interpolation_over_finite_values():
    values = list(np.random.default_rng(1).random(37))
    for q in (0, 10, 50, 90, 99, 100):
        assert stats.percentile(values, q) == pytest.approx(np.percentile(values, q))
    holes = [*values, math.nan, None, math.inf, -math.inf]
    assert stats.percentile(holes, 90) == pytest.approx(np.nanpercentile(values, 90))
    assert stats.median([3.0, 1.0, 2.0, 10.0]) == 2.5  # between the two middle values
    assert stats.median([np.float32(2.0), 4]) == 3.0  # NumPy scalars and ints count


def test_no_finite_value_gives_nan():
    assert math.isnan(stats.percentile([], 50))
    assert math.isnan(stats.median([math.nan, None]))
    assert math.isnan(stats.mean([math.inf]))


def test_percentile_out_of_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"argument `q`. Received: q=101"):
        stats.percentile([1.0], 101)


def test_mean_skips_holes_and_survives_the_float_maximum():
    assert stats.mean([1.0, None, 2.0, math.nan]) == 1.5
    big = np.finfo(np.float64).max
    assert stats.mean([big, big]) == big


def test_format_bytes_uses_binary_units():
    assert stats.format_bytes(0) == "0 B"
    assert stats.format_bytes(1023) == "1023 B"
    assert stats.format_bytes(1536) == "1.5 KiB"
    assert stats.format_bytes(5 * 2**20) == "5.0 MiB"
    assert stats.format_bytes(3.25 * 2**30) == "3.2 GiB"


class _Clock:
    """A `perf_counter` stand-in that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_history_and_report_give_the_same_median_and_p90_for_an_epoch(tmp_path):
    pytest.importorskip("matplotlib")
    from tfgpu.callbacks import StepTimer
    from tfgpu.report import write_report

    # One epoch on a fake clock: a slow first step (tracing), then uneven steps.
    durations = [0.5, 0.010, 0.020, 0.013, 0.050, 0.011, 0.030, 0.012, 0.017, 0.016]
    timer = StepTimer(batch_size=8, log_dir=tmp_path)
    clock = _Clock()
    timer._perf = clock  # the step clock, and the wall clock it is converted to
    timer._wall = lambda: 1_700_000_000.0 + clock.now
    timer.set_params({"steps": len(durations)})
    timer.on_train_begin()
    timer.on_epoch_begin(0)
    for step, seconds in enumerate(durations):
        timer.on_train_batch_begin(step)
        clock.now += seconds
        timer.on_train_batch_end(step)
    logs: dict[str, float] = {}
    timer.on_epoch_end(0, logs)
    timer.on_train_end()

    steady_ms = [d * 1e3 for d in durations[1:]]  # the first step is reported on its own
    assert logs["step_time_median_s"] * 1e3 == pytest.approx(np.percentile(steady_ms, 50))
    assert logs["step_time_p90_s"] * 1e3 == pytest.approx(np.percentile(steady_ms, 90))

    text = write_report(tmp_path).read_text()
    row = re.search(r"^\| 1 \| 10 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.MULTILINE)
    assert row, text
    assert row.group(1) == f"{logs['step_time_median_s'] * 1e3:.2f}"  # 16.00
    assert row.group(2) == f"{logs['step_time_p90_s'] * 1e3:.2f}"  # 34.00, not 50.00
    assert row.group(3) == f"{logs['first_step_time_s'] * 1e3:.2f}"  # 500.00
