"""The report's PNG plots (Agg figures): utilization, memory, power, activity, step time, on one
time axis with epochs and sessions marked; a plot that fails is named in the problems."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from tfgpu._internal.helpers import stats
from tfgpu.report import _series as series
from tfgpu.report._read import Artifact, Problems, Table


def _plottable(values: list[float], log: bool = False) -> list[float]:
    """`values` with what a plot cannot show (inf, and <= 0 on a log scale) as NaN."""
    return [v if math.isfinite(v) and not (log and v <= 0) else math.nan for v in values]


def _plot_lines(
    out: Path,
    title: str,
    ylabel: str,
    curves,
    epochs,
    *,
    ylim=None,
    log=False,
    legend=True,
    sessions=(),
    xmin=None,
    xlabel=None,
) -> Path | None:
    drawn = []
    for label, xs, ys, style in curves:
        xs, ys = _plottable(xs), _plottable(ys, log)
        if any(math.isfinite(x) and math.isfinite(y) for x, y in zip(xs, ys)):
            drawn.append((label, xs, ys, style))
    if not drawn:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6))  # Agg-backed, no pyplot: no global state, no GUI
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, xs, ys, style in drawn:
        ax.plot(xs, ys, style, label=label, linewidth=1.2)
    if log:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if xmin is not None:  # no margin before time 0: the axis starts where the data does
        ax.set_xlim(left=xmin)

    def mark(t: float, text: str, y: int, **line) -> None:
        """A vertical line at time `t`, labelled at the top (`y=1`) or bottom (0) of the axes."""
        if math.isfinite(t):
            ax.axvline(t, **line)
            va = "top" if y else "bottom"
            ax.annotate(text, (t, y), xycoords=("data", "axes fraction"), fontsize=7, va=va)

    for t, e in epochs:
        mark(t, f" epoch {e + 1}", 1, color="grey", linestyle=":", linewidth=0.8)
    for number, t in enumerate(sessions if len(sessions) > 1 else [], 1):
        mark(t, f" fit {number}", 0, color="black", linestyle="--", linewidth=1.0)
    ax.set_title(title)
    ax.set_xlabel(xlabel or "seconds since the first sample")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    fig.clear()
    return out


def try_draw(problems: Problems, draw, out: Path, *args, **kw) -> Path | None:
    """Calls `draw(out, ...)`; a plot that fails is named in `problems`, not raised."""
    try:
        with warnings.catch_warnings():  # matplotlib's own, on extreme values: the plot says it
            warnings.simplefilter("ignore")
            return draw(out, *args, **kw)
    except Exception as e:  # a plot is one part of the report: the others still get written
        problems.errors.append(f"`{out}` not drawn ({type(e).__name__}: {e}).")
        return None


def timeline_plots(table: Table, out_dir: Path, suffix: str, problems: Problems) -> list[Path]:
    starts = series.timeline_sessions(table)
    x = series.time_axis(table, starts)
    epochs = series.epoch_starts(x, table.col("epoch"), starts)
    sessions = [x[k] for k in starts]
    t = series.broken(x, starts)

    def col(name: str) -> list[float]:  # with the same breaks as the time axis
        return series.broken(table.col(name), starts)

    def per_gpu(gpus: list[int], *lines: tuple[str, str, str]) -> list:
        """Each GPU's curves, GPU by GPU, from the (label, column, style) of each line."""
        return [
            (f"GPU {i} {label}", t, col(f"gpu{i}_{name}"), style)
            for i in gpus
            for label, name, style in lines
        ]

    def plot(name: str, title: str, ylabel: str, curves, **kw) -> Path | None:
        out = out_dir / f"{name}{suffix}.png"
        return try_draw(
            problems, _plot_lines, out, title, ylabel, curves, epochs, sessions=sessions, **kw
        )

    gpus = series.gpu_indices(table)
    host_only = "" if gpus else " (no GPU sampled: host only)"
    util = per_gpu(gpus, ("utilization", "util_pct", "-"))
    util.append(("host CPU, all cores", t, col("host_cpu_pct"), "--"))
    made = [plot("utilization", "Utilization" + host_only, "%", util, ylim=(0, 105))]
    mem = per_gpu(gpus, ("used", "mem_used_mib", "-"), ("total", "mem_total_mib", ":"))
    mem.append(("host: this process's RSS", t, col("host_rss_mib"), "--"))
    made.append(plot("memory", "Memory" + host_only, "MiB", mem))
    if gpus:
        power = per_gpu(gpus, ("power draw", "power_w", "-"), ("power limit", "power_limit_w", ":"))
        made.append(plot("power", "Power", "watts", power))
    # The GPUs with SM or tensor activity values (GPM): what utilization hides, next to it.
    activity_columns = ("sm_active_pct", "tensor_active_pct")
    active = [i for i in gpus if any(stats.finite(col(f"gpu{i}_{c}")) for c in activity_columns)]
    if active:
        activity = per_gpu(
            active,
            ("utilization", "util_pct", "-"),
            ("SM active", "sm_active_pct", "--"),
            ("tensor active", "tensor_active_pct", ":"),
        )
        title = "What utilization hides: utilization vs SM and tensor-core activity"
        made.append(plot("activity", title, "%", activity, ylim=(0, 105)))
    return [p for p in made if p is not None]


def steps_plot(out: Path, table: Table, t0: float | None) -> Path | None:
    times = table.col("time")
    finite = stats.finite(times)
    if not finite:
        return None
    starts = series.steps_sessions(table)
    ms = [v * 1e3 for v in table.col("step_time_s")]
    counts = series.steps_per_row(table.col("step"), starts)
    ends = [v - (t0 if t0 is not None else 0.0) for v in times]
    begin_times = series.step_begins(ends, ms, counts, starts)
    base = 0.0 if t0 is not None else (stats.finite(begin_times) or finite)[0]
    # Time 0: the timeline's first sample or the first step's begin; nothing is drawn before
    # it, whatever the rows claim (an overstated step count began epoch 1 at -1.6 s).
    xs = [_not_before_0(v - base) for v in ends]  # when each row's step(s) ended
    begins = [_not_before_0(v - base) for v in begin_times]
    epochs = series.epoch_starts(begins, table.col("epoch"), starts)
    return _plot_lines(
        out,
        "Training step time (one point per step, or per execution of steps_per_execution)",
        "ms per step (log scale)",
        [("step time", series.broken(xs, starts), series.broken(ms, starts), ".")],
        epochs,
        log=True,
        legend=False,
        sessions=[begins[k] for k in starts],
        xmin=0.0,
        xlabel=None if t0 is not None else "seconds since the first step began",
    )


def _not_before_0(t: float) -> float:
    """`t`, or 0 for a negative time (NaN stays NaN: no point)."""
    return 0.0 if t < 0 else t


def t0_for(table: Table, worker: str, timelines: list[tuple[Artifact, Table]]) -> float | None:
    """Time 0 for a steps file's plot: the first sample of the worker's timeline it falls in."""
    times = stats.finite(table.col("time"))
    samples = [stats.finite(t.col("time")) for a, t in timelines if a.worker == worker]
    before = [s[0] for s in samples if s and times and s[0] <= times[0]]
    return max(before) if before else None
