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
  `tfgpu.diagnose` uses, `tfgpu._gpu_counters`, and what a GPU without GPM cannot show),
  and the saved diagnosis.

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

A damaged file never stops the report: a file that cannot be read (permissions, binary
data, not a JSON object, a CSV line beyond the csv module's field limit, not a tfgpu table)
is skipped, or read up to the damage, and named in a "Problems" section at the top of
`report.md`; `write_report` also warns about it (`UserWarning`), and `tfgpu report` prints
it as `error: ...` and exits with status 2 after writing the rest. What the report works
around (rows cut short by a kill, cells that are not numbers, a timeline with a header only)
is noted there too, without an error.
"""

from __future__ import annotations

import csv
import datetime
import io
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfgpu import _gpu_counters as counters
from tfgpu import _stats
from tfgpu._checks import check_dir
from tfgpu._files import EARLIER_SESSIONS, read_json_object, write_text_atomic

__all__ = ["write_report"]

IDLE_UTIL_PCT = 5.0
"""A sample whose GPU utilization is below this is counted as idle."""

_GPU_UTIL = re.compile(r"^gpu(\d+)_util_pct$")


@dataclass
class _Table:
    path: Path
    columns: list[str]
    rows: list[dict[str, float]] = field(default_factory=list)

    def col(self, name: str) -> list[float]:
        return [r.get(name, math.nan) for r in self.rows]


def _float(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


@dataclass
class _Problems:
    """What the report could not read (`errors`: the CLI exits 2) or worked around (`notes`)."""

    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def section(self) -> list[str]:
        if not (self.errors or self.notes):
            return []
        lines = ["## Problems reading this run directory", ""]
        lines += [f"- **Skipped**: {e}" for e in self.errors]
        lines += [f"- Note: {n}" for n in self.notes]
        return [*lines, ""]


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


_MISSING = {"", "nan", "-nan", "+nan", "none", "null"}  # cells that mean "no value", not damage


def _read_table(path: Path, required: Sequence[str], what: str, problems: _Problems):
    """Reads a tfgpu CSV file into a `_Table`, or None when nothing of it can be used.

    Never raises for a damaged file: what cannot be read goes to `problems.errors` (with the
    rows before the damage kept), what is worked around to `problems.notes`.

    Args:
        path: Path, the file.
        required: the columns of which at least one must be in the header.
        what: str, what the file is, for messages ("timeline", "steps file").
        problems: `_Problems`, told what went wrong.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        problems.errors.append(f"`{path}` cannot be read ({_reason(e)}).")
        return None
    try:
        text = data.decode("utf-8-sig")  # a BOM (a file saved by a spreadsheet) is not data
    except UnicodeDecodeError as e:
        problems.errors.append(
            f"`{path}` is not a CSV text file (byte {e.start} is not UTF-8: binary data?)."
        )
        return None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[dict[str, float]] = []
    columns: list[str] = []
    wrong_width = not_numbers = 0
    try:
        header = next((row for row in reader if row), None)  # the first line not blank
        if header is None:
            problems.errors.append(f"`{path}` is empty (not even a header line).")
            return None
        columns = [c.strip() for c in header]
        if not any(c in columns for c in required):
            names = " or ".join(f"`{c}`" for c in required)
            problems.errors.append(
                f"`{path}` is not a tfgpu {what}: its first line has no {names} column."
            )
            return None
        for raw in reader:
            if not raw or raw == header:  # a blank line; a header repeated by an appending writer
                continue
            if len(raw) != len(columns):
                wrong_width += 1
                continue
            row = {}
            for name, cell in zip(columns, raw):
                value = _float(cell)
                if math.isnan(value) and cell.strip().lower() not in _MISSING:
                    not_numbers += 1
                row[name] = value
            rows.append(row)
    except csv.Error as e:
        problems.errors.append(
            f"`{path}`, line {reader.line_num}: {e}; read up to that line only ({len(rows)} rows)."
        )
    if wrong_width:
        problems.notes.append(
            f"`{path}`: {wrong_width} row(s) with another number of fields than the header's "
            f"{len(columns)} skipped (e.g. a row cut short when the run was killed)."
        )
    if not_numbers:
        problems.notes.append(
            f"`{path}`: {not_numbers} cell(s) that are not numbers read as missing."
        )
    return _Table(path, columns, rows)


def _finite(values) -> list[float]:
    return _stats.finite(values)


def _mean(values) -> float:
    return _stats.mean(values)


def _max(values) -> float:
    v = _finite(values)
    return max(v) if v else math.nan


def _when(timestamp) -> str:
    """A Unix time as local date and time with its UTC offset, e.g. 2025-05-01 14:03:07+02:00."""
    try:
        moment = datetime.datetime.fromtimestamp(float(timestamp)).astimezone()
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"
    return moment.isoformat(sep=" ", timespec="seconds")


def _fmt(value: Any, spec: str = ".1f") -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "n/a"
    return format(value, spec)


def _gpu_indices(table: _Table) -> list[int]:
    return sorted(int(m.group(1)) for c in table.columns if (m := _GPU_UTIL.match(c)))


def _epoch_starts(
    times: list[float], epochs: list[float], sessions: list[int] | None = None
) -> list[tuple[float, int]]:
    """(time, epoch) where each epoch begins; a new session starts its epochs afresh."""
    starts, last = [], None
    firsts = set(sessions or ())
    for k, (t, e) in enumerate(zip(times, epochs)):
        if k in firsts:
            last = None
        if math.isfinite(e) and e != last:
            starts.append((t, int(e)))
            last = e
    return starts


def _timeline_sessions(table: _Table) -> list[int]:
    """Row indices where a sampling session begins: 0, then wherever `elapsed_s` restarts."""
    starts, previous = [0] if table.rows else [], None
    for k, elapsed in enumerate(table.col("elapsed_s")):
        if not math.isfinite(elapsed):
            continue
        if previous is not None and elapsed < previous:
            starts.append(k)
        previous = elapsed
    return starts


def _steps_sessions(table: _Table) -> list[int]:
    """Row indices where a `fit` begins: 0, then wherever the (epoch, step) order restarts."""
    starts, previous = [0] if table.rows else [], None
    for k, r in enumerate(table.rows):
        e, step = r.get("epoch", math.nan), r.get("step", math.nan)
        if not (math.isfinite(e) and math.isfinite(step)):
            continue
        if previous is not None and (e, step) <= previous:
            starts.append(k)
        previous = (e, step)
    return starts


def _session_of(starts: list[int], n: int) -> list[int]:
    """The session number (0-based) of each of `n` rows."""
    out, session = [], -1
    firsts = set(starts)
    for k in range(n):
        if k in firsts:
            session += 1
        out.append(max(session, 0))
    return out


def _time_axis(table: _Table, starts: list[int], t0: float | None = None) -> list[float]:
    """Seconds since `t0` (default: the first sample) from `time`, for every row.

    Without a `time` column, the sessions' `elapsed_s` are laid end to end.
    """
    times = table.col("time")
    finite = _finite(times)
    if finite:
        base = finite[0] if t0 is None else t0
        return [t - base for t in times]
    elapsed = table.col("elapsed_s")
    if not _finite(elapsed):
        return [float(k) for k in range(len(table.rows))]
    out, offset, last = [], 0.0, 0.0
    firsts = set(starts)
    for k, v in enumerate(elapsed):
        if k in firsts and k > 0:
            offset = last
        x = offset + v if math.isfinite(v) else math.nan
        out.append(x)
        if math.isfinite(x):
            last = x
    return out


def _span(xs: list[float]) -> float:
    finite = _finite(xs)
    return finite[-1] - finite[0] if finite else math.nan


def _broken(values: list[float], starts: list[int]) -> list[float]:
    """`values` with a NaN before each session after the first: plotted lines break there."""
    out, firsts = [], set(starts)
    for k, v in enumerate(values):
        if k in firsts and k > 0:
            out.append(math.nan)
        out.append(v)
    return out


_ARTIFACT = re.compile(
    r"^(?P<stem>timeline|steps)(?P<worker>-[A-Za-z_]+\d+)?(?:\.(?P<n>\d+))?\.csv$"
)
_RECORD = re.compile(r"^(run|diagnosis)(-[A-Za-z_]+\d+)?(\.\d+)?\.json$")


@dataclass(frozen=True)
class _Artifact:
    """A timeline or steps file: `timeline.csv`, `timeline.2.csv`, `steps-worker1.csv`, ..."""

    path: Path
    worker: str  # "" or "-worker1"
    rotation: int | None  # N of `NAME.N.csv` (moved aside by a later session), None: newest

    @property
    def suffix(self) -> str:
        """What the file's plots add to their names: "", ".1", "-worker1", "-worker1.2"."""
        stem = _ARTIFACT.match(self.path.name)
        return self.path.stem[len(stem["stem"]) :] if stem else ""


def _artifacts(names: list[Path], stem: str) -> list[_Artifact]:
    """The `stem` CSV files among `names`, per worker oldest first (`.1`, `.2`, ..., plain)."""
    found = []
    for path in names:
        m = _ARTIFACT.match(path.name)
        if m and m["stem"] == stem:
            found.append(_Artifact(path, m["worker"] or "", int(m["n"]) if m["n"] else None))
    return sorted(found, key=lambda f: (f.worker, math.inf if f.rotation is None else f.rotation))


def _check_log_dir(log_dir) -> tuple[Path, list[Path]]:
    """The run directory and its entries; raises when it is not one."""
    path = check_dir("log_dir", log_dir)
    assert path is not None  # check_dir returns None only with allow_none
    if not path.exists():
        raise FileNotFoundError(
            f"Run directory not found: {str(path)!r}. Expected a directory written by "
            "tfgpu.callbacks.GPUMonitor / StepTimer (log_dir=...)."
        )
    names = sorted(path.iterdir())
    if not any(_ARTIFACT.match(p.name) or _RECORD.match(p.name) for p in names):
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: {str(path)!r}, which holds no "
            "tfgpu run (no run.json, timeline.csv, steps.csv or diagnosis.json). Expected a "
            "directory written by GPUMonitor / StepTimer / tfgpu.monitor.record."
        )
    return path, names


def _plottable(values: list[float], log: bool = False) -> list[float]:
    """`values` with what a plot cannot show (inf, and <= 0 on a log scale) as NaN."""
    return [v if math.isfinite(v) and not (log and v <= 0) else math.nan for v in values]


def _plot_lines(
    plt,
    out: Path,
    title: str,
    ylabel: str,
    series,
    epochs,
    *,
    ylim=None,
    log=False,
    legend=True,
    sessions=(),
) -> Path | None:
    with warnings.catch_warnings():  # matplotlib's own, on extreme values: the plot says it
        warnings.simplefilter("ignore")
        return _plot_lines_quietly(
            plt, out, title, ylabel, series, epochs, ylim=ylim, log=log, legend=legend,
            sessions=sessions,
        )  # fmt: skip


def _plot_lines_quietly(
    plt, out: Path, title: str, ylabel: str, series, epochs, *, ylim, log, legend, sessions
) -> Path | None:
    drawn = []
    for label, xs, ys, style in series:
        xs, ys = _plottable(xs), _plottable(ys, log)
        if any(math.isfinite(x) and math.isfinite(y) for x, y in zip(xs, ys)):
            drawn.append((label, xs, ys, style))
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for label, xs, ys, style in drawn:
        ax.plot(xs, ys, style, label=label, linewidth=1.2)
    if log:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    for t, e in epochs:
        if not math.isfinite(t):
            continue
        ax.axvline(t, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(
            f" epoch {e + 1}", (t, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top"
        )
    if len(sessions) > 1:
        for number, t in enumerate(sessions, 1):
            if not math.isfinite(t):
                continue
            ax.axvline(t, color="black", linestyle="--", linewidth=1.0)
            ax.annotate(
                f" fit {number}", (t, 0), xycoords=("data", "axes fraction"), fontsize=7,
                va="bottom",
            )  # fmt: skip
    ax.set_title(title)
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _drawn(problems: _Problems, draw, plt, out: Path, *args, **kw) -> Path | None:
    """Calls `draw(plt, out, ...)`; a plot that fails is named in `problems`, not raised."""
    try:
        return draw(plt, out, *args, **kw)
    except Exception as e:  # a plot is one part of the report: the others still get written
        problems.errors.append(f"`{out}` not drawn ({type(e).__name__}: {e}).")
        return None


def _timeline_plots(
    plt, table: _Table, out_dir: Path, suffix: str, problems: _Problems
) -> list[Path]:
    starts = _timeline_sessions(table)
    x = _time_axis(table, starts)
    marks = {
        "epochs": _epoch_starts(x, table.col("epoch"), starts),
        "sessions": [x[k] for k in starts],
    }
    t = _broken(x, starts)

    def col(name: str) -> list[float]:  # with the same breaks as the time axis
        return _broken(table.col(name), starts)

    def plot(name: str, title: str, ylabel: str, series, **kw) -> Path | None:
        return _drawn(
            problems,
            _plot_lines,
            plt,
            out_dir / f"{name}{suffix}.png",
            title,
            ylabel,
            series,
            marks["epochs"],
            sessions=marks["sessions"],
            **kw,
        )

    gpus = _gpu_indices(table)
    host_only = "" if gpus else " (no GPU sampled: host only)"
    util = [(f"GPU {i} utilization", t, col(f"gpu{i}_util_pct"), "-") for i in gpus]
    util.append(("host CPU, all cores", t, col("host_cpu_pct"), "--"))
    made = [plot("utilization", "Utilization" + host_only, "%", util, ylim=(0, 105))]
    mem = []
    for i in gpus:
        mem.append((f"GPU {i} used", t, col(f"gpu{i}_mem_used_mib"), "-"))
        mem.append((f"GPU {i} total", t, col(f"gpu{i}_mem_total_mib"), ":"))
    mem.append(("host: this process's RSS", t, col("host_rss_mib"), "--"))
    made.append(plot("memory", "Memory" + host_only, "MiB", mem))
    power = []
    for i in gpus:
        power.append((f"GPU {i} power draw", t, col(f"gpu{i}_power_w"), "-"))
        power.append((f"GPU {i} power limit", t, col(f"gpu{i}_power_limit_w"), ":"))
    if gpus:
        made.append(plot("power", "Power", "watts", power))
    active = _activity_gpus(table)
    if active:  # GPM counters recorded: what utilization hides, next to it
        activity = []
        for i in active:
            activity.append((f"GPU {i} utilization", t, col(f"gpu{i}_util_pct"), "-"))
            activity.append((f"GPU {i} SM active", t, col(f"gpu{i}_sm_active_pct"), "--"))
            activity.append((f"GPU {i} tensor active", t, col(f"gpu{i}_tensor_active_pct"), ":"))
        made.append(
            plot(
                "activity",
                "What utilization hides: utilization vs SM and tensor-core activity",
                "%",
                activity,
                ylim=(0, 105),
            )
        )
    return [p for p in made if p is not None]


_ACTIVITY = ("sm_active_pct", "tensor_active_pct")


def _activity_gpus(table: _Table) -> list[int]:
    """The GPUs with SM or tensor activity values (GPM) in the timeline."""
    return [
        i
        for i in _gpu_indices(table)
        if any(_finite(table.col(f"gpu{i}_{name}")) for name in _ACTIVITY)
    ]


def _steps_plot(plt, out: Path, table: _Table, t0: float | None) -> Path | None:
    times = table.col("time")
    finite = _finite(times)
    if not finite:
        return None
    starts = _steps_sessions(table)
    ms = [v * 1e3 for v in table.col("step_time_s")]
    # An epoch starts when its first step began: its end minus the time its steps took.
    counts = _steps_per_row(table.col("step"), starts)
    ends = [v - (t0 if t0 is not None else 0.0) for v in times]
    begin_times = [e - t * n / 1e3 if math.isfinite(t) else e for e, t, n in zip(ends, ms, counts)]
    base = 0.0 if t0 is not None else (_finite(begin_times) or finite)[0]
    xs = [v - base for v in ends]  # when each row's step(s) ended
    begins = [v - base for v in begin_times]
    epochs = _epoch_starts(begins, table.col("epoch"), starts)
    sessions = [begins[k] for k in starts]
    series = [("step time", _broken(xs, starts), _broken(ms, starts), ".")]
    return _plot_lines(
        plt,
        out,
        "Training step time (one point per step, or per execution of steps_per_execution)",
        "ms per step (log scale)",
        series,
        epochs,
        log=True,
        legend=False,
        sessions=sessions,
    )


def _steps_per_row(last_steps: list[float], starts: Sequence[int] = ()) -> list[int]:
    """Steps each `steps.csv` row covers, from the last step of each row within an epoch."""
    counts, previous = [], -1
    firsts = set(starts)
    for k, step in enumerate(last_steps):
        if k in firsts:
            previous = -1
        if not math.isfinite(step):
            counts.append(1)
            continue
        counts.append(int(step) - previous if step > previous else int(step) + 1)
        previous = int(step)
    return counts


def _timeline_section(table: _Table, name: str) -> list[str]:
    gpus = _gpu_indices(table)
    starts = _timeline_sessions(table)
    x = _time_axis(table, starts)
    lines = [f"## Timeline `{name}`", ""]
    if not table.rows:
        return [*lines, "No samples: the file has a header only (a run stopped at once).", ""]
    text = f"{len(table.rows)} samples over {_fmt(_span(x), '.2f')} s"
    if len(starts) > 1:
        ends = [*starts[1:], len(x)]
        sampled = sum(_span(x[a:b]) for a, b in zip(starts, ends) if _finite(x[a:b]))
        text += (
            f" in {len(starts)} sessions (one per `fit` or `record`, appended to this file), "
            f"{_fmt(sampled, '.2f')} s of them sampled; the plots mark where each began"
        )
    lines += [text + ".", ""]
    if not gpus:
        lines += [
            "**No GPU was sampled in this run: host metrics only** (a machine without an "
            "NVIDIA GPU, or without NVML: `tfgpu env` says which).",
            "",
        ]
    else:
        lines += [
            "| GPU | util mean % | util max % | idle share | mem used mean MiB | "
            "mem used max MiB | mem total MiB | power mean W | power max W |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for i in gpus:
            util = _finite(table.col(f"gpu{i}_util_pct"))
            idle = sum(v < IDLE_UTIL_PCT for v in util) / len(util) if util else math.nan
            lines.append(
                f"| {i} | {_fmt(_mean(util))} | {_fmt(_max(util))} | {_fmt(idle, '.0%')} | "
                f"{_fmt(_mean(table.col(f'gpu{i}_mem_used_mib')), '.0f')} | "
                f"{_fmt(_max(table.col(f'gpu{i}_mem_used_mib')), '.0f')} | "
                f"{_fmt(_max(table.col(f'gpu{i}_mem_total_mib')), '.0f')} | "
                f"{_fmt(_mean(table.col(f'gpu{i}_power_w')))} | "
                f"{_fmt(_max(table.col(f'gpu{i}_power_w')))} |"
            )
        lines += [
            "",
            f"Idle share: the share of samples with utilization below {IDLE_UTIL_PCT:g}%.",
            "",
        ]
        lines += _activity_lines(table, gpus)
    lines += [
        f"Host: CPU mean {_fmt(_mean(table.col('host_cpu_pct')))}%, process RSS max "
        f"{_fmt(_max(table.col('host_rss_mib')), '.0f')} MiB, system memory max "
        f"{_fmt(_max(table.col('host_mem_used_pct')))}%.",
        "",
    ]
    return lines


def _steps_section(table: _Table, name: str) -> list[str]:
    if not table.rows:
        return [f"## Steps `{name}`", "", "No steps: the file has a header only.", ""]
    st = [v * 1e3 for v in table.col("step_time_s")]
    starts = _steps_sessions(table)
    fits = len(starts) > 1
    lines = [
        f"## Steps `{name}`",
        "",
        f"{len(table.rows)} rows (one per step, or per execution of `steps_per_execution` "
        + (f"steps) from {len(starts)} `fit` calls appended to this file" if fits else "steps)")
        + f"; step time median {_fmt(_stats.median(st), '.2f')} ms, p90 "
        f"{_fmt(_stats.percentile(st, 90), '.2f')} ms; examples/s median "
        f"{_fmt(_stats.median(table.col('examples_per_s')), ',.0f')}. Epochs count from 1, "
        "as Keras prints them; the first step of epoch 1 includes tracing and compilation. "
        "An epoch's median and p90 leave out its first row (as `StepTimer`'s "
        "`step_time_median_s` and `step_time_p90_s` do), unless it has only one.",
        "",
        ("| fit " if fits else "")
        + "| epoch | steps | median step ms | p90 step ms | first step ms | time in steps s |",
        ("| --- " if fits else "") + "| --- | --- | --- | --- | --- | --- |",
    ]
    by_epoch: dict[tuple[int, int], list[dict[str, float]]] = {}
    for session, r in zip(_session_of(starts, len(table.rows)), table.rows):
        e = r.get("epoch", math.nan)
        by_epoch.setdefault((session, int(e) if math.isfinite(e) else -1), []).append(r)
    for (session, e), rows in sorted(by_epoch.items()):
        times = [r.get("step_time_s", math.nan) * 1e3 for r in rows]
        counts = _steps_per_row([r.get("step", math.nan) for r in rows])
        spent = sum(_finite([t * n / 1e3 for t, n in zip(times, counts)]))
        steady = times[1:] or times  # StepTimer's rule: the first execution is not steady
        lines.append(
            (f"| {session + 1} " if fits else "")
            + f"| {e + 1 if e >= 0 else '?'} | {sum(counts)} | "
            f"{_fmt(_stats.median(steady), '.2f')} | {_fmt(_stats.percentile(steady, 90), '.2f')} | "
            f"{_fmt(times[0], '.2f')} | {_fmt(spent, '.2f')} |"
        )
    lines.append("")
    return lines


# (column, header) of the activity table: GPM counters and PCIe, where recorded.
_ACTIVITY_TABLE = (
    ("sm_active_pct", "SM active mean %"),
    ("sm_occupancy_pct", "SM occupancy mean %"),
    ("tensor_active_pct", "tensor active mean %"),
    ("dram_active_pct", "DRAM active mean %"),
    ("pcie_tx_mib_s", "PCIe tx mean MiB/s"),
    ("pcie_rx_mib_s", "PCIe rx mean MiB/s"),
)


def _activity_lines(table: _Table, gpus: list[int]) -> list[str]:
    """The activity table (what utilization hides), when the timeline has such values."""
    shown = [
        (name, header)
        for name, header in _ACTIVITY_TABLE
        if any(_finite(table.col(f"gpu{i}_{name}")) for i in gpus)
    ]
    if not shown:
        return []  # an older timeline, or a GPU without GPM and PCIe counters
    lines = [
        "| GPU | util mean % | " + " | ".join(h for _, h in shown) + " |",
        "| --- | --- | " + " | ".join("---" for _ in shown) + " |",
    ]
    for i in gpus:
        cells = [_fmt(_mean(table.col(f"gpu{i}_{name}"))) for name, _ in shown]
        lines.append(
            f"| {i} | {_fmt(_mean(table.col(f'gpu{i}_util_pct')))} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "Utilization is the share of time a kernel was running, however few SMs it used; SM "
        "active is the share of SMs busy, tensor active the share of time the tensor cores "
        "worked (GPM, Hopper or newer). n/a: not measured on that GPU.",
        "",
    ]
    return lines


@dataclass
class _Energy:
    """Energy of one GPU over a timeline's sessions (`gpu{i}_energy_j`, cumulative J)."""

    gpu: int
    joules: float = 0.0
    seconds: float = 0.0
    spans: list[tuple[float, float]] = field(default_factory=list)  # unix times
    resets: int = 0  # sessions whose counter went backwards (driver reloaded): skipped


def _energy(table: _Table) -> list[_Energy]:
    """Energy used per GPU: per session, last minus first finite `energy_j`, summed.

    The counter is cumulative since the driver loaded, so only differences within a
    session count (between sessions the GPU may have run other work).
    """
    starts = _timeline_sessions(table)
    ends = [*starts[1:], len(table.rows)]
    times = table.col("time")
    out = []
    for i in _gpu_indices(table):
        values = table.col(f"gpu{i}_energy_j")
        if not _finite(values):
            continue
        e = _Energy(i)
        for a, b in zip(starts, ends):
            pairs = [(t, v) for t, v in zip(times[a:b], values[a:b]) if math.isfinite(v)]
            if len(pairs) < 2:
                continue
            (t_first, first), (t_last, last) = pairs[0], pairs[-1]
            if last < first:
                e.resets += 1
                continue
            e.joules += last - first
            if math.isfinite(t_first) and math.isfinite(t_last):
                e.seconds += t_last - t_first
                e.spans.append((t_first, t_last))
        if e.spans or e.joules or e.resets:
            out.append(e)
    return out


def _examples_in(steps: list[_Table], spans: list[tuple[float, float]]) -> float:
    """Examples trained in steps rows that ended within `spans` (NaN when unknown).

    A row covers `step_time_s x steps` seconds at `examples_per_s`: its examples are the
    product (the batch size times its steps).
    """
    total, known = 0.0, False
    for table in steps:
        starts = _steps_sessions(table)
        counts = _steps_per_row(table.col("step"), starts)
        for r, n in zip(table.rows, counts):
            t = r.get("time", math.nan)
            if not any(a <= t <= b for a, b in spans):
                continue
            examples = r.get("examples_per_s", math.nan) * r.get("step_time_s", math.nan) * n
            if math.isfinite(examples):
                total += examples
                known = True
    return total if known else math.nan


def _energy_section(
    timelines: list[tuple[_Artifact, _Table]], steps: dict[str, list[_Table]]
) -> list[str]:
    """Energy used per GPU and per example, for timelines with `gpu{i}_energy_j` values."""
    rows = []
    for artifact, table in timelines:
        energies = _energy(table)
        if not energies:
            continue
        spans = sorted({s for e in energies for s in e.spans})
        examples = _examples_in(steps.get(artifact.worker, []), spans)
        for e in energies:
            rows.append((artifact.path.name, str(e.gpu), e.joules, e.seconds, examples, e.resets))
        if len(energies) > 1:
            total = math.fsum(e.joules for e in energies)
            rows.append((artifact.path.name, "all", total, math.nan, examples, 0))
    if not rows:
        return []  # no energy counter recorded (an older timeline, an old driver)
    lines = [
        "## Energy",
        "",
        "| timeline | GPU | energy used kJ | over s | mean power W | examples | J per example |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    resets = 0
    for name, gpu, joules, seconds, examples, reset in rows:
        power = joules / seconds if seconds > 0 else math.nan
        per_example = joules / examples if examples > 0 else math.nan
        lines.append(
            f"| `{name}` | {gpu} | {_fmt(joules / 1e3, '.3f')} | {_fmt(seconds, '.1f')} | "
            f"{_fmt(power)} | {_fmt(examples, ',.0f')} | {_fmt(per_example, '.4g')} |"
        )
        resets += reset
    lines += [
        "",
        "Energy used: the GPU's energy counter (NVML, cumulative) at the last sample minus the "
        "first, per session. Examples: the rows of `steps.csv` (StepTimer) that ended in the "
        "same span (examples/s x step time x steps). n/a examples: no `steps.csv` over that "
        "span, or a batch size StepTimer could not tell (`StepTimer(batch_size=...)`).",
        "",
    ]
    if resets:
        lines += [
            f"{resets} session(s) skipped where the energy counter went backwards (the driver "
            "was reloaded).",
            "",
        ]
    return lines


# Timeline columns (per GPU) that only a monitor which reads the GPU counters writes: a
# timeline without any of them is from an older tfgpu, and what it lacks is not "unseen".
_COUNTER_COLUMNS = ("sm_active_pct", "tensor_active_pct", "pcie_tx_mib_s", "pcie_rx_mib_s")
# Which columns each of `_gpu_counters.unseen`'s notes is about.
_UNSEEN_COLUMNS = {
    counters.GPM_UNSEEN: ("sm_active_pct", "tensor_active_pct"),
    counters.PCIE_UNSEEN: ("pcie_tx_mib_s", "pcie_rx_mib_s"),
    counters.POWER_UNSEEN: ("power_limit_w", "throttle_reasons"),
}
_NO_BITMASK = 2.0**64  # NVML's throttle reasons are an unsigned 64-bit mask


def _bits_or(values: list[float]) -> float:
    """The bitwise OR of the bitmasks among `values` (as a float), NaN when there is none."""
    masks = [int(v) for v in _finite(values) if 0 <= v < _NO_BITMASK]
    out = 0
    for m in masks:
        out |= m
    return float(out) if masks else math.nan


def _window_counters(table: _Table, gpu: int, a: int, b: int) -> counters.Counters:
    """GPU `gpu`'s counters over rows `a:b` of a timeline: means, the power limit's maximum
    and the throttle reasons' OR, as the sampler aggregates them for `diagnose`."""

    def col(name: str) -> list[float]:
        return table.col(f"gpu{gpu}_{name}")[a:b]

    pcie = [m for m in (_mean(col("pcie_tx_mib_s")), _mean(col("pcie_rx_mib_s"))) if m == m]
    return counters.Counters(
        util_pct_mean=_mean(col("util_pct")),
        sm_active_pct_mean=_mean(col("sm_active_pct")),
        tensor_active_pct_mean=_mean(col("tensor_active_pct")),
        pcie_mib_s_mean=sum(pcie) if pcie else math.nan,  # inf past the float maximum
        power_w_mean=_mean(col("power_w")),
        power_limit_w_max=_max(col("power_limit_w")),
        throttle_reasons_any=_bits_or(col("throttle_reasons")),
        sm_clock_mhz_mean=_mean(col("sm_clock_mhz")),
    )


def _step_time_in(steps: list[_Table], first: float, last: float) -> float:
    """Median seconds per step of the steps rows that ended within [first, last] (NaN)."""
    times = [
        r.get("step_time_s", math.nan)
        for table in steps
        for r in table.rows
        if first <= r.get("time", math.nan) <= last
    ]
    return _stats.median([t for t in _finite(times) if t > 0])


def _gpu_list(gpus: list[int]) -> str:
    names = [str(i) for i in gpus]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _counter_lines(table: _Table, name: str, steps: list[_Table]) -> list[str]:
    """One timeline's findings from its GPU counters, per session and GPU ([] if none)."""
    gpus = _gpu_indices(table)
    if not (gpus and table.rows):
        return []
    recorded = any(f"gpu{i}_{c}" in table.columns for i in gpus for c in _COUNTER_COLUMNS)
    starts = _timeline_sessions(table)
    ends = [*starts[1:], len(table.rows)]
    times = table.col("time")
    items: list[str] = []
    unseen: dict[str, list[int]] = {}
    fixes: set[str] = set()  # each fix written out once per file
    for number, (a, b) in enumerate(zip(starts, ends), 1):
        span = _finite(times[a:b])
        step_time = _step_time_in(steps, span[0], span[-1]) if span else math.nan
        where = f" (session {number})" if len(starts) > 1 else ""
        for i in gpus:
            c = _window_counters(table, i, a, b)
            found = [
                counters.tensor_cores_idle(c),
                counters.small_kernels(c),
                counters.clocks_throttled(c),
                counters.pcie_unjudged(c, step_time),
            ]
            for f in found:
                if f is not None:
                    fix = "the same as above" if f.fix in fixes else f.fix
                    fixes.add(f.fix)
                    items += [
                        f"- **GPU {i}**{where}, {f.severity}: **{f.title}**. {f.detail()}",
                        f"  Fix: {fix}",
                    ]
            for note in counters.unseen(c, with_util=False) if recorded else []:
                columns = _UNSEEN_COLUMNS.get(note, ())
                if any(f"gpu{i}_{col}" in table.columns for col in columns):
                    seen_on = unseen.setdefault(note, [])
                    if i not in seen_on:
                        seen_on.append(i)
    if not (items or recorded):
        return []  # an older timeline with nothing to say: as before
    lines = [f"### `{name}`", ""]
    if not any(line.startswith("- **GPU") and ", info:" not in line for line in items):
        lines.append(f"No finding on GPU {_gpu_list(gpus)}.")
        lines.append("")
    lines += items
    lines += [f"- Not seen on GPU {_gpu_list(g)}: {note}." for note, g in unseen.items()]
    return [*lines, ""]


def _counter_section(
    timelines: list[tuple[_Artifact, _Table]], steps: dict[str, list[_Table]]
) -> list[str]:
    """ "Findings from the GPU counters": what utilization hides, with the rules `diagnose`
    uses (`tfgpu._gpu_counters`), from each timeline's per-GPU means."""
    body: list[str] = []
    for artifact, table in timelines:
        body += _counter_lines(table, artifact.path.name, steps.get(artifact.worker, []))
    if not body:
        return []  # older timelines, host-only runs
    return [
        "## Findings from the GPU counters",
        "",
        "What utilization hides, from each timeline's per-GPU means (per session where a "
        "file holds several), with the thresholds `tfgpu.diagnose` uses (docs/diagnosis.md). "
        "A timeline knows nothing of the model: `tfgpu.diagnose(model, data)` names the "
        "layers, the precision policy and the batch's bytes behind a finding.",
        "",
        *body,
    ]


def _read_record(path: Path, problems: _Problems) -> dict[str, Any] | None:
    """A JSON object file (`run.json`, `diagnosis.json`), or None (told to `problems`)."""
    try:
        return read_json_object(path)
    except OSError as e:
        problems.errors.append(f"`{path}` cannot be read ({_reason(e)}).")
    except ValueError as e:
        problems.errors.append(f"{e}.".replace(str(path), f"`{path}`", 1))
    return None


def _text(value: Any) -> str:
    """A record's value as Markdown text: `?` when missing."""
    return "?" if value is None else str(value)


def _diagnosis_section(path: Path, problems: _Problems) -> list[str]:
    title = (
        "## Diagnosis" if path.name == "diagnosis.json" else f"## Earlier diagnosis `{path.name}`"
    )
    d = _read_record(path, problems)
    if d is None:
        return [title, "", f"`{path.name}` could not be read (see Problems above).", ""]
    lines = [title, ""]
    text = d.get("text")
    if isinstance(text, str) and text.strip():
        return [*lines, "```", text.rstrip().replace("```", "'''"), "```", ""]
    lines += [f"Bottleneck: **{_text(d.get('bottleneck', 'unknown'))}**", ""]
    findings = d.get("findings")
    for f in findings if isinstance(findings, list) else []:
        if isinstance(f, dict):
            name = f.get("title", f.get("kind"))
            lines.append(f"- **{_text(name)}**: {_text(f.get('recommendation', ''))}")
    return [*lines, ""]


def _gpu_line(g: Any) -> str:
    if not isinstance(g, dict):
        return f"- GPU: {_text(g)}"
    cc = g.get("compute_capability")
    cc_text = ".".join(str(c) for c in cc) if isinstance(cc, list) else _text(cc)
    return (
        f"- GPU {_text(g.get('index'))}: {_text(g.get('name'))} "
        f"({_fmt(g.get('memory_total_mib'), '.0f')} MiB, compute capability {cc_text})"
    )


def _gpus_of(session: dict[str, Any]) -> list[Any]:
    gpus = session.get("gpus")
    return gpus if isinstance(gpus, list) else []


def _session_line(meta: dict[str, Any]) -> str:
    worker = meta.get("worker")
    return (
        f"tfgpu {_text(meta.get('tfgpu_version'))}, host `{_text(meta.get('hostname'))}`"
        + (f", worker {worker}" if worker is not None else "")
        + f", started {_when(meta.get('start_time'))}, sampling every "
        f"{_text(meta.get('interval'))} s."
    )


def _sessions_section(
    meta: dict[str, Any], run_json: Path, timelines: list[_Artifact], problems: _Problems
) -> list[str]:
    """The sessions recorded in `run.json` (the newest, and `earlier_sessions`)."""
    newest = {k: v for k, v in meta.items() if k != EARLIER_SESSIONS}
    earlier_raw = meta.get(EARLIER_SESSIONS) or []
    if not isinstance(earlier_raw, list):
        problems.notes.append(
            f"`{run_json}`: `{EARLIER_SESSIONS}` is a {type(earlier_raw).__name__}, not a "
            "list: earlier sessions not listed."
        )
        earlier_raw = []
    earlier = [s for s in earlier_raw if isinstance(s, dict)]
    if len(earlier) < len(earlier_raw):
        problems.notes.append(
            f"`{run_json}`: {len(earlier_raw) - len(earlier)} entr(ies) of "
            f"`{EARLIER_SESSIONS}` are not objects: not listed."
        )
    lines: list[str] = []
    if earlier:
        sessions = [*earlier, newest]
        lines += [
            f"{len(sessions)} sessions recorded in `{run_json.name}`, oldest first:",
            "",
            "| session | started | host | GPUs sampled | timeline |",
            "| --- | --- | --- | --- | --- |",
        ]
        for number, s in enumerate(sessions, 1):
            gpus = _gpus_of(s)
            names = sorted({_text(g.get("name")) for g in gpus if isinstance(g, dict)})
            label = f"{number} (newest)" if number == len(sessions) else str(number)
            lines.append(
                f"| {label} | {_when(s.get('start_time'))} | `{_text(s.get('hostname'))}` | "
                f"{len(gpus)}{' (' + ', '.join(names) + ')' if names else ''} | "
                f"`{_text(s.get('timeline'))}` |"
            )
        lines += ["", "Newest session: " + _session_line(newest), ""]
        present = {t.path.name for t in timelines}
        for s in sessions:
            name = s.get("timeline")
            if isinstance(name, str) and name and name not in present:
                problems.notes.append(f"`{run_json.name}` names `{name}`, which is not here.")
                present.add(name)
    else:
        lines += [_session_line(newest), ""]
    gpus = _gpus_of(newest)
    lines += [_gpu_line(g) for g in gpus]  # none: the timeline section says host only
    if gpus:
        lines.append("")
    return lines


def _files_section(
    timelines: list[_Artifact], steps: list[_Artifact], names: list[Path]
) -> list[str]:
    """Says which files were moved aside by later sessions (and where their plots are)."""
    rotated = [a.path.name for a in [*timelines, *steps] if a.rotation is not None]
    diagnoses = [p.name for p in _diagnoses(names) if p.name != "diagnosis.json"]
    damaged = [p.name for p in names if re.match(r"^run(-[A-Za-z_]+\d+)?\.\d+\.json$", p.name)]
    lines: list[str] = []
    if rotated:
        lines += [
            "Earlier files, moved aside when a later session sampled another set of GPUs (the "
            "plain names hold the newest): " + ", ".join(f"`{n}`" for n in rotated) + ". Each "
            "has its own section below, oldest first, and its own plots (`utilization.1.png` "
            "for `timeline.1.csv`).",
            "",
        ]
    if diagnoses:
        lines += [
            "Earlier diagnoses, kept when a later one was saved: "
            + ", ".join(f"`{n}`" for n in diagnoses)
            + " (below, before the newest).",
            "",
        ]
    if damaged:
        lines += [
            "Records moved aside because a later session could not read them (damaged): "
            + ", ".join(f"`{n}`" for n in damaged)
            + ".",
            "",
        ]
    return lines


def _diagnoses(names: list[Path]) -> list[Path]:
    """`diagnosis.N.json` (earlier diagnoses, moved aside by later ones), oldest first, then
    `diagnosis.json`."""
    found = []
    for path in names:
        m = re.match(r"^diagnosis(?:\.(\d+))?\.json$", path.name)
        if m:
            found.append((int(m[1]) if m[1] else math.inf, path))
    return [path for _, path in sorted(found)]


def _section(problems: _Problems, path: Path, make, *args) -> list[str]:
    """`make(*args)`, the lines of one section; values it cannot handle skip that section
    (named in `problems`) instead of the whole report."""
    try:
        return make(*args)
    except Exception as e:  # one file's odd values must not cost the rest of the report
        problems.errors.append(
            f"`{path}`: its section could not be written ({type(e).__name__}: {e})."
        )
        return []


def _t0_for(table: _Table, worker: str, starts: dict[str, list[float]]) -> float | None:
    """Time 0 for a steps file's plot: the first sample of the timeline it falls in."""
    times = _finite(table.col("time"))
    if not times:
        return None
    before = [t for t in starts.get(worker, []) if t <= times[0]]
    return max(before) if before else None


class _Plt:
    """The pyplot subset used, on Agg-backed Figures: no global state, no GUI."""

    def __init__(self) -> None:
        from tfgpu._lazy import import_optional

        import_optional("matplotlib")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self._figure, self._canvas = Figure, FigureCanvasAgg

    def subplots(self, figsize):
        fig = self._figure(figsize=figsize)
        self._canvas(fig)
        return fig, fig.add_subplot()

    @staticmethod
    def close(fig):
        fig.clear()


def write_report_and_problems(
    log_dir: str | os.PathLike, *, out_dir: str | os.PathLike | None = None
) -> tuple[Path, _Problems]:
    """`write_report` for front ends: returns `report.md`'s path and what could not be read.

    The CLI prints the problems as `error:` lines (exit status 2) instead of warnings.
    """
    check_dir("log_dir", log_dir)  # both arguments, before any work
    out_arg = check_dir("out_dir", out_dir, allow_none=True)
    run, names = _check_log_dir(log_dir)
    out = run if out_arg is None else out_arg
    plt = _Plt()  # ImportError (with the pip line) before anything is written
    out.mkdir(parents=True, exist_ok=True)
    problems = _Problems()

    timelines = _artifacts(names, "timeline")
    steps = _artifacts(names, "steps")
    lines = [f"# tfgpu run report: `{run}`", ""]
    if (run / "run.json") in names:
        meta = _read_record(run / "run.json", problems)
        if meta is not None:
            lines += _section(
                problems, run / "run.json", _sessions_section, meta, run / "run.json", timelines,
                problems,
            )  # fmt: skip
    lines += _files_section(timelines, steps, names)

    body: list[str] = []
    images: list[Path] = []
    first_samples: dict[str, list[float]] = {}  # per worker: each timeline's time 0
    read_timelines: list[tuple[_Artifact, _Table]] = []
    read_steps: dict[str, list[_Table]] = {}  # per worker
    for artifact in timelines:
        table = _read_table(artifact.path, ("time", "elapsed_s"), "timeline", problems)
        if table is None:
            body += [f"## Timeline `{artifact.path.name}`", "", "Skipped (see Problems).", ""]
            continue
        read_timelines.append((artifact, table))
        times = _finite(table.col("time"))
        if times:
            first_samples.setdefault(artifact.worker, []).append(times[0])
        body += _section(problems, artifact.path, _timeline_section, table, artifact.path.name)
        images += _timeline_plots(plt, table, out, artifact.suffix, problems)
    if not timelines:
        body += ["No timeline in this run directory (no GPUMonitor / monitor.record).", ""]
    for artifact in steps:
        table = _read_table(artifact.path, ("step_time_s",), "steps file", problems)
        if table is None:
            body += [f"## Steps `{artifact.path.name}`", "", "Skipped (see Problems).", ""]
            continue
        read_steps.setdefault(artifact.worker, []).append(table)
        body += _section(problems, artifact.path, _steps_section, table, artifact.path.name)
        t0 = _t0_for(table, artifact.worker, first_samples)
        img = _drawn(problems, _steps_plot, plt, out / f"step_time{artifact.suffix}.png", table, t0)
        if img is not None:
            images.append(img)
    if read_timelines:
        body += _section(problems, run, _energy_section, read_timelines, read_steps)
        body += _section(problems, run, _counter_section, read_timelines, read_steps)
    for diagnosis in _diagnoses(names):  # earlier ones (diagnosis.1.json, ...) first
        body += _section(problems, diagnosis, _diagnosis_section, diagnosis, problems)
    if images:
        body += ["## Plots", ""]
        body += [f"![{p.stem}]({p.name})" for p in images]
        body.append("")
    summary = out / "report.md"
    try:
        write_text_atomic(summary, "\n".join(lines + problems.section() + body))
    except OSError as e:
        raise OSError(e.errno, f"cannot write {str(summary)!r} ({_reason(e)})") from e
    return summary, problems


def write_report(log_dir: str | os.PathLike, *, out_dir: str | os.PathLike | None = None) -> Path:
    """Writes PNG plots and a Markdown summary of a run directory; returns the summary's path.

    Every session in the directory is covered: timeline and steps files moved aside by a
    later session (`timeline.1.csv`, ...) get their own sections and plots, and the sessions
    of `run.json` (with its `"earlier_sessions"`) are listed. A damaged file does not stop
    the report: it is skipped (or read up to the damage), named in a "Problems" section at
    the top of `report.md`, and warned about.

    Args:
        log_dir: str or os.PathLike, a directory written by `GPUMonitor`, `StepTimer`,
            `tfgpu.monitor.record(log_dir)` or `tfgpu.diagnose(..., log_dir=...)`.
        out_dir: str, os.PathLike or None, where to write `report.md` and the PNGs (created
            if missing). Defaults to `None`: `log_dir` itself.

    Returns:
        `pathlib.Path` of `report.md`.

    Raises:
        TypeError: if `log_dir` or `out_dir` is not a path.
        ValueError: if `log_dir` or `out_dir` is (or is under) a file, or `log_dir` holds no
            tfgpu run.
        FileNotFoundError: if `log_dir` does not exist.
        ImportError: if matplotlib is not installed (with the pip line).
        OSError: if `out_dir` or `report.md` cannot be written.

    Warns:
        UserWarning: for each file that could not be read, or plot that could not be drawn
            (the rest of the report is written).

    Example:

    >>> from tfgpu.report import write_report
    >>> write_report("runs/exp1")  # doctest: +SKIP
    PosixPath('runs/exp1/report.md')
    """
    summary, problems = write_report_and_problems(log_dir, out_dir=out_dir)
    for error in problems.errors:
        warnings.warn(f"tfgpu report: {error} The rest is in {summary}.", stacklevel=2)
    return summary
