"""`tfgpu report LOG_DIR`: plots and a Markdown summary of a run directory.

A run directory is what `GPUMonitor`, `StepTimer`, `tfgpu.monitor.record(log_dir)` and
`tfgpu.diagnose(..., log_dir=...)` write: `run.json`, `timeline.csv` (or
`timeline-worker{k}.csv`), `steps.csv` (or `steps-worker{k}.csv`) and `diagnosis.json`.
`write_report` reads what is there and writes, into the same directory (or `out_dir`):

- `utilization.png`: GPU utilization and host CPU % over time;
- `memory.png`: GPU memory used (and total), host RSS;
- `power.png`: GPU power draw and limit (only when GPUs were sampled);
- `activity.png`: GPU utilization next to SM and tensor-core activity (only when the
  timeline has `gpu{i}_sm_active_pct` / `gpu{i}_tensor_active_pct` values: GPM, Hopper or
  newer), what utilization alone hides;
- `step_time.png`: milliseconds per training step over time, on a log scale so that the
  first step (tracing, compilation) and the steady steps both show (when `steps.csv` exists);
- `report.md`: averages, maxima, the GPUs' idle share, SM/tensor/DRAM activity and PCIe
  traffic where recorded, step-time statistics per epoch, energy used per GPU and per
  example (from `gpu{i}_energy_j` and the examples of `steps.csv` over the same span),
  findings from the GPU counters (tensor cores idle, small kernels, throttled clocks with
  the reason named, PCIe MiB per step; per timeline, session and GPU, with the rules
  `tfgpu.diagnose` uses, `tfgpu._internal.adapters.gpu_counters`, and what a GPU without GPM cannot show),
  and the saved diagnosis.

`write_report` returns the path of `report.md` as a `ReportPath`: in a notebook its `show()`
displays the summary rendered and the plots as images (and a cell ending with
`write_report(log_dir)` renders it); in a script it prints the text and where the plots are.

Epoch boundaries are drawn as vertical lines. Epochs are numbered from 1 in the plots and the
summary, as Keras prints them (`Epoch 1/8`); the CSV files' `epoch` column counts from 0, as
Keras's callbacks do. A run from a machine without a GPU has host metrics only, and the
summary says so.

Several `fit` calls (or `record` blocks) on one run directory append to the same files, and
each starts its own session: the timeline's `elapsed_s` and the steps' `epoch` restart at 0.
The report splits the files into sessions where they restart, plots everything on one time
axis (seconds since the first sample, from the `time` column) with each session marked,
gives the true time span, and keeps each session's epochs apart in the per-epoch table.

When a later session samples another set of GPUs (another timeline header), the monitor
moves the older file aside (`timeline.1.csv`, then `timeline.2.csv`, ...; the same for
`steps.csv`), so the plain name always holds the newest; `run.json` keeps the newest session
at its top level and the earlier ones under `"earlier_sessions"` (oldest first, each naming
its timeline file). The report covers every file: it lists the sessions, then gives each
timeline and steps file its own section (oldest first) and its own plots, named after the
file (`utilization.1.png` for `timeline.1.csv`). A run directory without rotated files or
`earlier_sessions` (written by an older tfgpu) reads as before.

In a multi-worker run each task records its own files (`timeline-worker1.csv`,
`steps-worker1.csv`, `run-worker1.json`; the chief's sessions are in `run.json` too): every
timeline and steps file gets its section as above, and each task's record its list of
sessions under "Workers".

A damaged file never stops the report: a file that cannot be read (permissions, binary
data, not a JSON object, a CSV line beyond the csv module's field limit, not a tfgpu table)
is skipped, or read up to the damage, and named in a "Problems" section at the top of
`report.md`; `write_report` also warns about it (`UserWarning`), and `tfgpu report` prints
it as `error: ...` and exits with status 2 after writing the rest. What the report works
around (rows cut short by a kill, cells that are not numbers, a timeline with a header only)
is noted there too, without an error.

The rooms, in reading order:

- `_write`: `write_report` and `write_report_and_problems`: check the arguments, read each
  file, put the sections and plots together, write `report.md`;
- `_read`: the run directory's files (timelines, steps, records) and `_Problems`, what could
  not be read or was worked around;
- `_series`: a table's columns as series: NaN-aware reductions, sessions, the time axis;
- `_sections`: the Markdown sections (sessions, files, timelines, steps per epoch, diagnoses);
- `_energy`, `_findings`: the energy section and the findings from the GPU counters;
- `_plots`: the PNG plots (matplotlib);
- `_show`: `ReportPath`, the report shown in a notebook (IPython display) or printed.
"""

from __future__ import annotations

# The public names; `write_report_and_problems` is for front ends (the CLI).
from tfgpu.report._sections import IDLE_UTIL_PCT as IDLE_UTIL_PCT
from tfgpu.report._show import ReportPath as ReportPath
from tfgpu.report._write import write_report as write_report
from tfgpu.report._write import write_report_and_problems as write_report_and_problems

__all__ = ["ReportPath", "write_report"]
