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
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import re
import statistics
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


def _epoch_starts(times: list[float], epochs: list[float]) -> list[tuple[float, int]]:
    starts, last = [], None
    for t, e in zip(times, epochs):
        if math.isfinite(e) and e != last:
            starts.append((t, int(e)))
            last = e
    return starts


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
    plt, out: Path, title: str, ylabel: str, series, epochs, *, ylim=None, log=False, legend=True
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
    ax.set_title(title)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _timeline_plots(plt, table: _Table, out_dir: Path, suffix: str) -> list[Path]:
    t = table.col("elapsed_s")
    if not _finite(t):
        t0 = _finite(table.col("time"))
        t = [v - t0[0] for v in table.col("time")] if t0 else list(range(len(table.rows)))
    epochs = _epoch_starts(t, table.col("epoch"))
    gpus = _gpu_indices(table)
    made = []
    host_only = "" if gpus else " (no GPU sampled: host only)"
    util = [(f"GPU {i} utilization", t, table.col(f"gpu{i}_util_pct"), "-") for i in gpus]
    util.append(("host CPU, all cores", t, table.col("host_cpu_pct"), "--"))
    made.append(
        _plot_lines(
            plt,
            out_dir / f"utilization{suffix}.png",
            "Utilization" + host_only,
            "%",
            util,
            epochs,
            ylim=(0, 105),
        )
    )
    mem = []
    for i in gpus:
        mem.append((f"GPU {i} used", t, table.col(f"gpu{i}_mem_used_mib"), "-"))
        mem.append((f"GPU {i} total", t, table.col(f"gpu{i}_mem_total_mib"), ":"))
    mem.append(("host: this process's RSS", t, table.col("host_rss_mib"), "--"))
    made.append(
        _plot_lines(plt, out_dir / f"memory{suffix}.png", "Memory" + host_only, "MiB", mem, epochs)
    )
    power = []
    for i in gpus:
        power.append((f"GPU {i} power draw", t, table.col(f"gpu{i}_power_w"), "-"))
        power.append((f"GPU {i} power limit", t, table.col(f"gpu{i}_power_limit_w"), ":"))
    if gpus:
        made.append(
            _plot_lines(plt, out_dir / f"power{suffix}.png", "Power", "watts", power, epochs)
        )
    return [p for p in made if p is not None]


def _steps_plot(plt, table: _Table, out_dir: Path, suffix: str, t0: float | None) -> Path | None:
    times = table.col("time")
    finite = _finite(times)
    if not finite:
        return None
    base = t0 if t0 is not None else finite[0]
    xs = [v - base for v in times]  # when each row's step(s) ended
    ms = [v * 1e3 for v in table.col("step_time_s")]
    # An epoch starts when its first step began: its end minus the time its steps took.
    counts = _steps_per_row(table.col("step"))
    begins = [x - t * n / 1e3 if math.isfinite(t) else x for x, t, n in zip(xs, ms, counts)]
    epochs = _epoch_starts(begins, table.col("epoch"))
    series = [("step time", xs, ms, ".")]
    return _plot_lines(
        plt,
        out_dir / f"step_time{suffix}.png",
        "Training step time (one point per step, or per execution of steps_per_execution)",
        "ms per step (log scale)",
        series,
        epochs,
        log=True,
        legend=False,
    )


def _steps_per_row(last_steps: list[float]) -> list[int]:
    """Steps each `steps.csv` row covers, from the last step of each row within an epoch."""
    counts, previous = [], -1
    for step in last_steps:
        if not math.isfinite(step):
            counts.append(1)
            continue
        counts.append(int(step) - previous if step > previous else 1)
        previous = int(step)
    return counts


def _timeline_section(table: _Table, name: str) -> list[str]:
    gpus = _gpu_indices(table)
    t = _finite(table.col("elapsed_s"))
    lines = [f"## Timeline `{name}`", ""]
    lines.append(f"{len(table.rows)} samples over {_fmt(t[-1] - t[0] if t else math.nan)} s.")
    lines.append("")
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
    lines = [
        f"## Steps `{name}`",
        "",
        f"{len(table.rows)} rows (one per step, or per execution of `steps_per_execution` "
        f"steps); step time median {_fmt(_quantile(st, 0.5), '.2f')} ms, p90 "
        f"{_fmt(_quantile(st, 0.9), '.2f')} ms; examples/s median "
        f"{_fmt(_quantile(table.col('examples_per_s'), 0.5), ',.0f')}. Epochs count from 1, "
        "as Keras prints them; the first step of epoch 1 includes tracing and compilation.",
        "",
        "| epoch | steps | median step ms | p90 step ms | first step ms | time in steps s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    by_epoch: dict[int, list[dict[str, float]]] = {}
    for r in table.rows:
        e = r.get("epoch", math.nan)
        by_epoch.setdefault(int(e) if math.isfinite(e) else -1, []).append(r)
    for e, rows in sorted(by_epoch.items()):
        times = [r.get("step_time_s", math.nan) * 1e3 for r in rows]
        counts = _steps_per_row([r.get("step", math.nan) for r in rows])
        spent = sum(_finite([t * n / 1e3 for t, n in zip(times, counts)]))
        lines.append(
            f"| {e + 1 if e >= 0 else '?'} | {sum(counts)} | "
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
    t0_by_suffix: dict[str, float] = {}
    for path in timelines:
        table = _read_csv(path)
        suffix = _suffix(path, "timeline")
        times = _finite(table.col("time"))
        elapsed = _finite(table.col("elapsed_s"))
        if times:
            t0_by_suffix[suffix] = times[0] - (elapsed[0] if elapsed else 0.0)
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
