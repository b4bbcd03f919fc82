"""`tfgpu tune SCRIPT.py`: every setting tried on the unchanged script. A first child times the
script's first `fit` as it is; a second hands that `fit`'s model and data to `tfgpu.tune` in the
script's own process (the compile settings, the pipeline's, the all-reduce); fresh children try
what needs a new process (a precision policy, the settings TensorFlow reads when it starts);
children verify the kept ones together; each kept setting comes with its place in the script.
`tune_script` is the parent, `_child_main` the child (its `fit` replaced through the one
interception, `_internal/adapters/script.py`). The guide: docs/tuning.md, "Zero changes to your
script"; what is never left behind: docs/guarantees.md."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.processes import death, run_python, signals_exit
from tfgpu._internal.measure import rules
from tfgpu._internal.measure.rules import PROCESS_BUDGET_S

# A child that runs longer than this (and the budget allows) is stopped: its script is
# doing something other than reaching `fit`.
CHILD_TIMEOUT_S = 600.0
_CHILD_FLAG = "--child"
# The most timed (or warm-up) steps per child: more would train for days.
MAX_STEPS = 1_000_000
# The in-process search gets at least half of what the baseline leaves (it usually carries
# the gains), at most tune's own default, and none below this many seconds.
SEARCH_SHARE, MIN_SEARCH_S = 0.5, 10.0
# The search's run is cut at this multiple of what it should take (its start and the search).
SEARCH_SLACK = 1.2
# Each fresh-process setting needs this many runs of the script (its rounds and the
# baseline's), the verification as many again: the time held for them.
RUNS_PER_SETTING = 2 * rules.MIN_ROUNDS
# The settings a child applies itself at the script's first `fit` (the others: the
# environment before it starts, the precision policy before the script runs).
CHILD_APPLIES = (*rules.COMPILE_KEYS, "cache", "prefetch", "private_threadpool_size")
_POLICY = "precision"
_NOT_STARTED = "a run was not started"
# The row of the in-process search when it did not run.
SEARCH = "the settings of the script's process (tfgpu.tune)"


@dataclasses.dataclass
class ChildRun:
    """What one child reported (None: unknown), or `error` with its stderr's tail; `wall_s`:
    how long it took; `cut`: the time budget stopped it."""

    step_s: float | None = None
    batch: int | None = None
    gpus: int = 0
    error: str = ""
    wall_s: float | None = None
    cut: bool = False
    places: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: str = ""  # "dataset", "arrays" or the type of what `fit` got
    policy: str = ""  # the model's precision policy at its first fit
    loss: float | None = None  # the mean loss of the timed fit
    tune: dict[str, Any] | None = None  # the in-process search's `TuneResult.to_dict()`


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
        check_script,
        check_time_budget,
        invalid_type,
    )

    def name(argument: str) -> str:
        if not flags:
            return argument
        return "SCRIPT.py" if argument == "script" else "--" + argument.replace("_", "-")

    if not isinstance(script, (str, os.PathLike)):
        raise invalid_type("script", script, "the path of a Python script (str or os.PathLike)")
    path = check_script(name("script"), script)
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


def split_change(change: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any], str]:
    """(environment variables, settings the child applies at the first `fit`, the precision
    policy or "") of a change. Environment variables are the upper-case keys. Pure."""
    env = {k: str(v) for k, v in change.items() if k.isupper()}
    settings = {k: v for k, v in change.items() if not k.isupper() and k != _POLICY}
    return env, settings, str(change.get(_POLICY) or "")


def _run_child(
    script: Path,
    script_args: Sequence[str],
    change: Mapping[str, Any],
    steps: int,
    warmup: int,
    timeout_s: float | None,
    search_s: float | None = None,
) -> ChildRun:
    """Runs the script in a new process with `change` (its environment variables set, its
    policy set before the script runs, its other settings applied at the first `fit`) and
    times its first `fit`, or (`search_s` given) runs `tfgpu.tune` on it for that long (tests
    replace this function). The child's report comes on its stdout, its output (the script's
    stdout too) on its stderr; its process group is ended whole (`run_python`)."""
    import time

    from tfgpu.tuning._candidates import merged

    env_change, settings, policy = split_change(change)
    env = merged(os.environ, env_change)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = {"parent": os.getpid(), "steps": steps, "warmup": warmup, "settings": settings}
    spec.update(policy=policy, search_s=search_s, mode="search" if search_s else "time")
    cmd = ["-m", "tfgpu.tuning._script", _CHILD_FLAG, json.dumps(spec), str(script)]
    limit = min(timeout_s, CHILD_TIMEOUT_S) if timeout_s is not None else None
    start = time.monotonic()
    status, report, output = run_python([*cmd, *script_args], env, limit)
    wall = time.monotonic() - start
    if status is None:
        cut = timeout_s is not None and limit == timeout_s
        why = f"cut by the time budget after {wall:.0f} s" if cut else "timed out"
        return ChildRun(error=f"{rules.BUDGET_SPENT}: a run was {why}", wall_s=wall, cut=cut)
    run = child_outcome(status, report, output)
    run.wall_s = wall
    return run


def child_outcome(status: int, report: str, output: str) -> ChildRun:
    """What a child's exit status, report (its stdout) and output (its stderr) say. Pure."""
    try:
        data = json.loads(report) if report.strip() else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        gpus = int(data.get("gpus", 0))
        if data.get("error"):
            return ChildRun(error=str(data["error"]), gpus=gpus, places=data.get("places") or {})
        return ChildRun(
            data.get("step_s"),
            data.get("batch"),
            gpus,
            places=data.get("places") or {},
            data=str(data.get("data", "")),
            policy=str(data.get("policy", "")),
            loss=data.get("loss"),
            tune=data.get("tune"),
        )
    if status == 0:
        return ChildRun(error="the script ended (exit status 0) without calling `fit`")
    tail = output.strip().splitlines()[-6:]
    return ChildRun(error=f"the script {death(status)}" + (f": {'; '.join(tail)}" if tail else ""))


class ChildFailed(Exception):
    """A child run of a setting failed (its script, or its `fit`); the text says how."""


@dataclasses.dataclass
class ProcessVariants:
    """The core's variants of a script: each a fresh process, its settings in its environment
    (or applied by the child). A child starts only when what is left of the budget can hold a
    run of the script as long as the ones so far; one the budget refused or cut is noted."""

    script: Path
    script_args: list[str]
    steps: int
    warmup: int
    budget: Any  # timing.Budget
    progress: Any
    batch: int | None = None
    base_times: list[float] = dataclasses.field(default_factory=list)
    first_base: float | None = None  # the baseline's first run, measured already
    walls: list[float] = dataclasses.field(default_factory=list)  # each finished child's
    spent: dict[str, str] = dataclasses.field(default_factory=dict)  # by name: why not run

    def typical_s(self) -> float:
        """How long a run of the script takes here (the median of those so far; 0: none)."""
        from tfgpu._internal.helpers import stats

        return stats.median(self.walls) if self.walls else 0.0

    def child(
        self, change: Mapping[str, Any], phase: str, search_s: float | None = None
    ) -> ChildRun:
        """One child run of the script with `change` (`phase`: the progress line), if what is
        left of the budget can hold it (`search_s`: the in-process search's, its length known)."""
        left = self.budget.left()
        need = self.typical_s() + (search_s or 0.0)
        if left <= 0 or (not math.isinf(left) and left < need):
            return ChildRun(
                error=f"{rules.BUDGET_SPENT}: {_NOT_STARTED} ({max(left, 0):.0f} s left, a run "
                f"of the script takes about {need:.0f} s here)"
            )  # `need`: the search's run counts its search
        self.progress.phase(phase)
        timeout = None if math.isinf(left) else max(1.0, left)
        if search_s is not None and timeout is not None:  # tune's +10%, and the start's share
            timeout = min(timeout, SEARCH_SLACK * need)
        run = _run_child(
            self.script, self.script_args, change, self.steps, self.warmup, timeout, search_s
        )
        if run.wall_s is not None and not run.cut and search_s is None:
            self.walls.append(run.wall_s)
        if run.step_s is not None and run.batch:
            self.batch = run.batch
        return run

    def run_for(self, change: dict[str, Any], name: str | None = None) -> Any:
        """A `timing.Run` of the script with `change` (the baseline: `{}`); a child that
        failed raises `ChildFailed` (but for the budget: no time)."""
        calls = [1 if not change and self.first_base is not None else 0]

        def run(deadline: float | None, limit: float | None) -> float | None:
            calls[0] += 1
            child = self.child(change, f"round {calls[0]}: {name or 'the baseline'}")
            if child.error.startswith(rules.BUDGET_SPENT):
                if name:
                    self.spent[name] = child.error[len(rules.BUDGET_SPENT) + 2 :]
                return None
            if not change:
                if child.step_s is not None:
                    self.base_times.append(child.step_s)
            elif child.error:
                raise ChildFailed(child.error)
            elif _POLICY in change and child.loss is not None and not math.isfinite(child.loss):
                raise ChildFailed(f"{rules.UNSAFE}: the loss is not finite ({child.loss})")
            elif change.get(_POLICY) and child.policy and child.policy != change[_POLICY]:
                raise ChildFailed(
                    f"the script sets its own precision policy ({child.policy}), which "
                    "overrides one set before it starts"
                )
            return child.step_s

        return run

    def compare(self, variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
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


def search_budget(left: float, typical_s: float, fresh: int) -> float | None:
    """Seconds for the in-process search (`tfgpu.tune` in the script's process) when `left`
    seconds remain, a run of the script takes `typical_s` and `fresh` settings need fresh
    processes: what their runs and the verification leave, at least `SEARCH_SHARE` of it, at
    most tune's own default; None when that is under `MIN_SEARCH_S`. Pure."""
    if math.isinf(left):
        return rules.SEARCH_BUDGET_S
    held = typical_s * RUNS_PER_SETTING * (fresh + 1)
    seconds = min(rules.SEARCH_BUDGET_S, max(SEARCH_SHARE * left, left - held) - typical_s)
    return seconds if seconds >= MIN_SEARCH_S else None


def _trials_of(record: Mapping[str, Any]) -> list[Any]:
    """`TuneResult.to_dict()`'s trials as `Trial`s again."""
    from tfgpu.tuning._result import Trial

    out = []
    for t in record.get("trials", []):
        g = t.get("gain")
        gain = rules.Gain(g["value"], g["low"], g["high"]) if g else None
        out.append(
            Trial(t["name"], dict(t.get("change") or {}), gain, t["status"], t["reason"], t["line"])
        )
    return out


@dataclasses.dataclass
class _Search:
    """What the in-process search gave: its trials (the fresh-process ones left to the
    parent), the precision policies it could not try, its kept settings and their verified
    gain, its notes."""

    trials: list[Any] = dataclasses.field(default_factory=list)
    policies: list[Any] = dataclasses.field(default_factory=list)  # Trials: needs a factory
    speedup: rules.Gain | None = None
    verified: bool = True
    notes: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, record: Mapping[str, Any] | None) -> _Search:
        from tfgpu.tuning._candidates import FRESH_PROCESS, NEEDS_FACTORY

        out = cls()
        if record is None:
            return out
        for trial in _trials_of(record):
            if trial.reason == FRESH_PROCESS:
                continue  # the parent tries it, in a fresh process
            if trial.reason == NEEDS_FACTORY and _POLICY in trial.change:
                out.policies.append(trial)
                continue
            out.trials.append(trial)
        s = record.get("speedup")
        out.speedup = rules.Gain(s["value"], s["low"], s["high"]) if s else None
        out.verified = bool(record.get("verified", True))
        out.notes = [f"in the script's process: {n}" for n in record.get("notes", [])]
        return out


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
    """Tries every setting on `script` (a Python script that calls `fit`, with `script_args`),
    unchanged: `tfgpu.tune`'s in the script's own process at its first `fit`, and those that
    need a fresh process in child processes whose first `fit` trains `warmup` + `steps`
    steps; returns a `TuneResult` whose `lines` say where in the script each kept setting
    goes. A RuntimeError when the script fails (or never fits) as it is. The guide:
    docs/tuning.md, "Zero changes to your script"."""
    from tfgpu._internal.helpers import stats
    from tfgpu._internal.measure.session import Session
    from tfgpu.tuning import _candidates as cands
    from tfgpu.tuning._result import TuneResult

    path, args, budget_s, log_path = check_arguments(
        script, script_args, steps, warmup, time_budget_s, log_dir
    )
    session = Session.open("tune SCRIPT", verbose=verbose, time_budget_s=budget_s, log_dir=log_path)
    runs = ProcessVariants(path, args, int(steps), int(warmup), session.budget, session.progress)
    first = runs.child({}, "the baseline (your script as it is, its first fit timed)")
    if first.step_s is None:
        if rules.BUDGET_SPENT in first.error:
            raise RuntimeError(
                f"the baseline run of {path} did not finish within the time budget: give a "
                "larger one (time_budget_s; --time-budget-s on the command line)"
            )
        raise RuntimeError(f"{path} did not reach a timed fit: {first.error}")
    runs.first_base = first.step_s
    runs.base_times.append(first.step_s)
    process = [s for s in cands.process_settings(first.gpus > 0) if not s[3]]
    notes: list[str] = []
    search = _search(runs, len(process) + 1, notes)
    trials = list(search.trials)
    plan = [(t.name, t.change, t.line, "") for t in search.policies]
    plan += cands.process_settings(first.gpus > 0)
    measured = runs.compare({name: change for name, change, _, untried in plan if not untried})
    fresh = _fresh_trials(plan, measured, runs.spent)
    trials += fresh
    kept = [
        cands.Kept(t, [], against_baseline=False) for t in search.trials if t.status == rules.KEPT
    ]
    kept += [
        cands.Kept(t, measured[t.name].rounds, against_baseline=True)
        for t in fresh
        if t.status == rules.KEPT
    ]
    speedup, verified = _verified(runs, kept, search, first.data, notes)
    kept = [k for k in kept if k.trial.status == rules.KEPT]
    base = stats.median(runs.base_times)
    batch = runs.batch
    base_eps = batch / base if batch and base and math.isfinite(base) else math.nan
    from tfgpu.tuning._edits import Places, edits_for

    places = Places.from_dict(str(path), first.places)
    changes = [(k.trial.change, k.trial.line) for k in kept]
    lines, diff = edits_for(changes, places, _sources(places))
    notes.insert(
        0,
        "settings tried in the script's process by tfgpu.tune are each against the best "
        "so far; those in fresh processes (a precision policy, environment variables) "
        "against the baseline",
    )
    result = TuneResult(
        trials=trials,
        baseline_examples_per_s=base_eps,
        tuned_examples_per_s=base_eps * speedup.value,
        speedup=speedup,
        settings={k: v for kept_one in kept for k, v in kept_one.trial.change.items()},
        lines=lines,
        notes=notes + search.notes,
        compared_with="the best so far (in the script's process) or the baseline (fresh processes)",
        diff=diff,
        verified=verified,
    )
    if log_path is not None and diff:
        from tfgpu._internal.helpers.files import write_text_atomic

        write_text_atomic(log_path / "tune.diff", diff)
    how = "verified" if verified else "not verified together"
    return session.finish(result, f"{speedup.text()} {how}, {len(kept)} setting(s) kept")


def _search(runs: ProcessVariants, fresh: int, notes: list[str]) -> _Search:
    """The in-process search in a child, within what the fresh-process settings leave."""
    from tfgpu.tuning._result import Trial

    seconds = search_budget(runs.budget.left(), runs.typical_s(), fresh)
    if seconds is None:
        why = f"{rules.BUDGET_SPENT}: {seconds_left(runs)}"
    else:
        label = f"trying the settings of the script's process (tfgpu.tune, {seconds:.0f} s)"
        run = runs.child({}, label, search_s=seconds)
        if run.tune is not None:
            return _Search.of(run.tune)
        why = run.error
        if not why.startswith(rules.BUDGET_SPENT):
            return _Search([Trial(SEARCH, status=rules.FAILED, reason=why)])
    return _Search([Trial(SEARCH, reason=why)])


def seconds_left(runs: ProcessVariants) -> str:
    """The budget left and what a run takes, in words."""
    left = max(runs.budget.left(), 0.0)
    return f"{left:.0f} s left, a run of the script takes about {runs.typical_s():.0f} s here"


def _fresh_trials(
    plan: list[tuple[str, dict[str, Any], str, str]],
    measured: Mapping[str, Any],
    spent: Mapping[str, str],
) -> list[Any]:
    """The fresh-process settings' trials: a verdict of their rounds, or why none ran (the
    budget's reason says whether a run was refused or cut)."""
    from tfgpu.tuning._result import Trial

    out = []
    for name, change, line, untried in plan:
        if untried:
            out.append(Trial(name, change, reason=untried, line=line))
            continue
        c = measured[name]
        if c.error:
            status = rules.UNSAFE if c.error.startswith(rules.UNSAFE) else rules.FAILED
            out.append(Trial(name, change, status=status, reason=c.error, line=line))
            continue
        status, reason = rules.verdict(c.rounds, c.stopped)
        if status == rules.UNTRIED and name in spent:  # refused or cut: said as such
            reason = f"{reason}; then {spent[name]}" if c.rounds else f"{reason}: {spent[name]}"
        out.append(Trial(name, change, rules.Gain.of(c.rounds), status, reason, line))
    return out


def _verified(
    runs: ProcessVariants, kept: list[Any], search: _Search, data: str, notes: list[str]
) -> tuple[rules.Gain, bool]:
    """The gain of the kept settings together and whether it was verified: `tfgpu.tune`'s own
    when only settings of the script's process were kept, else fresh children of all
    together (those a child cannot apply to this data left out, and said)."""
    from tfgpu.tuning import _candidates as cands

    if not kept:
        return cands.NONE, True
    if all(not k.against_baseline for k in kept):
        notes.append("verified together in the script's process by tfgpu.tune")
        return search.speedup or cands.NONE, search.verified
    applied = []
    for k in kept:
        inside = set(k.trial.change) - {_POLICY} - {c for c in k.trial.change if c.isupper()}
        if inside and not (
            inside <= set(CHILD_APPLIES)
            and (data == "dataset" or inside <= set(rules.COMPILE_KEYS))
        ):
            notes.append(
                f"{k.trial.name}: kept in the script's process ({k.trial.gain_text}); not in the "
                "verification (a fresh process cannot apply it to this data without an edit)"
            )
            continue
        applied.append(k)

    def together(changes: dict[str, Any]) -> Any:
        runs.first_base = None
        return runs.compare({"verifying the kept settings together": changes})[
            "verifying the kept settings together"
        ]

    return cands.verify(applied, together, notes)


def _sources(places: Any) -> dict[str, str]:
    """The text of each file a place is in (those that cannot be read left out)."""
    out = {}
    for file in {places.script, *(p.file for p in (places.fit, places.compile, places.data) if p)}:
        try:
            out[file] = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def run_command(args: Any) -> int:
    """`tfgpu tune SCRIPT.py` from parsed arguments: prints the table, returns the exit status."""
    with signals_exit():
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
    print(result)  # the table, then where each kept setting goes in the script
    return 0


# The child.
class Reported(BaseException):
    """Stops the script after its first `fit`: `data` is the child's report (a BaseException,
    so that the script's own `except Exception` does not catch it)."""

    def __init__(self, data: dict[str, Any]):
        super().__init__("the child's report")
        self.data = data


def apply_settings(call: Any, settings: Mapping[str, Any]) -> None:
    """Applies the in-process settings a child verifies to the script's `fit`: the compile
    ones on the model (as `TuneResult.apply` does), a dataset's end settings on `x`."""
    import tensorflow as tf

    from tfgpu._internal.adapters.datasets import with_end_settings
    from tfgpu.tuning._result import TuneResult

    compiled = {k: v for k, v in settings.items() if k in rules.COMPILE_KEYS}
    if compiled:
        TuneResult(trials=[], settings=compiled).apply(call.model)
    rest = {k: v for k, v in settings.items() if k not in rules.COMPILE_KEYS}
    if not rest:
        return
    if not isinstance(call.arguments["x"], tf.data.Dataset) or not set(rest) <= set(CHILD_APPLIES):
        raise ValueError(f"{', '.join(rest)} cannot be applied to this data without an edit")
    call.arguments["x"] = with_end_settings(call.arguments["x"], rest)


def _data_kind(x: Any) -> str:
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return "dataset"
    if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
        return "arrays"
    return type(x).__name__


def _facts(call: Any) -> dict[str, Any]:
    """What every report of a child says about the script's first `fit`."""
    policy = getattr(getattr(call.model, "dtype_policy", None), "name", "")
    return {"places": call.places(), "data": _data_kind(call.arguments["x"]), "policy": policy}


def timed_first_fit(call: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The child's report of the script's first `fit` with `spec`'s settings applied, timed:
    `warmup` + `steps` steps of one `fit` without the script's callbacks or validation."""
    import keras
    import tensorflow as tf

    from tfgpu._internal.measure import timing

    facts = _facts(call)
    try:
        apply_settings(call, spec.get("settings") or {})
    except ValueError as e:
        return {**facts, "error": str(e)}
    model = call.model
    spe = max(1, int(model.steps_per_execution or 1))
    calls_warm, calls_timed = timing.call_counts(spe, spec["steps"], spec["warmup"])
    steps = (calls_warm + calls_timed) * spe
    x = call.arguments["x"]
    batch = _batch_of(x, call.arguments["batch_size"])
    timer = timing.Timer(calls_warm)
    changes: dict[str, Any] = {
        "epochs": 1, "initial_epoch": 0, "verbose": 0, "callbacks": [timer],
        "validation_split": 0.0, "validation_data": None, "validation_freq": 1,
        "steps_per_epoch": steps,
    }  # fmt: skip
    if isinstance(x, tf.data.Dataset):
        changes["x"] = x.repeat()
    elif facts["data"] == "arrays":  # whole epochs of the arrays, as many as the steps need
        leaves = keras.tree.flatten(x)
        per_epoch = max(1, math.ceil(int(leaves[0].shape[0]) / (batch or 32)))
        changes.update(epochs=math.ceil(steps / per_epoch), steps_per_epoch=None)
    try:
        history = call.run(**changes)
    except Exception as e:  # the child's one catch-all: the script's fit failed (any error of
        # theirs or TensorFlow's); the parent reports the setting as failed
        return {**facts, "error": f"fit failed: {type(e).__name__}: {e}"}
    step_s = timer.step_time(spe)
    if step_s is None:
        return {**facts, "error": "fit ran too few steps to time (a dataset shorter than warm-up)"}
    losses = [float(v) for v in (getattr(history, "history", {}) or {}).get("loss", [])]
    loss = sum(losses) / len(losses) if losses else None
    return {**facts, "step_s": step_s, "batch": batch, "loss": loss}


def searched_first_fit(call: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The child's report of `tfgpu.tune` on the script's first `fit`: its model and the
    data it trains on (arrays without their `validation_split` part, at its batch size)."""
    import tfgpu

    facts = _facts(call)
    try:
        data, batch_size = call.training_arrays()
    except (TypeError, ValueError) as e:
        return {**facts, "error": f"tfgpu.tune cannot take this fit's data: {e}"}
    try:
        result = tfgpu.tune(
            call.model, data, batch_size=batch_size, time_budget_s=spec["search_s"], verbose=0
        )
    except (TypeError, ValueError) as e:
        return {**facts, "error": f"tfgpu.tune refused this fit: {e}"}
    batch = _batch_of(call.arguments["x"], call.arguments["batch_size"])
    return {**facts, "tune": result.to_dict(), "batch": batch}


def first_fit_handler(
    spec: Mapping[str, Any], finish: Callable[[dict[str, Any]], Any]
) -> Callable[[Any], Any]:
    """The child's `on_fit`: the report of the script's first `fit` (timed, or searched),
    handed to `finish`, which ends the script (`os._exit` in the child, `Reported` in tests)."""
    report = searched_first_fit if spec.get("mode") == "search" else timed_first_fit

    def on_fit(call: Any) -> Any:
        return finish(report(call, spec))

    return on_fit


def run_to_first_fit(
    script: Path,
    script_args: Sequence[str],
    spec: Mapping[str, Any],
    finish: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Runs the script (its policy set first, as `spec` says) to its first `fit` and returns
    the report of it, or hands it to `finish` (the child's, which exits at once); an error
    report when the script ends without one. In this process."""
    import keras

    from tfgpu._internal.adapters.script import Interception, run_as_main

    if spec.get("policy"):
        keras.mixed_precision.set_global_policy(spec["policy"])

    def stop(data: dict[str, Any]) -> Any:
        raise Reported(data)

    finish = finish or stop
    try:
        with Interception(first_fit_handler(spec, finish)):
            run_as_main(script, script_args)
    except Reported as r:
        return r.data
    except SystemExit as e:
        if e.code not in (None, 0):
            raise  # a failure: the parent shows the exit status and the end of the output
        called = "sys.exit()" if e.code is None else f"sys.exit({e.code!r})"
        return {"error": f"the script called {called} without calling `fit`"}
    finally:
        if spec.get("policy"):
            keras.mixed_precision.set_global_policy("float32")
    return {"error": "the script ended without calling `fit`"}


def _child_main(argv: Sequence[str]) -> int:
    """The child: `--child SPEC_JSON SCRIPT [ARGS...]`. Runs the script to its first `fit`,
    writes the report (`{"step_s", "batch", ...}`, `{"tune": ...}` or `{"error"}`, with
    `"gpus"`) on its stdout and exits at once: nothing after the first `fit` runs. What the
    script prints goes to stderr."""
    from tfgpu._internal.helpers.processes import die_with_parent, startup_log_held_back

    spec = json.loads(argv[1])
    die_with_parent(int(spec["parent"]))
    script, script_args = Path(argv[2]), list(argv[3:])
    sys.stdout.flush()
    channel = os.dup(1)  # the report's own channel (not inherited by the script's processes)
    os.dup2(2, 1)  # the script's prints join its errors

    with startup_log_held_back():  # the end of the output, shown on failure, is the script's
        import tensorflow as tf

        gpus = len(tf.config.list_physical_devices("GPU"))

    def finish(data: dict[str, Any]) -> Any:
        with open(channel, "w", encoding="utf-8") as out:
            out.write(json.dumps({**data, "gpus": gpus}))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # nothing after the first fit runs (the script may train for hours)

    from tfgpu._internal.adapters.script import exit_status, print_error

    try:
        data = run_to_first_fit(script, script_args, spec, finish)
    except BaseException as e:  # the script failed: its traceback as Python prints it (the
        print_error(e, script)  # parent shows its end), and its exit status
        sys.stderr.flush()
        os._exit(exit_status(e))
    finish(data)
    return 0  # pragma: no cover (finish exits)


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
