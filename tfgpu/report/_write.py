"""`write_report`: check the arguments, read each file of a run directory, write its sections
and plots, then `report.md` atomically (problems first)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from tfgpu._internal.helpers.checks import check_dir
from tfgpu._internal.helpers.files import write_text_atomic
from tfgpu._internal.helpers.lazy import import_optional
from tfgpu.report import _sections as sections
from tfgpu.report._energy import energy_section
from tfgpu.report._findings import counter_section
from tfgpu.report._plots import steps_plot, t0_for, timeline_plots, try_draw
from tfgpu.report._read import (
    Artifact,
    Problems,
    Table,
    artifacts,
    check_log_dir,
    diagnosis_files,
    read_record,
    read_table,
    reason,
    worker_records,
)
from tfgpu.report._show import ReportPath


def _section(problems: Problems, path: Path, make, *args) -> list[str]:
    """`make(*args)`, one section's lines; a section that fails is named in `problems`, skipped."""
    try:
        return make(*args)
    except Exception as e:  # one file's odd values must not cost the rest of the report
        problems.errors.append(
            f"`{path}`: its section could not be written ({type(e).__name__}: {e})."
        )
        return []


def write_report_and_problems(
    log_dir: str | os.PathLike, *, out_dir: str | os.PathLike | None = None
) -> tuple[Path, Problems]:
    """`write_report` for front ends: returns `report.md`'s path and what could not be read
    (the CLI prints them as `error:` lines, exit status 2, instead of warnings)."""
    check_dir("log_dir", log_dir)  # both arguments, before any work
    out_arg = check_dir("out_dir", out_dir, allow_none=True)
    run, names = check_log_dir(log_dir)
    out = run if out_arg is None else out_arg
    import_optional("matplotlib")  # ImportError (with the pip line) before anything is written
    out.mkdir(parents=True, exist_ok=True)
    problems = Problems()

    timelines, steps = artifacts(names, "timeline"), artifacts(names, "steps")
    lines = [f"# tfgpu run report: `{run}`", ""]
    run_json = run / "run.json"
    meta = read_record(run_json, problems) if run_json in names else None
    if meta is not None:
        lines += _section(
            problems, run_json, sections.sessions_section, meta, run_json, timelines, problems
        )
    lines += sections.files_section(timelines, steps, names)

    body = _worker_lines(worker_records(names), timelines, problems)
    images: list[Path] = []
    read_timelines: list[tuple[Artifact, Table]] = []
    for artifact in timelines:
        table = read_table(artifact.path, ("time", "elapsed_s"), "timeline", problems)
        body += _table_lines(problems, artifact, table, "Timeline", sections.timeline_section)
        if table is not None:
            read_timelines.append((artifact, table))
            images += timeline_plots(table, out, artifact.suffix, problems)
    if not timelines:
        body += ["No timeline in this run directory (no GPUMonitor / monitor.record).", ""]
    read_steps: dict[str, list[Table]] = {}
    for artifact in steps:
        table = read_table(artifact.path, ("step_time_s",), "steps file", problems)
        body += _table_lines(problems, artifact, table, "Steps", sections.steps_section)
        if table is not None:
            read_steps.setdefault(artifact.worker, []).append(table)
            t0 = t0_for(table, artifact.worker, read_timelines)
            img = try_draw(problems, steps_plot, out / f"step_time{artifact.suffix}.png", table, t0)
            if img is not None:
                images.append(img)
    if read_timelines:
        body += _section(problems, run, energy_section, read_timelines, read_steps)
        body += _section(problems, run, counter_section, read_timelines, read_steps)
    for diagnosis in diagnosis_files(names):  # earlier ones (diagnosis.1.json, ...) first
        body += _section(problems, diagnosis, sections.diagnosis_section, diagnosis, problems)
    for result in (run / name for name in sections.RESULTS):  # tune.json, scaling.json
        if result in names:  # a dangling link or a loop too: named when it cannot be read
            body += _section(problems, result, sections.result_section, result, out, problems)
    if images:
        body += ["## Plots", "", *(f"![{p.stem}]({p.name})" for p in images), ""]
    summary = out / "report.md"
    try:
        write_text_atomic(summary, "\n".join(lines + problems.section() + body))
    except OSError as e:
        raise OSError(e.errno, f"cannot write {str(summary)!r} ({reason(e)})") from e
    return summary, problems


def _worker_lines(workers: list[Path], timelines: list[Artifact], problems: Problems) -> list[str]:
    """A multi-worker run's sessions: each task's run-{task}{k}.json, like run.json."""
    if not workers:
        return []
    lines = [
        "## Workers",
        "",
        "Each task of a multi-worker run records its own sessions: "
        f"{sections.listed([p.name for p in workers])}. (The chief's are in `run.json` too.)",
        "",
    ]
    for record in workers:
        lines += [f"### `{record.name}`", ""]
        meta = read_record(record, problems)
        if meta is None:
            lines += ["Skipped (see Problems).", ""]
            continue
        lines += _section(
            problems, record, sections.sessions_section, meta, record, timelines, problems
        )
    return lines


def _table_lines(problems: Problems, artifact: Artifact, table, heading: str, make) -> list[str]:
    """A CSV file's section, or its heading and where to read why it was skipped."""
    if table is None:
        return [f"## {heading} `{artifact.path.name}`", "", "Skipped (see Problems).", ""]
    return _section(problems, artifact.path, make, table, artifact.path.name)


def write_report(
    log_dir: str | os.PathLike, *, out_dir: str | os.PathLike | None = None
) -> ReportPath:
    """Writes PNG plots and a Markdown summary of a run directory; returns the summary's path.

    Covers every session, moved-aside file and worker; a damaged file is named in a
    "Problems" section at the top of `report.md` and warned about (`UserWarning`), and the
    rest is written. The guide: docs/diagnosis.md, section "tfgpu report LOG_DIR".

    Args:
        log_dir: str or os.PathLike, a directory written by `GPUMonitor`, `StepTimer`,
            `tfgpu.monitor.record(log_dir)` or `tfgpu.diagnose(..., log_dir=...)`.
        out_dir: str, os.PathLike or None, where to write `report.md` and the PNGs (created
            if missing). Defaults to `None`: `log_dir` itself.

    Returns:
        `tfgpu.report.ReportPath`, the path of `report.md`; its `show()` displays it.

    Raises:
        TypeError: if `log_dir` or `out_dir` is not a path.
        ValueError: if a path is (or is under) a file, or `log_dir` holds no tfgpu run.
        FileNotFoundError: if `log_dir` does not exist.
        ImportError: if matplotlib is not installed (with the pip line).
        OSError: if `out_dir` or `report.md` cannot be written.

    Example:

    >>> from tfgpu.report import write_report
    >>> report = write_report("runs/exp1")  # doctest: +SKIP
    >>> report.show()  # doctest: +SKIP
    """
    summary, problems = write_report_and_problems(log_dir, out_dir=out_dir)
    for error in problems.errors:
        warnings.warn(f"tfgpu report: {error} The rest is in {summary}.", stacklevel=2)
    return ReportPath(summary)
