"""The report's sections as Markdown lines (energy and GPU counters: `_energy`, `_findings`),
and what each field of the JSON records they read must hold (`damaged_fields`)."""

from __future__ import annotations

import bisect
import datetime
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import is_finite_number, is_int, is_number
from tfgpu._internal.helpers.files import EARLIER_SESSIONS
from tfgpu.report import _series as series
from tfgpu.report._read import Artifact, Problems, Table, diagnosis_files, read_record

IDLE_UTIL_PCT = 5.0  # a sample whose GPU utilization is below this counts as idle


def _when(timestamp) -> str:
    """A Unix time as local date and time with its UTC offset, e.g. 2025-05-01 14:03:07+02:00."""
    try:
        moment = datetime.datetime.fromtimestamp(float(timestamp)).astimezone()
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"
    return moment.isoformat(sep=" ", timespec="seconds")


class Field(NamedTuple):
    """What a field of a JSON record must hold: a test, the words for it, and for a list of
    objects (`objects`), the fields of each."""

    ok: Callable[[Any], bool]
    expected: str
    items: dict[str, Field] | None = None


STRING = Field(lambda v: isinstance(v, str), "a string")
NUMBER = Field(is_number, "a number")
INTEGER = Field(is_int, "an integer")
OBJECT = Field(lambda v: isinstance(v, dict), "an object")
BOOLEAN = Field(lambda v: isinstance(v, bool), "true or false")
GAIN = Field(
    lambda v: isinstance(v, dict) and all(is_number(v.get(k)) for k in ("value", "low", "high")),
    'a gain: {"value", "low", "high"}, each a number',
)


def _list_of(item: Field, words: str) -> Field:
    return Field(lambda v: isinstance(v, list) and all(item.ok(x) for x in v), words)


OBJECTS = _list_of(OBJECT, "a list of objects")
STRINGS = _list_of(STRING, "a list of strings")
INTEGERS = _list_of(INTEGER, "a list of integers")


def objects(fields: dict[str, Field]) -> Field:
    return OBJECTS._replace(items=fields)


# The JSON name of a value's kind, in the order tested (a bool is no number; never null here).
_JSON_KINDS = ((bool, "a boolean"), (str, "a string"), (list, "a list"), (dict, "an object"))


def damaged_fields(
    path: Path, record: dict, fields: dict[str, Field], problems: Problems, where: str = ""
) -> None:
    """Names in `problems.errors` each of `fields` that `record` holds (not null) with the wrong
    kind of value (`"gpus": "A100"`), then those inside each list of objects; `where` prefixes
    the field's name (`"earlier_sessions[0]."`). The report shows such a field as `?`, or not."""
    for name, (ok, expected, _) in fields.items():
        value = record.get(name)
        if value is None or ok(value):
            continue
        text = json.dumps(value, default=str)
        text = text if len(text) <= 40 else text[:37] + "..."
        kind = next((words for t, words in _JSON_KINDS if isinstance(value, t)), "a number")
        problems.errors.append(f"`{path}`: `{where}{name}` is {text} ({kind}), not {expected}.")
    for name, spec in fields.items():
        items = record.get(name)
        if spec.items and isinstance(items, list):
            for k, item in enumerate(items):
                if isinstance(item, dict):
                    damaged_fields(path, item, spec.items, problems, f"{where}{name}[{k}].")


# The fields of the JSON records that the report reads, and what each must hold.
_TIME = Field(lambda v: is_number(v) and _when(v) != "?", "a Unix time in seconds (a number)")
_GPU = {
    "index": INTEGER, "name": STRING, "memory_total_mib": NUMBER, "compute_capability": INTEGERS
}  # fmt: skip
_SESSION = {
    "tfgpu_version": STRING, "hostname": STRING, "start_time": _TIME, "interval": NUMBER,
    "worker": INTEGER, "task_type": STRING, "timeline": STRING, "gpus": objects(_GPU),
}  # fmt: skip
_FINDING = {"kind": STRING, "title": STRING, "recommendation": STRING}
_DIAGNOSIS = {"text": STRING, "bottleneck": STRING, "findings": objects(_FINDING)}
_TRIAL = {
    "name": STRING, "change": OBJECT, "gain": GAIN, "status": STRING, "reason": STRING,
    "line": STRING,
}  # fmt: skip
_TUNE = {
    "text": STRING, "trials": objects(_TRIAL), "speedup": GAIN, "baseline_examples_per_s": NUMBER,
    "tuned_examples_per_s": NUMBER, "settings": OBJECT, "lines": STRINGS, "notes": STRINGS,
    "time_s": NUMBER, "compared_with": STRING,
}  # fmt: skip
_POINT = {
    "replicas": NUMBER, "mode": STRING, "global_batch": NUMBER, "step_s": NUMBER,
    "examples_per_s": NUMBER, "efficiency": NUMBER, "reason": STRING, "fix": STRING,
}  # fmt: skip
_SCALING = {
    "text": STRING, "points": objects(_POINT), "predictions": OBJECTS, "prediction_errors": OBJECT,
    "gradient_bytes": NUMBER, "device_kind": STRING, "all_reduce": STRING, "notes": STRINGS,
    "time_s": NUMBER,
}  # fmt: skip
_BATCH_TRIAL = {"batch_size": INTEGER, "fits": BOOLEAN, "reason": STRING, "examples_per_s": NUMBER}
_BATCH_SIZE = {
    "text": STRING, "trials": objects(_BATCH_TRIAL), "largest": INTEGER, "fastest": INTEGER,
    "notes": STRINGS, "time_s": NUMBER,
}  # fmt: skip
# The result records beside the run (written by `tfgpu.tune`, `tfgpu.scaling` and
# `tfgpu.find_batch_size`): their section's title and their fields.
RESULTS = {
    "tune.json": ("Tuning", _TUNE),
    "scaling.json": ("Scaling", _SCALING),
    "batch_size.json": ("Batch size", _BATCH_SIZE),
}


def _record(path: Path, problems: Problems, fields: dict[str, Field]) -> dict[str, Any] | None:
    """The JSON record at `path` (None if it cannot be read), its damaged fields in `problems`."""
    d = read_record(path, problems)
    if d is not None:
        damaged_fields(path, d, fields, problems)
    return d


def _printed(d: dict[str, Any]) -> list[str]:
    """A record's printed `text` as a code block ([] when it has none)."""
    text = d.get("text")
    if not (isinstance(text, str) and text.strip()):
        return []
    return ["```", text.rstrip().replace("```", "'''"), "```", ""]


def fmt(value: Any, spec: str = ".1f") -> str:
    """`value` formatted with `spec`, or "n/a" when it is not a finite number."""
    return format(value, spec) if is_finite_number(value) else "n/a"


def _text(value: Any) -> str:
    """A record's value as Markdown text: `?` when missing."""
    return "?" if value is None else str(value)


def timeline_section(table: Table, name: str) -> list[str]:
    gpus = series.gpu_indices(table)
    starts = series.timeline_sessions(table)
    x = series.time_axis(table, starts)
    lines = [f"## Timeline `{name}`", ""]
    if not table.rows:
        return [*lines, "No samples: the file has a header only (a run stopped at once).", ""]
    text = f"{len(table.rows)} samples over {fmt(series.span(x), '.2f')} s"
    if len(starts) > 1:
        ends = [*starts[1:], len(x)]
        sampled = sum(series.span(x[a:b]) for a, b in zip(starts, ends) if stats.finite(x[a:b]))
        text += (
            f" in {len(starts)} sessions (one per `fit` or `record`, appended to this file), "
            f"{fmt(sampled, '.2f')} s of them sampled; the plots mark where each began"
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
            util = stats.finite(table.col(f"gpu{i}_util_pct"))
            idle = sum(v < IDLE_UTIL_PCT for v in util) / len(util) if util else math.nan
            mem, power = table.col(f"gpu{i}_mem_used_mib"), table.col(f"gpu{i}_power_w")
            lines.append(
                f"| {i} | {fmt(stats.mean(util))} | {fmt(series.finite_max(util))} | "
                f"{fmt(idle, '.0%')} | {fmt(stats.mean(mem), '.0f')} | "
                f"{fmt(series.finite_max(mem), '.0f')} | "
                f"{fmt(series.finite_max(table.col(f'gpu{i}_mem_total_mib')), '.0f')} | "
                f"{fmt(stats.mean(power))} | {fmt(series.finite_max(power))} |"
            )
        lines += [
            "",
            f"Idle share: the share of samples with utilization below {IDLE_UTIL_PCT:g}%.",
            "",
        ]
        lines += _activity_lines(table, gpus)
    lines += [
        f"Host: CPU mean {fmt(stats.mean(table.col('host_cpu_pct')))}%, process RSS max "
        f"{fmt(series.finite_max(table.col('host_rss_mib')), '.0f')} MiB, system memory max "
        f"{fmt(series.finite_max(table.col('host_mem_used_pct')))}%.",
        "",
    ]
    return lines


def steps_section(table: Table, name: str) -> list[str]:
    if not table.rows:
        return [f"## Steps `{name}`", "", "No steps: the file has a header only.", ""]
    st = [v * 1e3 for v in table.col("step_time_s")]
    starts = series.steps_sessions(table)
    fits = len(starts) > 1
    lines = [
        f"## Steps `{name}`",
        "",
        f"{len(table.rows)} rows (one per step, or per execution of `steps_per_execution` "
        + (f"steps) from {len(starts)} `fit` calls appended to this file" if fits else "steps)")
        + f"; step time median {fmt(stats.median(st), '.2f')} ms, p90 "
        f"{fmt(stats.percentile(st, 90), '.2f')} ms; examples/s median "
        f"{fmt(stats.median(table.col('examples_per_s')), ',.0f')}. Epochs count from 1, "
        "as Keras prints them; the first step of epoch 1 includes tracing and compilation. "
        "An epoch's median and p90 leave out its first row (as `StepTimer`'s "
        "`step_time_median_s` and `step_time_p90_s` do), unless it has only one.",
        "",
        ("| fit " if fits else "")
        + "| epoch | steps | median step ms | p90 step ms | first step ms | time in steps s |",
        ("| --- " if fits else "") + "| --- | --- | --- | --- | --- | --- |",
    ]
    by_epoch: dict[tuple[int, int], list[dict[str, float]]] = {}
    for k, r in enumerate(table.rows):
        session = bisect.bisect_right(starts, k) - 1  # starts[0] is row 0
        e = r.get("epoch", math.nan)
        by_epoch.setdefault((session, int(e) if math.isfinite(e) else -1), []).append(r)
    for (session, e), rows in sorted(by_epoch.items()):
        times = [r.get("step_time_s", math.nan) * 1e3 for r in rows]
        counts = series.steps_per_row([r.get("step", math.nan) for r in rows])
        spent = sum(stats.finite([t * n / 1e3 for t, n in zip(times, counts)]))
        steady = times[1:] or times  # StepTimer's rule: the first execution is not steady
        lines.append(
            (f"| {session + 1} " if fits else "")
            + f"| {e + 1 if e >= 0 else '?'} | {sum(counts)} | "
            f"{fmt(stats.median(steady), '.2f')} | {fmt(stats.percentile(steady, 90), '.2f')} | "
            f"{fmt(times[0], '.2f')} | {fmt(spent, '.2f')} |"
        )
    lines.append("")
    return lines


# (column, header) of the activity table: GPM counters and PCIe, where recorded.
_ACTIVITY_TABLE = (
    ("sm_active_pct", "SM active mean %"), ("sm_occupancy_pct", "SM occupancy mean %"),
    ("tensor_active_pct", "tensor active mean %"), ("dram_active_pct", "DRAM active mean %"),
    ("pcie_tx_mib_s", "PCIe tx mean MiB/s"), ("pcie_rx_mib_s", "PCIe rx mean MiB/s"),
)  # fmt: skip


def _activity_lines(table: Table, gpus: list[int]) -> list[str]:
    """The activity table (what utilization hides), when the timeline has such values."""
    shown = [
        (name, header)
        for name, header in _ACTIVITY_TABLE
        if any(stats.finite(table.col(f"gpu{i}_{name}")) for i in gpus)
    ]
    if not shown:
        return []  # an older timeline, or a GPU without GPM and PCIe counters
    lines = [
        "| GPU | util mean % | " + " | ".join(h for _, h in shown) + " |",
        "| --- | --- | " + " | ".join("---" for _ in shown) + " |",
    ]
    names = ["util_pct", *(name for name, _ in shown)]
    for i in gpus:
        cells = [fmt(stats.mean(table.col(f"gpu{i}_{name}"))) for name in names]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Utilization is the share of time a kernel was running, however few SMs it used; SM "
        "active is the share of SMs busy, tensor active the share of time the tensor cores "
        "worked (GPM, Hopper or newer). n/a: not measured on that GPU.",
        "",
    ]
    return lines


def diagnosis_section(path: Path, problems: Problems) -> list[str]:
    title = (
        "## Diagnosis" if path.name == "diagnosis.json" else f"## Earlier diagnosis `{path.name}`"
    )
    d = _record(path, problems, _DIAGNOSIS)
    if d is None:
        return [title, "", f"`{path.name}` could not be read (see Problems above).", ""]
    printed = _printed(d)
    if printed:
        return [title, "", *printed]
    lines = [title, "", f"Bottleneck: **{_text(d.get('bottleneck', 'unknown'))}**", ""]
    for f in _list(d.get("findings")):
        if isinstance(f, dict):
            name = f.get("title", f.get("kind"))
            lines.append(f"- **{_text(name)}**: {_text(f.get('recommendation', ''))}")
    return [*lines, ""]


def result_section(path: Path, out: Path, problems: Problems) -> list[str]:
    """A result's record (`RESULTS`: `tune.json`, `scaling.json`): its printed text (its table
    and reasons), and its plot (`NAME.png` beside it), linked relative to `out`."""
    title, fields = RESULTS[path.name]
    lines = [f"## {title}", ""]
    d = _record(path, problems, fields)
    if d is None:
        return [*lines, f"`{path.name}` could not be read (see Problems above).", ""]
    printed = _printed(d)
    if printed:
        lines += printed
    elif isinstance(d.get("speedup"), dict):
        lines += [f"Verified speedup: x{fmt(d['speedup'].get('value'), '.2f')}", ""]
    plot = path.with_suffix(".png")
    if plot.is_file():
        lines += [f"![{path.stem}]({Path(os.path.relpath(plot, out)).as_posix()})", ""]
    return lines


def _gpu_line(g: Any) -> str:
    if not isinstance(g, dict):
        return f"- GPU: {_text(g)}"
    cc = g.get("compute_capability")
    cc_text = ".".join(str(c) for c in cc) if isinstance(cc, list) else _text(cc)
    return (
        f"- GPU {_text(g.get('index'))}: {_text(g.get('name'))} "
        f"({fmt(g.get('memory_total_mib'), '.0f')} MiB, compute capability {cc_text})"
    )


def _list(value: Any) -> list[Any]:
    """A record's list, or [] for what is missing or not a list."""
    return value if isinstance(value, list) else []


def _session_line(meta: dict[str, Any]) -> str:
    worker = meta.get("worker")
    return (
        f"tfgpu {_text(meta.get('tfgpu_version'))}, host `{_text(meta.get('hostname'))}`"
        + (f", worker {worker}" if worker is not None else "")
        + f", started {_when(meta.get('start_time'))}, sampling every "
        f"{_text(meta.get('interval'))} s."
    )


def sessions_section(
    meta: dict[str, Any], run_json: Path, timelines: list[Artifact], problems: Problems
) -> list[str]:
    """The sessions recorded in `run.json` (the newest, and `earlier_sessions`); a field of the
    wrong kind is named in `problems` and shown as `?`."""
    newest = {k: v for k, v in meta.items() if k != EARLIER_SESSIONS}
    damaged_fields(run_json, meta, {EARLIER_SESSIONS: objects(_SESSION)}, problems)
    damaged_fields(run_json, newest, _SESSION, problems)
    earlier = [s for s in _list(meta.get(EARLIER_SESSIONS)) if isinstance(s, dict)]
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
            gpus = _list(s.get("gpus"))
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
    gpus = _list(newest.get("gpus"))
    lines += [_gpu_line(g) for g in gpus]  # none: the timeline section says host only
    if gpus:
        lines.append("")
    return lines


def listed(names: list[str]) -> str:
    """The file names as Markdown code, separated by commas."""
    return ", ".join(f"`{n}`" for n in names)


def files_section(timelines: list[Artifact], steps: list[Artifact], names: list[Path]) -> list[str]:
    """Says which files were moved aside by later sessions (and where their plots are)."""
    rotated = [a.path.name for a in [*timelines, *steps] if a.rotation is not None]
    diagnoses = [p.name for p in diagnosis_files(names) if p.name != "diagnosis.json"]
    damaged = [p.name for p in names if re.match(r"^run(-[A-Za-z_]+\d+)?\.\d+\.json$", p.name)]
    lines: list[str] = []
    if rotated:
        lines += [
            "Earlier files, moved aside when a later session sampled another set of GPUs (the "
            f"plain names hold the newest): {listed(rotated)}. Each has its own section below, "
            "oldest first, and its own plots (`utilization.1.png` for `timeline.1.csv`).",
            "",
        ]
    if diagnoses:
        lines += [
            f"Earlier diagnoses, kept when a later one was saved: {listed(diagnoses)} (below, "
            "before the newest).",
            "",
        ]
    if damaged:
        lines += [
            "Records moved aside because a later session could not read them (damaged): "
            f"{listed(damaged)}.",
            "",
        ]
    return lines
