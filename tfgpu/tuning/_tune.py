"""`tune()`: open the session, read the facts, try each candidate, verify, report."""

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
from tfgpu._internal.measure.variants import Epochs, Variants
from tfgpu._internal.measure.workload import SAME_MODEL, SameModel, open_workload
from tfgpu.tuning import _candidates as cands
from tfgpu.tuning._candidates import Candidate, TuneFacts
from tfgpu.tuning._result import Trial, TuneResult
from tfgpu.tuning._trial import augment_on_batches, cache_untried, mean_loss, recorded

# Shares of the time budget: candidates until the first (the second while nothing is kept:
# nothing to verify), the verification until the second.
MEASURE_SHARE, VERIFY_SHARE = 0.75, 0.95
# A timed fit lasts about the measuring budget over the fits planned, within these bounds;
# without a budget, the first.
FIT_S = (5.0, 0.5, 15.0)
# Batches the numerics guard trains on (with `steps_per_execution=1`), from the same weights.
GUARD_STEPS = 5
# find_batch_size tries batches up to this multiple of the current one.
BATCH_GROWTH = 8
# Why a precision candidate is untried when the factory returns its first model again.
NOTHING_BUILT = "nothing was built under the policy"


def tune(
    model: keras.Model | Callable[[], keras.Model],
    data: Any,
    *,
    batch_size: int | None = None,
    steps: int | None = None,
    time_budget_s: float | None = rules.SEARCH_BUDGET_S,
    change_batch_size: bool = False,
    log_dir: str | os.PathLike[str] | None = None,
    verbose: int | str = "auto",
) -> TuneResult:
    """Tries each speed setting on your model and data, keeps what measurably helps.

    Each candidate is timed against the best configuration so far in interleaved rounds of
    `fit`s and kept when the whole confidence interval of its gain clears x1.05; the kept
    ones are verified together, and nothing is applied until you apply it. The guide:
    docs/tuning.md, "What it tries" and "How it decides".

    Args:
        model: a compiled `keras.Model`, or a function without arguments that builds and
            compiles one (needed to try a precision policy).
        data: `tf.data.Dataset` of batches, or arrays `x`, `(x, y)` or
            `(x, y, sample_weight)`.
        batch_size: int or None, the global batch of array data, as `fit(batch_size=)`
            (ignored for a dataset). Defaults to None (32).
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
            arrays of different lengths, or a number is out of range.

    Example:

    >>> train = tfgpu.data.pipeline((x, y), batch_size=256)
    >>> result = tfgpu.tune(build_model, train, time_budget_s=60)
    >>> print(result)
    >>> model = result.apply(build_model())
    >>> model.fit(result.dataset, epochs=10)
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
    work = open_workload(model, data, batch_size=batch_size)  # the factory runs last
    from tfgpu.data import pipeline

    session.progress.phase("reading the model and the data")
    dataset = work.dataset
    has_factory = work.factory is not None
    facts = TuneFacts(
        **gather(work.model, dataset, from_arrays=work.from_arrays, has_factory=has_factory)
    )
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
    )
    facts.augment_on_batches = augment_on_batches(facts.pipeline, pipeline)
    if facts.pipeline is None:  # another dataset: would caching its output change anything?
        facts.cache_untried = cache_untried(
            dataset, variants.first_batch(), facts.batches_per_epoch
        )
    result = _Tuner(variants, facts, session, guard_batches, change_batch_size, steps).run()
    summary = f"{result.speedup.text()} verified, {len(result.settings)} setting(s) kept"
    return session.finish(result, summary)


class _Tuner:
    """The greedy search and the verification, on the variants of one workload."""

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
        self.guard_batches = guard_batches  # the first batches: the loss check's
        self.budget, self.progress, self.notes = session.budget, session.progress, session.notes
        budget = session.budget
        self.verify_budget = timing.Budget(budget.seconds, VERIFY_SHARE, start=budget.start)
        self.change_batch_size = change_batch_size
        self.trials: list[Trial] = []
        self.kept: list[cands.Kept] = []
        self.best: dict[str, Any] = {}
        self.halted = ""  # why the search stopped: the data or the model raised

    # The search.
    def run(self) -> TuneResult:
        x, _, _ = keras.utils.unpack_x_y_sample_weight(self.guard_batches[0])
        with preserved(self.model, x):
            self.progress.phase("timing the baseline")
            start = timing.now()
            with preserved(self.model):  # a fit that traces: the baseline's runs share its step
                step_s = timing.probe_step_time(
                    self.model, self.data.repeat(), self.budget.deadline
                )
                self.variants.warm_walls.append(timing.now() - start)  # as a guide
                self.variants.share_step()
            if step_s is None:
                self.notes.append("the baseline could not be timed within the time budget")
                trials = [
                    Trial(c.name, c.change, reason=c.untried or rules.BUDGET_SPENT, line=c.line)
                    for c in cands.candidates(self.facts)
                ]
                return TuneResult(trials=trials, notes=self.notes, dataset=self.data)
            self.facts.step_time_s = step_s
            self.facts.input_time_s = timing.input_time(self.data)
            plan = cands.candidates(self.facts)
            self._shape([c for c in plan if not c.untried])
            self._search(plan, step_s)
            if not self.halted:
                self.trials.append(self._batch_size(step_s))
            for name, _env, line, untried in cands.process_settings(bool(self.facts.on_gpu)):
                if not untried:  # not listed where it cannot run
                    self.trials.append(Trial(name, {}, reason=cands.FRESH_PROCESS, line=line))
            self.progress.phase("verifying the kept settings together")
            return self._finish()

    def _search(self, plan: list[Candidate], step_s: float) -> None:
        stopped: dict[str, str] = {}
        for i, cand in enumerate(plan, 1):
            reason = cand.untried or self.halted
            if not reason and cand.group in stopped:
                reason = f"{stopped[cand.group]} was not kept"
            if not reason and "all_reduce" in cand.change and "all_reduce" in self.best:
                reason = (
                    f"all_reduce={self.best['all_reduce']} was kept (one all-reduce at a "
                    "time: tune again with it to compare the others)"
                )
            if not reason and cand.group == "steps_per_execution":  # the step as it is now
                now_s = step_s / math.prod(k.trial.gain.value for k in self.kept if k.trial.gain)
                reason = cands.spe_fits(cand.change["steps_per_execution"], now_s)
            todo = [c for c in plan[i:] if not c.untried and c.group not in stopped]
            # Until a setting is kept there is nothing to verify: its share is the search's.
            self.budget.measure_share = MEASURE_SHARE if self.kept else VERIFY_SHARE
            budget = self._budget_for(cand, todo)
            if reason or budget is None:
                reason = reason or rules.BUDGET_SPENT
                self.trials.append(Trial(cand.name, cand.change, reason=reason, line=cand.line))
                continue
            self.progress.phase(f"trying {cand.name} ({i} of {len(plan)})")
            trial = self._try(cand, budget)
            self.trials.append(trial)
            if cand.group and trial.status != rules.KEPT:
                stopped[cand.group] = cand.name

    def _shape(self, todo: list[Candidate]) -> None:
        """Sets the timed fits' shape from the measured step: about the measuring budget over
        the fits that every candidate's rounds and the verification need (or `steps`)."""
        facts = self.facts
        step_s, per_epoch = float(facts.step_time_s or 0.0), facts.batches_per_epoch
        spe = [int(c.change.get("steps_per_execution", 1)) for c in todo]
        unit = max([facts.steps_per_execution] + [v for v in spe if not cands.spe_fits(v, step_s)])
        if self.steps is not None:
            target = self.steps * step_s
        elif math.isinf(self.budget.left()):
            target = FIT_S[0]
        else:
            fits = (len(todo) + 1) * (2 * rules.MIN_ROUNDS + 1)
            target = min(max(self.budget.left() / fits, FIT_S[1]), FIT_S[2])
        epochs, steps = cands.fit_shape(max(step_s, 1e-9), per_epoch, target, unit)
        self.variants.timed = Epochs(epochs, steps)
        what = f"the first {steps} steps of an epoch"
        if steps is None:
            what = f"{epochs} whole epoch(s) of {per_epoch} batches"
        self.notes.append(
            f"each timed fit ran {what}, from the epoch's start, once the step was traced "
            f"(steps of {step_s * 1e3:,.1f} ms as measured first; no validation)"
        )

    def _steps_per_fit(self) -> int:
        t = self.variants.timed
        assert isinstance(t, Epochs)
        return t.epochs * (t.steps_per_epoch or self.facts.batches_per_epoch or 1)

    def _min_cost(self, cand: Candidate) -> float:
        """The least `cand` takes: three rounds of two timed fits (their steps, or as long as
        fits took so far), and a fit that traces where it changes the step (not the pipeline)."""
        v, step_s = self.variants, float(self.facts.step_time_s or 0.0)
        fit_s = max(
            self._steps_per_fit() * step_s, stats.median(v.fit_walls) if v.fit_walls else 0.0
        )
        warm_s = max(fit_s, stats.median(v.warm_walls) if v.warm_walls else 0.0)
        traces = bool(set(cand.change) & set(rules.STEP_KEYS))
        return (warm_s if traces else 0.0) + 2 * rules.MIN_ROUNDS * fit_s

    def _budget_for(self, cand: Candidate, after: list[Candidate]) -> timing.Budget | None:
        """When `cand` stops taking rounds beyond three: what is left less the least the ones
        `after` it need, so that each is tried; None when what is left cannot measure it."""
        left, cost = self.budget.left(), self._min_cost(cand)
        if math.isinf(left):
            return self.budget
        if left < cost:
            return None
        return timing.Budget(max(left - sum(self._min_cost(c) for c in after), cost))

    def _try(self, cand: Candidate, budget: timing.Budget) -> Trial:
        """`cand` on top of the best so far: its trial (the caller records it)."""
        changes = {**self.best, **cand.change}
        rounds: list[tuple[float, float]] = []
        with recorded() as failure:
            c = self._compare(self.best, changes, self.budget, until=budget)
            rounds = c.rounds
            status, reason = rules.verdict(rounds, c.stopped)
            if status == rules.KEPT and cand.numerics:  # faster: is the loss still right?
                self.progress.phase(f"checking the loss with {cand.name}")
                base_loss = mean_loss(self.variants, self.guard_batches, self.best)
                loss = mean_loss(self.variants, self.guard_batches, changes)
                unsafe = cands.numerics_verdict(base_loss, loss)
                if unsafe:
                    status, reason = rules.UNSAFE, unsafe
        if isinstance(failure.error, SameModel):  # nothing was built under the policy
            status, reason, rounds = rules.UNTRIED, f"{SAME_MODEL}: {NOTHING_BUILT}", []
        elif failure.text is not None:  # a setting that breaks the model or the pipeline ...
            with recorded() as again, preserved(self.model):  # ... or the data itself?
                self.variants.run_for(self.best)(self.budget.deadline, None)
            status, reason, rounds = rules.FAILED, failure.text, []
            if again.text is not None:
                self.halted = (
                    f"{cands.HALTED}: the training raised without any new setting too "
                    f"({again.text}): the data or the model, not a setting"
                )
                self.notes.append(self.halted)
                status, reason = rules.UNTRIED, self.halted
        elif status == rules.KEPT and cand.note:
            reason = f"{reason}; {cand.note}"
        trial = Trial(cand.name, cand.change, rules.Gain.of(rounds), status, reason, cand.line)
        if status == rules.KEPT:
            self.kept.append(cands.Kept(trial, rounds, against_baseline=not self.best))
            self.best = changes
        return trial

    # The batch size.
    def _batch_size(self, step_s: float) -> Trial:
        name, batch = "batch size", self.facts.batch_size
        if not batch:
            return Trial(name, reason="the batch size of the data is unknown")
        sizes = [batch * 2**i for i in range(int(math.log2(BATCH_GROWTH)) + 1)]
        # Each size traces its step once and runs a few steps, longer as the batch grows.
        v = self.variants
        trace_s = stats.median(v.warm_walls) if v.warm_walls else 0.0
        estimate = sum(trace_s + 4 * step_s * size / batch for size in sizes)
        if self.budget.left() <= estimate:
            return Trial(name, reason=rules.BUDGET_SPENT)
        self.progress.phase("finding the batch size")
        from tfgpu import batch_size as batch_size_module

        with recorded() as failure, preserved(self.model):
            found = batch_size_module.find_batch_size(
                v.model_for(self.best),
                self.data,
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
    def _finish(self) -> TuneResult:
        speedup = cands.verify(self.kept, self._together, self.notes)
        kept = [k.trial for k in self.kept]
        settings = {key: value for t in kept for key, value in t.change.items()}
        lines = cands.combined_lines([(t.change, t.line) for t in kept], self.facts)
        base = stats.median(self.variants.base_times)
        base_eps = 1.0 / base if base and math.isfinite(base) and base > 0 else math.nan
        dataset = self.data
        if any(k in settings for k in rules.PIPELINE_KEYS):
            dataset = self.variants.dataset_for(settings)[0]
        return TuneResult(
            trials=self.trials,
            baseline_examples_per_s=base_eps,
            tuned_examples_per_s=base_eps * speedup.value,
            speedup=speedup,
            settings=settings,
            lines=lines,
            dataset=dataset,
            notes=self.notes,
        )

    def _together(self, changes: dict[str, Any]) -> timing.Comparison:
        """All kept settings together against the baseline (`cands.verify` asks)."""
        with recorded() as failure:
            return self._compare({}, changes, self.verify_budget)
        return timing.Comparison(error=failure.text or "")

    def _compare(
        self,
        base: dict[str, Any],
        changes: dict[str, Any],
        budget: timing.Budget,
        until: timing.Budget | None = None,
    ) -> timing.Comparison:
        """`changes` against `base` in interleaved rounds until `rules.decided`, the model
        put back afterwards; past `until`, no round beyond the first three."""
        v = self.variants

        def done(rounds: list[tuple[float, float]]) -> bool:
            return rules.decided(rounds) or (until is not None and until.left() <= 0)

        with preserved(self.model):
            return timing.compare(
                v.run_for(base),
                {"variant": v.run_for(changes)},
                budget=budget,
                timed_units=self._steps_per_fit() * int(self.facts.batch_size or 1),
                done=done,
            )["variant"]
