"""`tfgpu run SCRIPT.py`: the script run unchanged, each `fit` watched, the longest one
diagnosed at the end, the report written and summed up (docs/diagnosis.md, "Zero changes:
`tfgpu run SCRIPT.py`"; why the diagnosis comes at the end: there)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfgpu._internal.adapters.script import (
    FitCall,
    Interception,
    exit_status,
    print_error,
    run_as_main,
)
from tfgpu._internal.helpers.processes import signals_exit
from tfgpu._internal.helpers.warn import one_line
from tfgpu.run._summary import Outcome, ending, summary_lines
from tfgpu.run._watch import FitRecord, watched_fit


@dataclasses.dataclass
class _Run:
    """The records of one run of the script."""

    log_dir: Path
    records: list[FitRecord] = dataclasses.field(default_factory=list)

    def on_fit(self, call: FitCall) -> Any:
        record = FitRecord(call.index, call.place, self.log_dir / f"fit-{call.index}", call)
        self.records.append(record)
        return watched_fit(call, record)


def run_script(
    script: str | os.PathLike[str],
    script_args: Sequence[str] = (),
    *,
    log_dir: str | os.PathLike[str] | None = None,
    diagnose: bool = True,
    diagnose_budget_s: float | None = None,
) -> int:
    """Runs `script` with `script_args` as `python SCRIPT ARGS` would, each `fit` watched into
    `log_dir` (one `fit-K` directory per `fit`), then diagnoses the `fit` that ran longest,
    writes each fit's report and prints a summary on stderr. Returns the script's exit
    status. The arguments are checked by the command line (`tfgpu run`); the guide:
    docs/diagnosis.md, "Zero changes: `tfgpu run SCRIPT.py`"."""
    from tfgpu._internal.helpers.files import new_run_dir, writable_dir
    from tfgpu._internal.measure.rules import OBSERVE_BUDGET_S

    path = Path(script)
    root = writable_dir(new_run_dir(path.stem) if log_dir is None else log_dir)
    run = _Run(root)
    error: BaseException | None = None
    start = time.monotonic()
    # SIGTERM, SIGHUP: a SystemExit in the script (its records end well), or in the diagnosis
    # (skipped); the reports and the summary are written whatever ended the script.
    with signals_exit():
        try:
            with Interception(run.on_fit):
                run_as_main(path, script_args)
        except BaseException as e:  # the script's own end: sys.exit, Ctrl-C, any exception
            error = e
        if error is not None:
            print_error(error, path)
        status = exit_status(error)
        took = time.monotonic() - start
        outcome = Outcome(path, status, took, root, ending(error, status), list(script_args))
        budget = OBSERVE_BUDGET_S if diagnose_budget_s is None else diagnose_budget_s
        chosen = _longest(run.records)
        if chosen is not None and diagnose:
            outcome.diagnosis = _diagnose(chosen, budget, outcome)
        for record in run.records:
            outcome.reports.append(_report(record))
        lines = summary_lines(outcome, run.records, chosen)
    _write_summary(root, lines, outcome)
    sys.stdout.flush()
    print("\n".join(lines), file=sys.stderr, flush=True)
    return outcome.status


def _longest(records: list[FitRecord]) -> FitRecord | None:
    """The `fit` that ran longest (the first of equals): where a change saves most."""
    if not records:
        return None
    return max(records, key=lambda r: (r.seconds, -r.index))


def _diagnose(record: FitRecord, budget_s: float, outcome: Outcome) -> Any:
    """`tfgpu.diagnose` on the record's model and data, its lines on stderr (the script's
    stdout stays the script's); what it cannot do becomes a note. Ctrl-C skips it."""
    import tfgpu

    call = record.call
    assert call is not None
    try:
        data, batch_size = call.training_arrays()
    except (TypeError, ValueError) as e:
        outcome.notes.append(f"no diagnosis of fit {record.index}: {e}")
        return None
    print(
        f"tfgpu run: diagnosing fit {record.index} (at most {budget_s:g} s; Ctrl-C skips it)",
        file=sys.stderr,
        flush=True,
    )
    try:  # its lines on stderr, as they come (TensorFlow's log: as the script's own)
        with contextlib.redirect_stdout(sys.stderr):
            return tfgpu.diagnose(
                call.model,
                data,
                batch_size=batch_size,
                time_budget_s=budget_s,
                log_dir=record.log_dir,
            )
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C again, or SIGTERM: stop it
        why = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else f"exit status {e.code}"
        outcome.notes.append(f"the diagnosis of fit {record.index} was skipped ({why})")
    except Exception as e:  # the run's boundary for its side feature: the script's records and
        # report matter more than a diagnosis that failed (any error of the model or the data)
        outcome.notes.append(f"the diagnosis of fit {record.index} failed: {one_line(e)}")
    return None


def _report(record: FitRecord) -> str:
    """Writes `tfgpu report` of the fit's directory; its path, or why there is none."""
    from tfgpu.report import write_report_and_problems

    try:
        summary, problems = write_report_and_problems(record.log_dir)
    except (OSError, ValueError, ImportError) as e:
        return f"no report ({one_line(e)})"
    notes = (
        f" ({len(problems.errors)} problem(s): see its Problems section)" if problems.errors else ""
    )
    return f"{summary}{notes}"


def _write_summary(root: Path, lines: list[str], outcome: Outcome) -> None:
    """`summary.md` in the run directory: the printed summary (a failure is a note)."""
    from tfgpu._internal.helpers.files import write_text_atomic

    text = "# tfgpu run\n\n```text\n" + "\n".join(lines) + "\n```\n"
    try:
        write_text_atomic(root / "summary.md", text)
    except OSError as e:
        lines.append(f"  (summary.md not written: {one_line(e)})")
