"""Reading a run directory: its timeline and steps files, its JSON records, and `Problems`
(what could not be read or was worked around: a damaged file is never raised)."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.checks import check_dir, invalid_value
from tfgpu._internal.helpers.files import read_json_object


@dataclass
class Table:
    path: Path
    columns: list[str]
    rows: list[dict[str, float]] = field(default_factory=list)

    def col(self, name: str) -> list[float]:
        return [r.get(name, math.nan) for r in self.rows]


@dataclass
class Problems:
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


def reason(error: OSError) -> str:
    return error.strerror or str(error)


_MISSING = {"", "none", "null"}  # cells that mean "no value", not damage (as `nan` does)


def read_table(path: Path, required: Sequence[str], what: str, problems: Problems):
    """A tfgpu CSV file (with one of the `required` columns; `what` names it) as a `Table`, or
    None; damage goes to `problems.errors` (rows before it kept), what is worked around to notes."""
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a BOM (saved by a spreadsheet): no data
    except OSError as e:
        problems.errors.append(f"`{path}` cannot be read ({reason(e)}).")
        return None
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
                try:
                    row[name] = float(cell)
                except (TypeError, ValueError):
                    row[name] = math.nan
                    if cell.strip().lower() not in _MISSING:
                        not_numbers += 1
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
    return Table(path, columns, rows)


def read_record(path: Path, problems: Problems) -> dict[str, Any] | None:
    """A JSON object file (`run.json`, `diagnosis.json`), or None (told to `problems`)."""
    try:
        return read_json_object(path)
    except OSError as e:
        problems.errors.append(f"`{path}` cannot be read ({reason(e)}).")
    except ValueError as e:
        problems.errors.append(f"{e}.".replace(str(path), f"`{path}`", 1))
    return None


_ARTIFACT = re.compile(
    r"^(?P<stem>timeline|steps)(?P<worker>-[A-Za-z_]+\d+)?(?:\.(?P<n>\d+))?\.csv$"
)
_RECORD = re.compile(r"^(run|diagnosis|tune|scaling|batch_size)(-[A-Za-z_]+\d+)?(\.\d+)?\.json$")


@dataclass(frozen=True)
class Artifact:
    """A timeline or steps file: `timeline.csv`, `timeline.2.csv`, `steps-worker1.csv`, ..."""

    path: Path
    worker: str  # "" or "-worker1"
    rotation: int | None  # N of `NAME.N.csv` (moved aside by a later session), None: newest
    suffix: str  # what the file's plots add to their names: "", ".1", "-worker1", "-worker1.2"


def artifacts(names: list[Path], stem: str) -> list[Artifact]:
    """The `stem` CSV files among `names`, per worker oldest first (`.1`, `.2`, ..., plain)."""
    found = []
    for path in names:
        if (m := _ARTIFACT.match(path.name)) and m["stem"] == stem:
            rotation = int(m["n"]) if m["n"] else None
            found.append(Artifact(path, m["worker"] or "", rotation, path.stem[len(stem) :]))
    return sorted(found, key=lambda f: (f.worker, math.inf if f.rotation is None else f.rotation))


_WORKER_RECORD = re.compile(r"^run-(?P<task>[A-Za-z_]+)(?P<index>\d+)\.json$")


def worker_records(names: list[Path]) -> list[Path]:
    """The records of a multi-worker run's tasks (`run-worker0.json`, `run-worker1.json`,
    `run-chief0.json`, ...), by task type then number (`run-worker2` before `run-worker10`)."""
    found = [(m["task"], int(m["index"]), p) for p in names if (m := _WORKER_RECORD.match(p.name))]
    return [path for _, _, path in sorted(found)]


def diagnosis_files(names: list[Path]) -> list[Path]:
    """`diagnosis.N.json` (moved aside by later diagnoses), oldest first, then `diagnosis.json`."""
    found = []
    for path in names:
        if m := re.match(r"^diagnosis(?:\.(\d+))?\.json$", path.name):
            found.append((int(m[1]) if m[1] else math.inf, path))
    return [path for _, path in sorted(found)]


def check_log_dir(log_dir) -> tuple[Path, list[Path]]:
    """The run directory and its entries; raises when it is not one."""
    path = check_dir("log_dir", log_dir)
    if not path.exists():
        raise FileNotFoundError(
            f"Run directory not found: {str(path)!r}. Expected a directory written by "
            "tfgpu.callbacks.GPUMonitor / StepTimer (log_dir=...)."
        )
    names = sorted(path.iterdir())
    if not any(_ARTIFACT.match(p.name) or _RECORD.match(p.name) for p in names):
        raise invalid_value(
            "log_dir",
            log_dir,
            "a directory written by GPUMonitor / StepTimer / tfgpu.monitor.record, or the "
            "log_dir of diagnose, tune, scaling or find_batch_size",
            received=f"log_dir={str(path)!r}, which holds no tfgpu run (no run.json, "
            "timeline.csv, steps.csv, diagnosis.json, tune.json, scaling.json or "
            "batch_size.json)",
        )
    return path, names
