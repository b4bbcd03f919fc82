"""One call of a measuring front end, opened and closed the same way: its arguments checked,
the run directory proved writable, the budget and the progress line (docs/architecture.md,
"The measuring core"; the default budgets by what a call runs, there too)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.checks import check_int, check_time_budget
from tfgpu._internal.helpers.files import writable_dir
from tfgpu._internal.helpers.progress import Progress, check_verbose
from tfgpu._internal.measure import timing

# Timed steps: fewer cannot take a median over calls.
MIN_STEPS = 3


def check_steps(steps: Any, *, allow_none: bool = False, maximum: int | None = None) -> int | None:
    """Checks `steps`: timed steps per timed fit, >= `MIN_STEPS` (None: from the step)."""
    return check_int("steps", steps, minimum=MIN_STEPS, maximum=maximum, allow_none=allow_none)


@dataclasses.dataclass
class Session:
    """A measuring call, opened by `Session.open`: budget, progress line, run directory, notes."""

    title: str
    budget: timing.Budget
    progress: Progress
    log_path: Path | None
    notes: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def open(
        cls,
        title: str,
        *,
        verbose: Any,
        time_budget_s: Any,
        log_dir: Any = None,
        measure_share: float = 1.0,
    ) -> Session:
        """Checks `verbose`, `time_budget_s` and `log_dir` (created and proved writable),
        then starts the budget and the progress line; raises before any work."""
        check_verbose(verbose)
        budget_s = check_time_budget(time_budget_s)
        log_path = None if log_dir is None else writable_dir(log_dir)
        # The clock read at call time: the tests script `timing.now`.
        progress = Progress(verbose, title=title, budget_s=budget_s, clock=lambda: timing.now())
        return cls(title, timing.Budget(budget_s, measure_share), progress, log_path)

    def budget_note(self, what: str) -> str:
        """A note that the budget left `what` out, with the way to give a larger one."""
        return (
            f"{what}: the time budget of {self.budget.seconds:g} s was spent (pass a larger "
            "`time_budget_s`, or None for no limit)"
        )

    def finish(self, result: Any, summary: str) -> Any:
        """Closes the call (`time_s`, the result's files, the last progress line); returns it."""
        if hasattr(result, "time_s"):
            result.time_s = self.budget.elapsed()
        if self.log_path is not None:
            names = [n for n in (result.json_name, result.png_name) if n]
            self.progress.phase(f"writing {' and '.join(names)}")
            result.write(self.log_path)
        self.progress.done(summary)
        return result
