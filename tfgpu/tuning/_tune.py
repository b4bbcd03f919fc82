"""`tune()`: open the session, read the facts, take a first look at each setting that may be
worth x2 or more, try each candidate, verify, report."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import keras

from tfgpu._internal.adapters.datasets import read_first
from tfgpu._internal.adapters.model_state import preserved
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import check_bool
from tfgpu._internal.measure import rules, timing
from tfgpu._internal.measure.facts import gather
from tfgpu._internal.measure.session import Session, check_steps
from tfgpu._internal.measure.variants import Epochs, Probe, Variants, key
from tfgpu._internal.measure.workload import SAME_MODEL, SameModel, open_workload
from tfgpu.tuning import _candidates as cands
from tfgpu.tuning._candidates import Candidate, TuneFacts
from tfgpu.tuning._result import Trial, TuneResult
from tfgpu.tuning._trial import augment_on_batches, cache_untried, mean_loss, recorded

# Measuring stops at this share of the time budget (the rest: the result, its files, and the
# last call of a fit cut at the deadline). The verification's time is held back as it is
# needed: nothing while one setting measured against the baseline is kept.
MEASURE_SHARE = 0.95
# A first look times at most two calls after the one that traces, none past this share of
# the budget after the first.
LOOK_SHARE = 0.03
# The kept settings are verified by a first look (not rounds of timed fits) where three rounds
# against a baseline x2 slower than the best would take over this share of the budget.
VERIFY_ROUNDS_SHARE = 0.25
# Estimates of what the candidates after one will take, times this, are left to them.
SLACK = 1.5
# A timed fit lasts about the measuring budget over the fits planned, within these bounds;
# without a budget, the first.
FIT_S = (5.0, 0.5, 15.0)
# Batches the numerics guard trains on (with `steps_per_execution=1`), from the same weights.
GUARD_STEPS = 5
# find_batch_size tries batches up to this multiple of the current one.
BATCH_GROWTH = 8
# A ladder stops at a rung with one of these verdicts (a borderline one does not stop it: the
# next rung usually carries the gain).
_STOPS_LADDER = (rules.SLOWER, rules.NO_GAIN, rules.FAILED, rules.UNSAFE)
# Why a precision candidate is untried when the factory returns its first model again.
NOTHING_BUILT = "nothing was built under the policy"


def tune(
    model: keras.Model | Callable[[], keras.Model],
    data: Any,
    *,
    batch_size: int | None = None,
    validation_split: float | None = None,
    steps: int | None = None,
    time_budget_s: float | None = rules.SEARCH_BUDGET_S,
    change_batch_size: bool = False,
    log_dir: str | os.PathLike[str] | None = None,
    verbose: int | str = "auto",
) -> TuneResult:
    """Tries each speed setting on your model and data, keeps what measurably helps.

    A first look at each setting that may be worth x2 or more decides the order (and a x2
    difference at once); then each candidate is timed against the best configuration so far
    in interleaved rounds of `fit`s, kept when the whole confidence interval of its gain
    clears x1.05 and the baseline's own drift; the kept ones are verified together, and
    nothing is applied until you apply it. The guide: docs/tuning.md, "What it tries" and
    "How it decides".

    Args:
        model: a compiled `keras.Model`, or a function without arguments that builds and
            compiles one (needed to try a precision policy).
        data: `tf.data.Dataset` of batches, or arrays `x`, `(x, y)` or
            `(x, y, sample_weight)`, as `fit` takes them.
        batch_size: int or None, the global batch of array data, as `fit(batch_size=)`
            (ignored for a dataset). Defaults to None (32).
        validation_split: float or None, the last share of array data held out, as
            `fit(validation_split=)` holds it out (refused for a dataset, as by `fit`): the
            timed steps train on the rest, and `result.validation_data` holds it. Defaults
            to None.
        steps: int or None, timed steps of each timed `fit` (>= 3; None: chosen from the
            measured step so that every candidate fits the budget). Defaults to None.
        time_budget_s: float or None, seconds for the whole call (None: no limit).
            Defaults to 300.0.
        change_batch_size: bool, whether a faster batch size may be kept (it changes the
            optimization). Defaults to False.
        log_dir: str, os.PathLike or None, where `tune.json` and `tune.png` go.
            Defaults to None.
        verbose: `"auto"`, 0, 1 or 2, progress lines as `fit`'s. Defaults to `"auto"`.

    Returns:
        A `TuneResult`: print it for the table, the verified speedup and the lines to
        change; `result.apply(model)` applies the compile settings.

    Raises:
        TypeError: if an argument has the wrong type (`data` neither a dataset nor arrays).
        ValueError: if the model is not compiled, `data` yields single examples or holds
            arrays of different lengths, `validation_split` comes with a dataset, or a number
            is out of range.

    Example:

    >>> result = tfgpu.tune(model, (x, y), batch_size=128, validation_split=0.1)
    >>> print(result)
    >>> result.apply(model).fit(
    ...     result.dataset, validation_data=result.validation_data, epochs=10
    ... )
    """
    session = Session.open(
        "tune",
        verbose=verbose,
        time_budget_s=time_budget_s,
        log_dir=log_dir,
        measure_share=MEASURE_SHARE,
    )
    check_steps(steps, allow_none=True)
    check_bool("change_batch_size", change_batch_size)
    work = open_workload(  # the factory runs last
        model, data, batch_size=batch_size, validation_split=validation_split
    )
    from tfgpu.data import pipeline

    session.progress.phase("reading the model and the data")
    dataset = work.dataset
    facts = TuneFacts(**gather(work))
    guard_batches = read_first(dataset, GUARD_STEPS)  # the numerics guard's, the first builds
    variants = Variants(
        work.model,
        dataset,
        Epochs(),
        batch_size=facts.batch_size,
        factory=work.factory,
        pipeline=facts.pipeline,
        rebuild=pipeline,
        per_example=True,
        batch=guard_batches[0] if guard_batches else None,
        batches=work.batches,
    )
    facts.augment_on_batches = augment_on_batches(facts.pipeline, pipeline)
    if facts.pipeline is None and not work.from_arrays:  # would caching its output help?
        facts.cache_untried = cache_untried(
            dataset, variants.first_batch(), facts.batches_per_epoch
        )
    tuner = _Tuner(variants, facts, session, guard_batches, change_batch_size, steps)
    result = tuner.run(work.fit_data)
    result.validation_data = work.validation
    verified = "verified" if result.verified else "not verified together"
    summary = f"{result.speedup.text()} {verified}, {len(result.settings)} setting(s) kept"
    return session.finish(result, summary)


class _Tuner:
    """The first looks, the greedy search and the verification, on the variants of one
    workload."""

    def __init__(
        self,
        variants: Variants,
        facts: TuneFacts,
        session: Session,
        guard_batches: list[Any],
        change_batch_size: bool,
        steps: int | None = None,
    ):
        self.variants, self.facts, self.steps = variants, facts, steps
        self.model, self.data = variants.model, variants.dataset
        self.fit_data: Any = variants.dataset  # as `fit` takes it: what find_batch_size cuts
        self.guard_batches = guard_batches  # the first batches: the loss check's
        self.budget, self.progress, self.notes = session.budget, session.progress, session.notes
        self.change_batch_size = change_batch_size
        self.trials: list[Trial] = []
        self.kept: list[cands.Kept] = []
        self.best: dict[str, Any] = {}  # the kept settings (a strategy by its kind)
        self.step_s = 0.0  # seconds per step of the best so far, as last measured
        self.epoch_overhead_s = 0.0  # an epoch's own cost, beyond its steps' (timed once)
        self.target_s = FIT_S[0]  # how long a timed fit should last
        self.unit = 1  # timed steps come in multiples of this (the largest steps_per_execution)
        self.looks: dict[Any, float] = {}  # first-look seconds per example, by `key(changes)`
        self.stopped: dict[str, str] = {}  # a ladder stopped, by its group: at which rung
        self.halted = ""  # why the search stopped: the data or the model raised
        self._strategies: dict[str, Any] = {}
        self._losses: dict[Any, float] = {}

    # The search.
    def run(self, fit_data: Any = None) -> TuneResult:
        """The search on the workload (`fit_data`: the data as `fit` takes it, arrays as
        they are; None: the dataset)."""
        if fit_data is not None:
            self.fit_data = fit_data
        x, _, _ = keras.utils.unpack_x_y_sample_weight(self.guard_batches[0])
        with preserved(self.model, x):
            if self._first_look() is None:
                return self._not_timed()
            self.facts.input_time_s = timing.input_time(self.data)
            plan = self._probe(cands.candidates(self.facts))
            self._shape([c for c in plan if not c.untried])
            self._search(plan)
            speedup, verified = self._verify()
            pending = [c for c in plan if self._untried_for_budget(c.name)]
            if pending and self.budget.left() > 0:  # the time held back and not spent
                kept = len(self.kept)
                self._search(pending)
                if len(self.kept) != kept:
                    speedup, verified = self._verify()
            if not self.halted:  # last: by default it only reports
                kept = len(self.kept)
                self.trials.append(self._batch_size())
                if len(self.kept) != kept:
                    speedup, verified = self._verify()
            for name, _env, line, untried in cands.process_settings(bool(self.facts.on_gpu)):
                if not untried:  # not listed where it cannot run
                    self.trials.append(Trial(name, {}, reason=cands.FRESH_PROCESS, line=line))
            return self._result(speedup, verified)

    def _first_look(self) -> float | None:
        """The baseline's first look (the fit that traces, then a call or two): its seconds per
        example, None when the budget ended before a timed call."""
        self.progress.phase("a first look at the step (its first call traces)")
        self.variants.timed = Probe(self._look_limit())
        with preserved(self.model):
            seconds = self.variants.run_for({})(self.budget.deadline, None)
        if seconds is None:
            return None
        self.looks[key({})] = seconds
        self.step_s = seconds * (self.facts.batch_size or 1)
        self.facts.step_time_s = self.step_s
        return seconds

    def _look_limit(self) -> float | None:
        return None if self.budget.seconds is None else LOOK_SHARE * self.budget.seconds

    def _not_timed(self) -> TuneResult:
        wall = self.variants.warm_walls[-1] if self.variants.warm_walls else self.budget.elapsed()
        self.notes.append(
            "the baseline could not be timed within the time budget: its first call (which "
            f"traces the step) took {wall:,.0f} s of the {self.budget.seconds or 0:g} s; give "
            f"tune at least about {10 * wall:,.0f} s"
        )
        trials = [
            Trial(c.name, c.change, reason=c.untried or rules.BUDGET_SPENT, line=c.line)
            for c in cands.candidates(self.facts)
        ]
        return TuneResult(trials=trials, notes=self.notes, dataset=self.data)

    def _probe(self, plan: list[Candidate]) -> list[Candidate]:
        """A first look at each candidate that may be worth x2 or more (a ladder: its largest
        rung that runs), against the best's: one clearly (x2) faster or slower is decided at
        once; the others that look faster go first, the largest gain first. Returns the rest
        of `plan`, in that order."""
        ratios: dict[str, float] = {}
        done: set[str] = set()
        groups_seen: set[str] = set()
        for cand in plan:
            if not cand.probe or cand.untried or self.halted or cand.group in groups_seen:
                continue
            if cand.group:
                groups_seen.add(cand.group)
                rungs = [
                    c for c in plan if c.group == cand.group and not c.untried and self._fits(c)
                ]
                if not rungs:
                    continue
                cand = rungs[-1]
            if self.budget.left() <= 0:
                break
            why = self._cannot_run(cand)
            if why:
                self.trials.append(Trial(cand.name, cand.change, reason=why, line=cand.line))
                done.add(cand.name)
                continue
            self.progress.phase(f"a first look at {cand.name}")
            trial, ratio = self._look(cand)
            if trial is not None:
                self.trials.append(trial)
                done.add(cand.name)
            elif ratio is not None and ratio > 1.0:
                ratios[cand.group or cand.name] = ratio
        rest = [c for c in plan if c.name not in done]
        return sorted(rest, key=lambda c: -ratios.get(c.group or c.name, 0.0))

    def _look(self, cand: Candidate) -> tuple[Trial | None, float | None]:
        """`cand`'s first look against the best's: its trial when decided at once, else the
        gain it showed (None: not measured)."""
        changes = {**self.best, **cand.change}
        self.variants.timed = Probe(self._look_limit())
        first = self.looks.get(key(self.best))
        with recorded() as failure:
            c = self._compare(
                self.best, changes, self.budget, rounds=1, first_base=first, faster=rules.CLEARLY
            )
        if failure.text is not None or c.error:
            return self._failed(cand, failure.text or c.error, failure.error), None
        if not c.rounds:
            return None, None
        base_s, seconds = c.rounds[0]
        self.looks[key(changes)] = seconds
        if c.stopped in ("faster", "slower"):
            return self._judge(cand, c.rounds, c.stopped), None
        return None, base_s / seconds

    def _search(self, plan: list[Candidate]) -> None:
        for i, cand in enumerate(plan, 1):
            reason = cand.untried or self.halted or self._skip(cand)
            after = [c for c in plan[i:] if not c.untried and c.group not in self.stopped]
            budget = None if reason else self._budget_for(cand, after)
            if reason or budget is None:
                self._record(
                    Trial(
                        cand.name, cand.change, reason=reason or rules.BUDGET_SPENT, line=cand.line
                    )
                )
                continue
            self.progress.phase(f"trying {cand.name} ({i} of {len(plan)})")
            trial = self._try(cand, budget)
            self._record(trial)
            if cand.group and trial.status in _STOPS_LADDER:
                self.stopped[cand.group] = cand.name

    def _skip(self, cand: Candidate) -> str:
        """Why `cand` is not tried now ("": it is)."""
        if cand.group in self.stopped:
            return f"{self.stopped[cand.group]} was not kept"
        if cand.group and cand.group in self.best:
            value = self.best[cand.group]
            if cand.change[cand.group] <= value:
                return f"{cand.group}={value} was kept"
        if "all_reduce" in cand.change and "all_reduce" in self.best:
            return (
                f"all_reduce={self.best['all_reduce']} was kept (one all-reduce at a time: tune "
                "again with it to compare the others)"
            )
        if cand.group == "steps_per_execution":  # the step as it is now
            return cands.spe_fits(cand.change["steps_per_execution"], self.step_s)
        return self._cannot_run(cand)

    def _fits(self, cand: Candidate) -> bool:
        return not (cand.group == "steps_per_execution" and self._skip(cand))

    def _cannot_run(self, cand: Candidate) -> str:
        """Why `cand`'s model cannot be built ("": it can): a strategy without a factory for a
        model Keras cannot clone."""
        if "strategy" not in cand.change:
            return ""
        try:
            self.variants.model_for(self._resolved({**self.best, **cand.change}))
        except SameModel:
            return f"{SAME_MODEL}: nothing was built under the strategy"
        except ValueError as e:
            return f"{cands.NEEDS_FACTORY} ({e})"
        return ""

    def _record(self, trial: Trial) -> None:
        """Adds `trial` to the table, in place of an earlier row of the same candidate."""
        for i, t in enumerate(self.trials):
            if t.name == trial.name:
                self.trials[i] = trial
                return
        self.trials.append(trial)

    def _untried_for_budget(self, name: str) -> bool:
        return any(t.name == name and t.reason == rules.BUDGET_SPENT for t in self.trials)

    def _shape(self, todo: list[Candidate]) -> None:
        """Sets the timed fits' shape from the best's step: about the measuring budget over
        the fits that every candidate's rounds need (or `steps`). Whole epochs are counted from
        one timed epoch of the best (its iterator and a last partial call included), so that
        an epoch's own cost is in the count."""
        facts = self.facts
        step_s = max(self.step_s, 1e-9)
        spe = [int(c.change.get("steps_per_execution", 1)) for c in todo if self._fits(c)]
        self.unit = max(
            [facts.steps_per_execution, int(self.best.get("steps_per_execution", 1)), *spe]
        )
        if self.steps is not None:
            self.target_s = self.steps * step_s
        elif math.isinf(self.budget.left()):
            self.target_s = FIT_S[0]
        else:  # every candidate's rounds and its fit that traces, and the verification's
            fits = len(todo) * (2 * rules.MIN_ROUNDS + 1) + 2 * rules.MIN_ROUNDS
            self.target_s = min(max(self.budget.left() / fits / SLACK, FIT_S[1]), FIT_S[2])
        shape = self._shape_for(step_s)
        if shape.steps_per_epoch is None and shape.epochs > 1 and not self.halted:
            self._time_an_epoch()
            shape = self._shape_for(step_s)
        self.variants.timed = shape
        what = f"the first {shape.steps_per_epoch} steps of an epoch"
        if shape.steps_per_epoch is None:
            what = f"{shape.epochs} whole epoch(s) of {facts.batches_per_epoch} batches"
        self.notes.append(
            f"each timed fit ran {what}, from the epoch's start, once the step was traced "
            f"(steps of {step_s * 1e3:,.2f} ms as first measured; no validation)"
        )

    def _time_an_epoch(self) -> None:
        """One timed epoch of the best: an epoch's own cost beyond its steps'."""
        self.variants.timed = Epochs(1, None)
        with recorded() as failure, preserved(self.model):
            seconds = self.variants.run_for(self._resolved(self.best))(self.budget.deadline, None)
        if failure.text is not None:  # with the settings measured already: the data or model
            self._halt(failure.text)
        elif seconds is not None:
            wall = self.variants.fit_walls.pop()  # one epoch, all in
            steps = self.facts.batches_per_epoch or 1
            self.epoch_overhead_s = max(0.0, wall - steps * self.step_s)

    def _shape_for(self, step_s: float) -> Epochs:
        """Timed fits of about `target_s` for steps of `step_s` (whole epochs, each with its
        own cost, or the first steps of one)."""
        per_epoch = self.facts.batches_per_epoch
        epochs, steps = cands.fit_shape(max(step_s, 1e-9), per_epoch, self.target_s, self.unit)
        if steps is None and per_epoch:
            epoch_s = per_epoch * step_s + self.epoch_overhead_s
            epochs = max(1, round(self.target_s / max(epoch_s, 1e-9)))
        return Epochs(epochs, steps)

    def _steps_per_fit(self, shape: Epochs | None = None) -> int:
        t = shape or self.variants.timed
        if not isinstance(t, Epochs):
            return 3
        return t.epochs * (t.steps_per_epoch or self.facts.batches_per_epoch or 1)

    def _fit_s(self, step_s: float, shape: Epochs | None = None) -> float:
        """About how long a timed fit (of `shape`, or the search's) of steps of `step_s` takes:
        its steps, and each epoch's own cost (its iterator, a last partial call)."""
        t = shape or self.variants.timed
        epochs = t.epochs if isinstance(t, Epochs) and t.steps_per_epoch is None else 0
        return self._steps_per_fit(shape) * step_s + epochs * self.epoch_overhead_s

    def _trace_s(self) -> float:
        v = self.variants
        return stats.median(v.warm_walls) if v.warm_walls else 0.0

    def _min_cost(self, cand: Candidate) -> float:
        """The least `cand` takes: three rounds of two timed fits (their steps, or as long as
        fits took so far), a fit that traces where it changes the step (not the pipeline), and
        the loss check's batches where it may change the loss."""
        v = self.variants
        fit_s = max(
            self._fit_s(self.step_s), stats.median(v.fit_walls[-8:]) if v.fit_walls else 0.0
        )
        traces = bool(set(cand.change) & set(rules.STEP_KEYS))
        guard = 2 * GUARD_STEPS * self.step_s if cand.numerics else 0.0
        return (
            (max(fit_s, self._trace_s()) if traces else 0.0) + 2 * rules.MIN_ROUNDS * fit_s + guard
        )

    def _verify_cost(self, one_more: bool) -> float:
        """The time to hold back for the verification of the kept settings (and one more): as
        `_verify_by_look` decides, a first look or three rounds against the baseline (none
        while nothing is kept or tried)."""
        if not self.kept and not one_more:
            return 0.0
        look, rounds_s = self._verify_by_look()
        return self._trace_s() + (0.0 if look else rounds_s)

    def _verify_by_look(self) -> tuple[bool, float]:
        """(whether the kept settings are verified by a first look against the baseline's, the
        seconds three rounds against the baseline would take, in fits shaped for the
        baseline's step): by a look where the baseline is x2 slower than the best and those
        rounds would take over `VERIFY_ROUNDS_SHARE` of the budget (the XLA undo of a slow
        step)."""
        base_step = self.looks.get(key({}), 0.0) * (self.facts.batch_size or 1)
        shape = self._shape_for(base_step)
        rounds_s = rules.MIN_ROUNDS * (
            self._fit_s(base_step, shape) + self._fit_s(self.step_s, shape)
        )
        limit = math.inf if self.budget.seconds is None else self.budget.seconds
        slow = base_step >= rules.CLEARLY * self.step_s
        return slow and rounds_s > VERIFY_ROUNDS_SHARE * limit, rounds_s

    def _budget_for(self, cand: Candidate, after: list[Candidate]) -> timing.Budget | None:
        """When `cand` stops taking rounds beyond three: what is left less the least the ones
        `after` it need and the verification, so that each is tried; None when what is left
        cannot measure it and verify it."""
        left = self.budget.left()
        if math.isinf(left):
            return self.budget
        cost, verify = self._min_cost(cand), self._verify_cost(one_more=True)
        if left < cost + verify:
            return None
        spare = left - verify - SLACK * sum(self._min_cost(c) for c in after)
        return timing.Budget(max(spare, cost))

    def _try(self, cand: Candidate, budget: timing.Budget) -> Trial:
        """`cand` on top of the best so far, in rounds: its trial (the caller records it)."""
        changes = {**self.best, **cand.change}
        with recorded() as failure:
            c = self._compare(self.best, changes, self.budget, until=budget)
        if failure.text is not None or c.error:
            return self._failed(cand, failure.text or c.error, failure.error)
        return self._judge(cand, c.rounds, c.stopped)

    def _judge(
        self, cand: Candidate, rounds: list[tuple[float, float]], stopped: str | None
    ) -> Trial:
        """The verdict on `cand`'s rounds, the loss checked where it may change; a kept one
        becomes the best so far."""
        changes = {**self.best, **cand.change}
        status, reason = rules.verdict(rounds, stopped)
        if status == rules.KEPT and cand.numerics:  # faster: is the loss still right?
            self.progress.phase(f"checking the loss with {cand.name}")
            with recorded() as failure:
                unsafe = cands.numerics_verdict(self._loss(self.best), self._loss(changes))
            if failure.text is not None:
                return self._failed(cand, failure.text, failure.error)
            if unsafe:
                status, reason = rules.UNSAFE, unsafe
        if status == rules.KEPT and cand.note:
            reason = f"{reason}; {cand.note}"
        gain = rules.Gain.of(rounds)
        trial = Trial(cand.name, cand.change, gain, status, reason, cand.line)
        if status == rules.KEPT and gain is not None:
            self.kept.append(cands.Kept(trial, rounds, against_baseline=not self.best))
            self.best = changes
            self.step_s /= gain.value
        return trial

    def _failed(self, cand: Candidate, text: str, error: Exception | None = None) -> Trial:
        """The trial of a setting that broke the model or the pipeline, unless the data or the
        model raise without it too: then the search stops (`halted`). A factory that returned
        its first model again built nothing to try: untried."""
        if isinstance(error, SameModel):
            reason = f"{SAME_MODEL}: {NOTHING_BUILT}"
            return Trial(cand.name, cand.change, None, rules.UNTRIED, reason, cand.line)
        with recorded() as again, preserved(self.model):
            self.variants.run_for(self._resolved(self.best))(self.budget.deadline, None)
        status, reason = rules.FAILED, text
        if again.text is not None:
            self._halt(again.text)
            status, reason = rules.UNTRIED, self.halted
        return Trial(cand.name, cand.change, None, status, reason, cand.line)

    def _halt(self, error: str) -> None:
        """Stops the search: the training raised with the settings measured already."""
        self.halted = (
            f"{cands.HALTED}: the training raised without any new setting too ({error}): the "
            "data or the model, not a setting"
        )
        self.notes.append(self.halted)

    def _loss(self, changes: dict[str, Any]) -> float:
        """The numerics guard's mean loss with `changes` (the best's: measured once)."""
        k = key(changes)
        if k not in self._losses:
            self._losses[k] = mean_loss(self.variants, self.guard_batches, self._resolved(changes))
        return self._losses[k]

    def _resolved(self, changes: dict[str, Any]) -> dict[str, Any]:
        """`changes` as the variants take them: a strategy kind made the strategy itself."""
        kind = changes.get("strategy")
        if not isinstance(kind, str):
            return changes
        if kind not in self._strategies:
            from tfgpu.distribute import strategy

            self._strategies[kind] = strategy(kind)
        return {**changes, "strategy": self._strategies[kind]}

    # The batch size.
    def _batch_size(self) -> Trial:
        name, batch = "batch size", self.facts.batch_size
        if not batch:
            return Trial(name, reason="the batch size of the data is unknown")
        sizes = [batch * 2**i for i in range(int(math.log2(BATCH_GROWTH)) + 1)]
        # Each size traces its step once and runs a few steps, longer as the batch grows.
        v = self.variants
        trace_s = stats.median(v.warm_walls) if v.warm_walls else 0.0
        estimate = sum(trace_s + 4 * self.step_s * size / batch for size in sizes)
        if self.budget.left() <= estimate + self._verify_cost(one_more=False):
            return Trial(name, reason=rules.BUDGET_SPENT)
        self.progress.phase("finding the batch size")
        from tfgpu import batch_size as batch_size_module

        with recorded() as failure, preserved(self.model):
            found = batch_size_module.find_batch_size(
                v.model_for(self._resolved(self.best)),
                self.fit_data,
                start=batch,
                max_batch_size=batch * BATCH_GROWTH,
                max_trials=5,
                steps=3,
                verbose=0,
            )
        if failure.text is not None:
            return Trial(name, status=rules.FAILED, reason=failure.text)
        speeds = {t.batch_size: t.examples_per_s for t in found.trials if t.fits}
        fastest = found.fastest
        if not fastest or fastest == batch or fastest not in speeds:
            reason = f"find_batch_size found no faster batch than {batch}"
            return Trial(name, status=rules.NO_GAIN, reason=reason)
        lr_note = self._learning_rate_note(batch, fastest)
        here = speeds.get(batch)
        vs = f" vs {here:,.0f} at {batch}" if here else ""
        figures = f"{speeds[fastest]:,.0f} examples/s at {fastest}{vs}"
        change = {"batch_size": fastest}
        line = cands.line_for(change, self.facts) + (f"  # {lr_note}" if lr_note else "")
        cand = Candidate(f"{name} {fastest}", change, line)
        if self.change_batch_size:
            budget = self._budget_for(cand, [])
            if budget is not None:
                return self._try(cand, budget)
            reason = rules.BUDGET_SPENT
        else:
            lr = f", {lr_note}" if lr_note else ""
            reason = f"changes the optimization; find_batch_size: {figures}{lr}; pass "
            reason += "change_batch_size=True to try it"
        return Trial(cand.name, change, reason=reason, line=line)

    def _learning_rate_note(self, old: int, new: int) -> str:
        from tfgpu.distribute import scale_learning_rate

        opt = self.model.optimizer
        try:
            lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
        except (AttributeError, TypeError, ValueError):  # no learning rate, or not one number
            return "scale the learning rate with the batch"
        rule = "linear" if "sgd" in type(opt).__name__.lower() else "sqrt"
        try:
            scaled = scale_learning_rate(lr, new, rule=rule, base_replicas=old)
        except (TypeError, ValueError):  # e.g. a learning rate of 0
            return ""
        return f"learning rate {lr:.3g} -> {scaled:.3g} ({rule} rule)"

    # The verification and the result.
    def _verify(self) -> tuple[rules.Gain, bool]:
        """The kept settings together against the baseline (`cands.verify`): the gain, and
        whether it was verified (else the search's estimate: the budget ran out first)."""
        self.progress.phase("verifying the kept settings together")
        return cands.verify(self.kept, self._together, self.notes, again=True)

    def _together(self, changes: dict[str, Any]) -> timing.Comparison:
        """All kept settings together against the baseline (`cands.verify` asks): in
        interleaved rounds of timed fits, or by a first look (`_verify_by_look`), decided when
        still clearly faster."""
        base = self.looks.get(key({}))
        by_look = base is not None and self._verify_by_look()[0]
        timed = self.variants.timed
        if by_look:
            self.variants.timed = Probe(self._look_limit())
        elif isinstance(timed, Epochs) and base is not None:  # fits shaped for the baseline
            self.variants.timed = self._shape_for(base * (self.facts.batch_size or 1))
        try:
            with recorded() as failure:
                if by_look:
                    return self._compare(
                        {}, changes, self.budget, rounds=1, first_base=base, faster=rules.CLEARLY
                    )
                return self._compare({}, changes, self.budget)
            return timing.Comparison(error=failure.text or "")
        finally:
            self.variants.timed = timed

    def _result(self, speedup: rules.Gain, verified: bool) -> TuneResult:
        kept = [k.trial for k in self.kept]
        settings = {key_: value for t in kept for key_, value in t.change.items()}
        lines = cands.combined_lines([(t.change, t.line) for t in kept], self.facts)
        base = stats.median(self.variants.base_times)
        if not (base and math.isfinite(base)):  # only first looks ran: their baseline
            base = self.looks.get(key({}), math.nan)
        base_eps = 1.0 / base if base and math.isfinite(base) and base > 0 else math.nan
        dataset = self.data
        if any(k in settings for k in rules.PIPELINE_KEYS):
            dataset = self.variants.dataset_for(self._resolved(settings))[0]
        return TuneResult(
            trials=self.trials,
            baseline_examples_per_s=base_eps,
            tuned_examples_per_s=base_eps * speedup.value,
            speedup=speedup,
            settings=settings,
            lines=lines,
            dataset=dataset,
            notes=self.notes,
            verified=verified,
        )

    def _compare(
        self,
        base: dict[str, Any],
        changes: dict[str, Any],
        budget: timing.Budget,
        until: timing.Budget | None = None,
        *,
        rounds: int = rules.MAX_ROUNDS,
        first_base: float | None = None,
        faster: float | None = None,
    ) -> timing.Comparison:
        """`changes` against `base` in interleaved rounds until `rules.decided` (at most
        `rounds`; `first_base`: the base's first round, measured), the model put back
        afterwards; past `until`, no round beyond the first three."""
        v = self.variants

        def done(measured: list[tuple[float, float]]) -> bool:
            return rules.decided(measured) or (until is not None and until.left() <= 0)

        with preserved(self.model):
            return timing.compare(
                v.run_for(self._resolved(base)),
                {"variant": v.run_for(self._resolved(changes))},
                budget=budget,
                max_rounds=rounds,
                timed_units=self._steps_per_fit() * int(self.facts.batch_size or 1),
                first_base=first_base,
                done=done,
                clearly_faster=faster,
            )["variant"]
