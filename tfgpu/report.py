"""`tfgpu report RUN_DIR`: plots and a Markdown summary of a run directory.

A run directory is what `GPUMonitor`, `StepTimer`, `tfgpu.monitor.record(path)` and
`tfgpu.diagnose(..., run_dir=...)` write: `run.json`, `timeline.csv` (or
`timeline-worker{k}.csv`), `steps.csv` (or `steps-worker{k}.csv`) and `diagnosis.json`.
`write_report` reads what is there and writes, into the same directory (or `out_dir`):

- `utilization.png`: GPU utilization and host CPU % over time;
- `memory.png`: GPU memory used (and total), host RSS;
- `power.png`: GPU power draw and limit (only when GPUs were sampled);
- `step_time.png`: milliseconds per training step over time, on a log scale so that the
  first step (tracing, compilation) and the steady steps both show (when `steps.csv` exists);
- `report.md`: averages, maxima, the GPUs' idle share, step-time statistics per epoch, and
  the saved diagnosis.

Epoch boundaries are drawn as vertical lines. Epochs are numbered from 1 in the plots and the
summary, as Keras prints them (`Epoch 1/8`); the CSV files' `epoch` column counts from 0, as
Keras's callbacks do. A run from a machine without a GPU has host metrics only, and the
summary says so.

Several `fit` calls (or `record` blocks) on one run directory append to the same files, and
each starts its own session: the timeline's `elapsed_s` and the steps' `epoch` restart at 0.
The report splits the files into sessions where they restart, plots everything on one time
axis (seconds since the first sample, from the `time` column) with each session marked,
gives the true time span, and keeps each session's epochs apart in the per-epoch table.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tfgpu._checks import invalid_type

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


def _read_csv(path: Path) -> _Table:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        rows = []
        for raw in reader:
            if raw.get(columns[0]) == columns[0]:  # a header repeated by an appending writer
                continue
            rows.append({k: _float(v) for k, v in raw.items() if k is not None})
    return _Table(path, columns, rows)


def _finite(values) -> list[float]:
    return [v for v in values if isinstance(v, float) and math.isfinite(v)]


def _mean(values) -> float:
    v = _finite(values)
    return statistics.fmean(v) if v else math.nan


def _max(values) -> float:
    v = _finite(values)
    return max(v) if v else math.nan


def _quantile(values, q: float) -> float:
    v = sorted(_finite(values))
    if not v:
        return math.nan
    k = min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))
    return v[k]


def _when(timestamp) -> str:
    """A Unix time as local date and time with its UTC offset, e.g. 2025-05-01 14:03:07+02:00."""
    try:
        moment = datetime.datetime.fromtimestamp(float(timestamp)).astimezone()
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"
    return moment.isoformat(sep=" ", timespec="seconds")


def _fmt(value: float, spec: str = ".1f") -> str:
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)


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


def _suffix(path: Path, stem: str) -> str:
    return path.stem[len(stem) :]  # "" or "-worker1"


def _check_run_dir(run_dir) -> Path:
    if not isinstance(run_dir, (str, Path)) and not hasattr(run_dir, "__fspath__"):
        raise invalid_type("run_dir", run_dir, "a path")
    path = Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(
            f"Run directory not found: {str(path)!r}. Expected a directory written by "
            "tfgpu.callbacks.GPUMonitor / StepTimer (log_dir=...)."
        )
    if not path.is_dir():
        raise NotADirectoryError(
            f"Invalid value for argument `run_dir`. Received: {str(path)!r}, which is a file. "
            "Expected a run directory."
        )
    known = [*path.glob("timeline*.csv"), *path.glob("steps*.csv")]
    known += [p for p in (path / "run.json", path / "diagnosis.json") if p.exists()]
    if not known:
        raise ValueError(
            f"Invalid value for argument `run_dir`. Received: {str(path)!r}, which holds no "
            "tfgpu run (no run.json, timeline.csv, steps.csv or diagnosis.json). Expected a "
            "directory written by GPUMonitor / StepTimer / tfgpu.monitor.record."
        )
    return path


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
    drawn = [(label, xs, ys, style) for label, xs, ys, style in series if _finite(ys)]
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
        ax.axvline(t, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(
            f" epoch {e + 1}", (t, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top"
        )
    if len(sessions) > 1:
        for number, t in enumerate(sessions, 1):
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


def _timeline_plots(plt, table: _Table, out_dir: Path, suffix: str) -> list[Path]:
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
        return _plot_lines(
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
    return [p for p in made if p is not None]


def _steps_plot(plt, table: _Table, out_dir: Path, suffix: str, t0: float | None) -> Path | None:
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
    base = 0.0 if t0 is not None else _finite(begin_times)[0]
    xs = [v - base for v in ends]  # when each row's step(s) ended
    begins = [v - base for v in begin_times]
    epochs = _epoch_starts(begins, table.col("epoch"), starts)
    sessions = [begins[k] for k in starts]
    series = [("step time", _broken(xs, starts), _broken(ms, starts), ".")]
    return _plot_lines(
        plt,
        out_dir / f"step_time{suffix}.png",
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
    lines += [
        f"Host: CPU mean {_fmt(_mean(table.col('host_cpu_pct')))}%, process RSS max "
        f"{_fmt(_max(table.col('host_rss_mib')), '.0f')} MiB, system memory max "
        f"{_fmt(_max(table.col('host_mem_used_pct')))}%.",
        "",
    ]
    return lines


def _steps_section(table: _Table, name: str) -> list[str]:
    st = [v * 1e3 for v in table.col("step_time_s")]
    starts = _steps_sessions(table)
    fits = len(starts) > 1
    lines = [
        f"## Steps `{name}`",
        "",
        f"{len(table.rows)} rows (one per step, or per execution of `steps_per_execution` "
        + (f"steps) from {len(starts)} `fit` calls appended to this file" if fits else "steps)")
        + f"; step time median {_fmt(_quantile(st, 0.5), '.2f')} ms, p90 "
        f"{_fmt(_quantile(st, 0.9), '.2f')} ms; examples/s median "
        f"{_fmt(_quantile(table.col('examples_per_s'), 0.5), ',.0f')}. Epochs count from 1, "
        "as Keras prints them; the first step of epoch 1 includes tracing and compilation.",
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
        lines.append(
            (f"| {session + 1} " if fits else "")
            + f"| {e + 1 if e >= 0 else '?'} | {sum(counts)} | "
            f"{_fmt(_quantile(times, 0.5), '.2f')} | {_fmt(_quantile(times, 0.9), '.2f')} | "
            f"{_fmt(times[0], '.2f')} | {_fmt(spent, '.2f')} |"
        )
    lines.append("")
    return lines


def _diagnosis_section(path: Path) -> list[str]:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return ["## Diagnosis", "", f"`diagnosis.json` could not be read: {e}", ""]
    lines = ["## Diagnosis", ""]
    if d.get("text"):
        lines += ["```", d["text"].rstrip(), "```", ""]
    else:
        lines.append(f"Bottleneck: **{d.get('bottleneck', 'unknown')}**")
        lines.append("")
        for f in d.get("findings", []):
            lines.append(f"- **{f.get('title', f.get('kind'))}**: {f.get('recommendation', '')}")
        lines.append("")
    return lines


def write_report(run_dir, out_dir=None) -> Path:
    """Writes PNG plots and a Markdown summary of a run directory; returns the summary's path.

    Args:
        run_dir: str or os.PathLike, a directory written by `GPUMonitor`, `StepTimer`,
            `tfgpu.monitor.record(path)` or `tfgpu.diagnose(..., run_dir=...)`.
        out_dir: str, os.PathLike or None, where to write `report.md` and the PNGs (created
            if missing). Defaults to `None`: `run_dir` itself.

    Returns:
        `pathlib.Path` of `report.md`.

    Raises:
        FileNotFoundError: if `run_dir` does not exist.
        NotADirectoryError: if `run_dir` is a file.
        ValueError: if `run_dir` holds no tfgpu run.
        TypeError: if `run_dir` is not a path.

    Example:

    >>> from tfgpu.report import write_report
    >>> write_report("runs/exp1")  # doctest: +SKIP
    PosixPath('runs/exp1/report.md')
    """
    run = _check_run_dir(run_dir)
    out = run if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    from tfgpu._lazy import import_optional

    import_optional("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    class _Plt:  # the pyplot subset used, on Agg-backed Figures: no global state, no GUI
        @staticmethod
        def subplots(figsize):
            fig = Figure(figsize=figsize)
            FigureCanvasAgg(fig)
            return fig, fig.add_subplot()

        @staticmethod
        def close(fig):
            fig.clear()

    plt = _Plt()

    meta: dict = {}
    if (run / "run.json").exists():
        try:
            meta = json.loads((run / "run.json").read_text())
        except ValueError as e:
            raise ValueError(
                f"Invalid run directory {str(run)!r}: run.json is not valid JSON ({e})."
            ) from e

    lines = [f"# tfgpu run report: `{run}`", ""]
    if meta:
        worker = meta.get("worker")
        lines.append(
            f"tfgpu {meta.get('tfgpu_version', '?')}, host `{meta.get('hostname', '?')}`"
            + (f", worker {worker}" if worker is not None else "")
            + f", started {_when(meta.get('start_time'))}, sampling every "
            f"{meta.get('interval', '?')} s."
        )
        lines.append("")
        gpus = meta.get("gpus") or []  # none: the timeline section says host only
        for g in gpus:
            cc = g.get("compute_capability")
            cc_text = ".".join(str(c) for c in cc) if isinstance(cc, list) else cc
            lines.append(
                f"- GPU {g.get('index')}: {g.get('name')} "
                f"({_fmt(g.get('memory_total_mib') or math.nan, '.0f')} MiB, compute "
                f"capability {cc_text})"
            )
        if gpus:
            lines.append("")

    images: list[Path] = []
    timelines = sorted(run.glob("timeline*.csv"))
    t0_by_suffix: dict[str, float] = {}  # the first sample: time 0 of every plot
    for path in timelines:
        table = _read_csv(path)
        suffix = _suffix(path, "timeline")
        times = _finite(table.col("time"))
        if times:
            t0_by_suffix[suffix] = times[0]
        lines += _timeline_section(table, path.name)
        images += _timeline_plots(plt, table, out, suffix)
    if not timelines:
        lines += ["No timeline in this run directory (no GPUMonitor / monitor.record).", ""]
    for path in sorted(run.glob("steps*.csv")):
        table = _read_csv(path)
        suffix = _suffix(path, "steps")
        lines += _steps_section(table, path.name)
        img = _steps_plot(plt, table, out, suffix, t0_by_suffix.get(suffix))
        if img is not None:
            images.append(img)
    if (run / "diagnosis.json").exists():
        lines += _diagnosis_section(run / "diagnosis.json")
    if images:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}]({p.name})" for p in images]
        lines.append("")
    summary = out / "report.md"
    summary.write_text("\n".join(lines))
    return summary
