"""`tfgpu tune SCRIPT.py`: the settings read once when TensorFlow starts, tried in child
processes (`tune_script` the parent, `_child_main` the child, whose replaced `fit` times the
first `fit` and exits). The guide: docs/tuning.md; what is never left behind: docs/guarantees.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.processes import death, run_python
from tfgpu._internal.measure.rules import PROCESS_BUDGET_S

# A child that runs longer than this (and the budget allows) is stopped: its script is
# doing something other than reaching `fit`.
CHILD_TIMEOUT_S = 600.0
_CHILD_FLAG = "--child"
# The most timed (or warm-up) steps per child: more would train for days.
MAX_STEPS = 1_000_000


@dataclasses.dataclass
class ChildRun:
    """What one child reported (None: unknown), or `error` with its stderr's tail."""

    step_s: float | None = None
    batch: int | None = None
    gpus: int = 0
    error: str = ""


def check_arguments(
    script: Any,
    script_args: Any,
    steps: Any,
    warmup: Any,
    time_budget_s: Any,
    log_dir: Any,
    *,
    flags: bool = False,
) -> tuple[Path, list[str], float | None, Path | None]:
    """Checks `tune_script`'s arguments without TensorFlow; returns (script, its arguments, the
    budget, the log directory). `flags`: the messages name the command line's flags and
    values (`--time-budget-s`, no None), as `tfgpu tune` takes them."""
    from tfgpu._internal.helpers.checks import (
        check_dir,
        check_int,
        check_number,
        check_time_budget,
        invalid_type,
        invalid_value,
    )

    def name(argument: str) -> str:
        if not flags:
            return argument
        return "SCRIPT.py" if argument == "script" else "--" + argument.replace("_", "-")

    if not isinstance(script, (str, os.PathLike)):
        raise invalid_type("script", script, "the path of a Python script (str or os.PathLike)")
    path = Path(script)
    if not path.is_file():
        raise invalid_value(name("script"), script, "an existing Python script that calls `fit`")
    if isinstance(script_args, (str, bytes)) or not all(isinstance(a, str) for a in script_args):
        raise invalid_type("script_args", script_args, "a sequence of str (the script's argv)")
    check_int(name("steps"), steps, minimum=3, maximum=MAX_STEPS)
    check_int(name("warmup"), warmup, minimum=1, maximum=MAX_STEPS)
    if not flags:
        budget = check_time_budget(time_budget_s)
    else:  # the command line's value: no None
        budget = check_number(
            name("time_budget_s"),
            time_budget_s,
            minimum=0,
            exclusive_minimum=True,
            expected="a finite number of seconds > 0",
        )
    expected = "a directory path" if flags else None
    log_path = check_dir(name("log_dir"), log_dir, allow_none=True, expected=expected)
    return path, list(script_args), budget, log_path


def _run_child(
    script: Path,
    script_args: Sequence[str],
    change: Mapping[str, str],
    steps: int,
    warmup: int,
    timeout_s: float | None,
) -> ChildRun:
    """Runs the script in a new process with `change` in its environment and times its first
    `fit` (tests replace this function). The child's report comes on its stdout, its output
    (the script's stdout too) on its stderr; its process group is ended whole (`run_python`)."""
    from tfgpu.tuning._candidates import merged

    env = merged(os.environ, change)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = json.dumps({"parent": os.getpid(), "steps": steps, "warmup": warmup})
    cmd = ["-m", "tfgpu.tuning._script", _CHILD_FLAG, spec, str(script), *script_args]
    limit = min(timeout_s, CHILD_TIMEOUT_S) if timeout_s is not None else None
    status, report, output = run_python(cmd, env, limit)
    if status is None:
        return ChildRun(error="timed out (time budget spent)")
    return child_outcome(status, report, output)


def child_outcome(status: int, report: str, output: str) -> ChildRun:
    """What a child's exit status, report (its stdout) and output (its stderr) say. Pure."""
    try:
        data = json.loads(report) if report.strip() else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        gpus = int(data.get("gpus", 0))
        if data.get("error"):
            return ChildRun(error=str(data["error"]), gpus=gpus)
        return ChildRun(data.get("step_s"), data.get("batch"), gpus)
    if status == 0:
        return ChildRun(error="the script ended (exit status 0) without calling `fit`")
    tail = output.strip().splitlines()[-6:]
    return ChildRun(error=f"the script {death(status)}" + (f": {'; '.join(tail)}" if tail else ""))


@dataclasses.dataclass
class ProcessVariants:
    """The core's variants of a script: each a fresh process, its settings in its environment."""

    script: Path
    script_args: list[str]
    steps: int
    warmup: int
    budget: Any  # timing.Budget
    progress: Any
    batch: int | None = None
    base_times: list[float] = dataclasses.field(default_factory=list)
    first_base: float | None = None  # the baseline's first run, measured already

    def child(self, change: Mapping[str, str]) -> ChildRun:
        """One child run of the script with `change`, within what is left of the budget."""
        left = self.budget.left()
        if left <= 0:
            return ChildRun(error="time budget spent")
        timeout = None if math.isinf(left) else max(1.0, left)
        run = _run_child(self.script, self.script_args, change, self.steps, self.warmup, timeout)
        if run.step_s is not None and run.batch:
            self.batch = run.batch
        return run

    def run_for(self, change: dict[str, str], name: str | None = None) -> Any:
        """A `timing.Run` of the script with `change` in its environment (the baseline: `{}`);
        a child that failed raises `ChildFailed` (but for the budget: no time)."""
        calls = [1 if not change and self.first_base is not None else 0]

        def run(deadline: float | None, limit: float | None) -> float | None:
            calls[0] += 1
            self.progress.phase(f"round {calls[0]}: {name or 'the baseline'}")
            child = self.child(change)
            if not change:
                if child.step_s is not None:
                    self.base_times.append(child.step_s)
            elif child.error and "budget" not in child.error:
                raise ChildFailed(child.error)
            return child.step_s

        return run

    def compare(self, variants: dict[str, dict[str, str]]) -> dict[str, Any]:
        """A `timing.Comparison` of each variant against the baseline (a failed child: `error`)."""
        from tfgpu._internal.measure import timing

        return timing.compare(
            self.run_for({}),
            {name: self.run_for(env, name) for name, env in variants.items()},
            budget=self.budget,
            first_base=self.first_base,
            failures=(ChildFailed,),
            describe=str,
        )


class ChildFailed(Exception):
    """A child run of a setting failed (its script, or its `fit`); the text says how."""


def tune_script(
    script: str | os.PathLike[str],
    script_args: Sequence[str] = (),
    *,
    steps: int = 30,
    warmup: int = 5,
    time_budget_s: float | None = PROCESS_BUDGET_S,
    log_dir: str | os.PathLike[str] | None = None,
    verbose: int | str = "auto",
) -> Any:
    """Tries the settings that need a fresh process on `script` (a Python script that calls
    `fit`, with `script_args`), each in a child process whose first `fit` trains `warmup` +
    `steps` steps; returns a `TuneResult` whose `lines` are the `export ...` lines. A
    RuntimeError when the script fails (or never fits) as it is. The guide: docs/tuning.md,
    "Settings that need a fresh process"."""
    from tfgpu._internal.helpers import stats
    from tfgpu._internal.measure.rules import FAILED, KEPT, Gain, verdict
    from tfgpu._internal.measure.session import Session
    from tfgpu.tuning import _candidates as cands
    from tfgpu.tuning._result import Trial, TuneResult

    path, args, budget_s, log_path = check_arguments(
        script, script_args, steps, warmup, time_budget_s, log_dir
    )
    session = Session.open("tune SCRIPT", verbose=verbose, time_budget_s=budget_s, log_dir=log_path)
    runs = ProcessVariants(path, args, int(steps), int(warmup), session.budget, session.progress)
    session.progress.phase("the baseline (your environment as it is)")
    first = runs.child({})
    if first.step_s is None:
        if "budget" in first.error:
            raise RuntimeError(
                f"the baseline run of {path} did not finish within the time budget: give a "
                "larger one (time_budget_s; --time-budget-s on the command line)"
            )
        raise RuntimeError(f"{path} did not reach a timed fit: {first.error}")
    runs.first_base = first.step_s
    runs.base_times.append(first.step_s)
    plan = cands.process_settings(first.gpus > 0)
    trials: list[Trial] = []
    measured = runs.compare({name: env for name, env, _, untried in plan if not untried})
    kept: list[cands.Kept] = []
    for name, env, line, untried in plan:
        if untried:
            trial = Trial(name, env, reason=untried, line=line)
        elif measured[name].error:
            trial = Trial(name, env, status=FAILED, reason=measured[name].error, line=line)
        else:
            c = measured[name]
            status, reason = verdict(c.rounds, c.stopped)
            trial = Trial(name, env, Gain.of(c.rounds), status, reason, line)
            if status == KEPT:
                kept.append(cands.Kept(trial, c.rounds, against_baseline=True))
        trials.append(trial)
    notes = [
        "each setting against the baseline (your environment), in fresh processes; set the "
        "kept ones in the shell before Python starts"
    ]

    def together(changes: dict[str, Any]) -> Any:
        session.progress.phase("verifying the kept settings together")
        runs.first_base = None
        return runs.compare({"together": changes})["together"]

    speedup, verified = cands.verify(kept, together, notes)
    base, batch = stats.median(runs.base_times), runs.batch
    base_eps = batch / base if batch and base and math.isfinite(base) else math.nan
    result = TuneResult(
        trials=trials,
        baseline_examples_per_s=base_eps,
        tuned_examples_per_s=base_eps * speedup.value,
        speedup=speedup,
        settings={k: v for kept_one in kept for k, v in kept_one.trial.change.items()},
        lines=[kept_one.trial.line for kept_one in kept],
        notes=notes,
        compared_with="the baseline",
        verified=verified,
    )
    return session.finish(result, f"{speedup.text()} verified, {len(kept)} setting(s) kept")


def run_command(args: Any) -> int:
    """`tfgpu tune SCRIPT.py` from parsed arguments: prints the table, returns the exit status."""
    with _signals_exit():
        try:
            result = tune_script(
                args.script,
                args.script_args,
                steps=args.steps,
                warmup=args.warmup,
                time_budget_s=args.time_budget_s,
                log_dir=args.log_dir,
            )
        except (TypeError, ValueError, RuntimeError, OSError) as e:
            print(f"tfgpu tune: error: {e}", file=sys.stderr)
            return 2
    print(result)  # its lines are the `export ...` lines; its note says where to set them
    return 0


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `SystemExit(128 + signal)` inside the block, so that cleanup
    runs (their default ends the process at once); the handlers are restored after it."""

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {}
    try:
        for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)):
            if sig is not None:
                previous[sig] = signal.signal(sig, stop)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _child_main(argv: Sequence[str]) -> int:
    """The child: `--child SPEC_JSON SCRIPT [ARGS...]`. Times the script's first `fit`,
    writes `{"step_s", "batch", "gpus"}` (or `{"error"}`) on its stdout and exits; what the
    script prints goes to stderr."""
    import runpy

    from tfgpu._internal.helpers.processes import die_with_parent, startup_log_held_back

    spec = json.loads(argv[1])
    die_with_parent(int(spec["parent"]))
    script, script_args = argv[2], list(argv[3:])
    sys.stdout.flush()
    channel = os.dup(1)  # the report's own channel (not inherited by the script's processes)
    os.dup2(2, 1)  # the script's prints join its errors

    with startup_log_held_back():  # the end of the output, shown on failure, is the script's
        import keras
        import tensorflow as tf

        from tfgpu._internal.measure import timing

        gpus = len(tf.config.list_physical_devices("GPU"))
    original_fit = keras.Model.fit

    def report(data: dict[str, Any]) -> None:
        with open(channel, "w", encoding="utf-8") as out:
            out.write(json.dumps({**data, "gpus": gpus}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # nothing after the first fit runs (the script may train for hours)

    def timed_fit(self: Any, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
        spe = max(1, int(self.steps_per_execution or 1))
        calls_warm, calls_timed = timing.call_counts(spe, spec["steps"], spec["warmup"])
        batch = _batch_of(x, kwargs.get("batch_size"))
        if isinstance(x, tf.data.Dataset):
            x = x.repeat()
        timer = timing.Timer(calls_warm)
        for name in ("validation_data", "validation_split", "validation_freq", "callbacks"):
            kwargs.pop(name, None)
        kwargs.update(epochs=1, initial_epoch=0, verbose=0, callbacks=[timer])
        kwargs["steps_per_epoch"] = (calls_warm + calls_timed) * spe
        try:
            original_fit(self, x, y, **kwargs)
        except Exception as e:  # the child's one catch-all: the script's fit failed (any
            # error of theirs or TensorFlow's); the parent reports the setting as failed
            report({"error": f"fit failed: {type(e).__name__}: {e}"})
        step_s = timer.step_time(spe)
        if step_s is None:
            report({"error": "fit ran too few steps to time (a dataset shorter than warm-up)"})
        report({"step_s": step_s, "batch": batch})

    keras.Model.fit = timed_fit  # type: ignore[method-assign]
    sys.argv = [script, *script_args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise  # a failure: the parent shows the exit status and the end of the output
        called = "sys.exit()" if e.code is None else f"sys.exit({e.code!r})"
        report({"error": f"the script called {called} without calling `fit`"})
    report({"error": "the script ended without calling `fit`"})
    return 0  # pragma: no cover (report exits)


def _batch_of(x: Any, batch_size: Any) -> int | None:
    """Examples per step of `fit`'s data: a dataset's batch, or `batch_size` (32) for arrays."""
    import tensorflow as tf

    from tfgpu._internal.adapters.datasets import source_batches

    if isinstance(x, tf.data.Dataset):
        try:
            batches, _ = source_batches(x)
        except tf.errors.OpError:
            return None
        return int(batches.batch_size) if batches is not None and batches.batch_size else None
    if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
        return int(batch_size) if batch_size else 32
    return None  # a generator or PyDataset: its batch is its own


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == _CHILD_FLAG:
    sys.exit(_child_main(sys.argv[1:]))
