"""`tfgpu report LOG_DIR`: plots and a Markdown summary of a run directory.

`write_report` reads what `GPUMonitor`, `StepTimer`, `tfgpu.monitor.record(log_dir)` and
`tfgpu.diagnose(..., log_dir=...)` wrote there (`run.json`, the timelines, the step files,
`diagnosis.json`) and writes `report.md` with its PNG plots (`utilization.png`,
`memory.png`, `power.png`, `activity.png`, `step_time.png`) into the same directory or
`out_dir`. Every session, moved-aside file and worker is covered; a damaged file is named
in the report, never raised. What each plot and section shows: `docs/diagnosis.md`, "tfgpu
report LOG_DIR"; sessions, moved-aside files and workers: `docs/metrics.md`, "Reading the
files"; damaged files: `docs/guarantees.md`.
"""

from __future__ import annotations

# The public names; `write_report_and_problems` is for front ends (the CLI).
from tfgpu.report._sections import IDLE_UTIL_PCT as IDLE_UTIL_PCT
from tfgpu.report._show import ReportPath as ReportPath
from tfgpu.report._write import write_report as write_report
from tfgpu.report._write import write_report_and_problems as write_report_and_problems

__all__ = ["ReportPath", "write_report"]

# The rooms, in reading order: _write (`write_report`: read each file, put the sections and
# plots together), _read (the files, and `Problems`: what could not be read or was worked
# around), _series (columns as series: NaN-aware reductions, sessions, the time axis),
# _sections, _energy, _findings (the Markdown sections), _plots (matplotlib), _show
# (`ReportPath`: the report shown in a notebook, or printed).
