"""`tune()`: check the arguments, read the facts, try each candidate, verify, report."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import psutil
import tensorflow as tf

from tfgpu._internal.adapters import timing
from tfgpu._internal.adapters.all_reduce import describe as describe_all_reduce
from tfgpu._internal.adapters.datasets import (
    cardinality,
    has_step,
    pipeline_arguments,
    read_first,
    source_batches,
    unrepeatable,
)
from tfgpu._internal.adapters.devices import tf_gpus
from tfgpu._internal.adapters.model_state import preserved, supports_xla
from tfgpu._internal.adapters.workload import check_data, check_model_and_data
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import (
    check_bool,
    check_int,
    check_time_budget,
    invalid_type,
    invalid_value,
)
from tfgpu._internal.helpers.files import writable_dir
from tfgpu._internal.helpers.progress import Progress, check_verbose
from tfgpu._internal.helpers.warn import one_line
from tfgpu.tuning import _candidates as cands
from tfgpu.tuning._candidates import Candidate, Facts
from tfgpu.tuning._result import Trial, TuneResult, finish
from tfgpu.tuning._trial import Workload

# Shares of the time budget: candidates until the first (the second while nothing is kept:
# nothing to verify), the verification until the second.
MEASURE_SHARE = 0.75
VERIFY_SHARE = 0.95

# Rounds one candidate may take at most: a borderline one never takes the next ones' budget.
MAX_ROUNDS = 6

# A candidate this much slower in its first round is not measured further (one noisy round
# on a loaded host can reach 1.5x; XLA on a CPU is often 3-5x slower).
CLEARLY_SLOWER = 2.0

# A timed fit lasts about the measuring budget over the fits planned, within these bounds;
# without a budget, the first.
FIT_S = (5.0, 0.5, 15.0)

# find_batch_size tries per-replica batches up to this multiple of the current one.
BATCH_GROWTH = 8


@dataclasses.dataclass
class Failure:
    """What the body of a `recorded` block raised, in words (None while nothing failed)."""

    text: str | None = None


@contextlib.contextmanager
def recorded(describe: Callable[[Exception], str] = one_line) -> Iterator[Failure]:
    """Runs the body; an error in it does not propagate: `describe(error)` goes into the
    `Failure` given, for the caller to record."""
    failure = Failure()
    try:
        yield failure
    except Exception as e:  # tune's one catch-all: a setting that breaks the user's model
        # or pipeline (any error, from their code or TensorFlow) is recorded, never a crash
        # of the search
        failure.text = describe(e)


def _cpu_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 faster than float32 (AMX, AVX-512 BF16)."""
    from tfgpu._internal.adapters import cpu

    bf16, fp32 = cpu.peak_flops("bfloat16"), cpu.peak_flops("float32")
    return bf16 is not None and fp32 is not None and bf16 > fp32


# Copies of one example in the batch that tells a per-example draw from a per-batch one: a
# random flip leaves 16 copies all alike once in 2**15 (4 copies: once in 8, a flaky verdict).
_COPIES = 16


def _augment_on_batches(arguments: dict[str, Any] | None) -> str:
    """Why the pipeline's `augment_fn` cannot simply run on whole batches ("" when it can, or
    there is none): it fails on a batch, or draws its random values once per batch (copies of
    one example come out alike while two calls differ). Reads one unaugmented batch."""
    fn = (arguments or {}).get("augment_fn")
    if fn is None:
        return ""
    from tfgpu.data import pipeline

    with recorded(lambda e: one_line(e, limit=120)) as failure:
        kwargs = {**arguments, "augment_fn": None, "shuffle": False, "distribute": False}  # type: ignore[dict-item]
        kwargs["validation_split"] = None
        kwargs["repeat"] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = pipeline(**kwargs)
        batch = read_first(plain, 1)[0]
    if failure.text is not None:
        return f"its input batches could not be read: {failure.text}"
    single = not isinstance(batch, tuple)
    parts = (batch,) if single else batch

    def call(*xs: Any) -> Any:
        return fn(xs[0]) if single else fn(*xs)

    with recorded(lambda e: one_line(e, limit=160)) as failure:
        out = call(*parts)
        copies = tuple(
            tf.nest.map_structure(lambda t: tf.repeat(t[:1], _COPIES, axis=0), p) for p in parts
        )
        alike = call(*copies)
        first = tuple(tf.nest.map_structure(lambda t: t[0], p) for p in parts)
        one, two = call(*first), call(*first)
    if failure.text is not None:
        return failure.text
    leaves_in, leaves_out = tf.nest.flatten(parts), tf.nest.flatten(out)
    if len(leaves_in) != len(leaves_out) or any(
        getattr(o, "shape", None) is None
        or o.shape.rank != i.shape.rank
        or o.shape[0] != i.shape[0]
        for i, o in zip(leaves_in, leaves_out, strict=False)
    ):
        return "on a batch it changes the batch's shape"

    def same(a: Any, b: Any) -> bool:
        return all(
            bool(tf.reduce_all(tf.equal(x, y)))
            for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True)
        )

    rows = [tf.nest.map_structure(lambda t, k=k: t[k], alike) for k in range(_COPIES)]
    if all(same(rows[0], r) for r in rows[1:]) and not same(one, two):
        return "on a batch it draws its random values once for the whole batch"
    return ""


def _batches(data: tf.data.Dataset) -> tuple[int | None, bool, int | None, tuple[int, int] | None]:
    """(global batch, whether the batch shape is static, batches per epoch, (examples in a
    partial last batch, examples per epoch) or None: none, or cannot tell); ValueError for
    a dataset of examples."""
    batches, _ = source_batches(data)
    if batches is None:
        raise invalid_value(
            "data",
            data,
            "a dataset of batches (e.g. `.batch(n)` at its end, or "
            "`tfgpu.data.pipeline(..., batch_size=n)`); its elements look like single "
            f"examples: {data.element_spec}",
        )
    static = all(
        leaf.shape.rank and leaf.shape[0] is not None
        for leaf in tf.nest.flatten(data.element_spec)
        if hasattr(leaf, "shape")
    )
    n = cardinality(data)
    per_epoch = n if n is not None and n > 0 else None
    remainder = None
    examples, size = batches.num_examples, batches.batch_size
    if not (batches.drop_remainder or static) and examples and size and examples % size:
        remainder = (examples % size, examples)
    return size, static, per_epoch, remainder


# A user's dataset is cached only when its output takes at most this share of the memory
# available.
CACHE_MEMORY_SHARE = 0.25


def _cache_untried(data: tf.data.Dataset, work: Workload, batches: int | None) -> str:
    """Why caching the output of a dataset tfgpu did not build is not tried ("": it is)."""
    why = unrepeatable(data)
    if why:
        return f"{why}: a cache would replay its first epoch"
    if batches is None:
        return "its length is unknown or infinite"
    first = work.guard_batches()[0]
    size = batches * sum(int(getattr(t, "nbytes", 0)) for t in tf.nest.flatten(first))
    available = psutil.virtual_memory().available
    if size > CACHE_MEMORY_SHARE * available:
        return f"about {size / 2**20:,.0f} MiB: more than a quarter of the memory available"
    return ""


def tune(
    model: keras.Model | Callable[[], keras.Model],
    data: tf.data.Dataset,
    *,
    steps: int | None = None,
    time_budget_s: float | None = 300.0,
    change_batch_size: bool = False,
    log_dir: str | os.PathLike[str] | None = None,
    verbose: int | str = "auto",
) -> TuneResult:
    """Tries each speed setting on your model and data, keeps what measurably helps.

    Each candidate (`steps_per_execution`, the mixed precision policy, a static batch shape,
    the pipeline's settings, `jit_compile`, the batch size; on several replicas the
    strategy's all-reduce), in the order the measured step predicts gains most, is timed
    against the best configuration so far in interleaved rounds of `fit`s timed as your own
    `fit` runs (from the start of an epoch, once the step is traced), and kept when the
    whole confidence interval of its gain clears x1.05; one whose interval straddles the
    margin is marked borderline. Settings that can change the loss must also pass a
    numerics guard, and the kept ones are verified together against the baseline. The
    model's state, its strategy's all-reduce and the global precision policy are put back:
    nothing is applied until you apply it. The candidates, the verdicts and the table:
    docs/tuning.md.

    Args:
        model: a compiled `keras.Model`, or a function without arguments that builds and
            compiles one (needed to try a precision policy).
        data: `tf.data.Dataset` of batches (a `tfgpu.data.pipeline` one is rebuilt for the
            pipeline's candidates), or arrays `x`, `(x, y)` or `(x, y, sample_weight)`
            (batched by 32, as `fit` does).
        steps: int or None, timed steps of each timed `fit`, from the start of an epoch
            (>= 3; whole epochs when an epoch is shorter). None: chosen from the measured
            step time, so that every candidate can be measured within the budget.
            Defaults to None.
        time_budget_s: float or None, seconds for the whole call (None: no limit; 60 is the
            quick mode). Defaults to 300.0.
        change_batch_size: bool, whether a faster batch size may be kept (it changes the
            optimization). Defaults to False.
        log_dir: str, os.PathLike or None, a run directory: `tune.json` and the waterfall
            plot `tune.png` are written there (older ones rotated aside). Defaults to None.
        verbose: `"auto"`, 0, 1 or 2, progress lines as `model.fit` shows them.
            Defaults to `"auto"`.

    Returns:
        A `TuneResult`: print it for the table, the verified speedup and the lines to
        change; `result.apply(model)` applies the compile settings.

    Raises:
        TypeError: if `model` is neither a Keras model nor a callable, `data` is neither a
            `tf.data.Dataset` nor arrays, or an argument has the wrong type.
        ValueError: if the model is not compiled, `data` yields single examples or holds
            arrays of different lengths, or a number is out of range. All raised before
            any training.

    Example:

    >>> train = tfgpu.data.pipeline((x, y), batch_size=256)
    >>> result = tfgpu.tune(build_model, train, time_budget_s=60)
    >>> print(result)
    >>> model = result.apply(build_model())
    >>> model.fit(result.dataset, epochs=10)
    """
    check_verbose(verbose)  # every argument checked before the factory runs
    if steps is not None:
        check_int("steps", steps, minimum=3)
    check_bool("change_batch_size", change_batch_size)
    log_path = None if log_dir is None else writable_dir(log_dir)  # before any work
    if not isinstance(model, keras.Model) and not callable(model):
        raise invalid_type(
            "model",
            model,
            "a compiled `keras.Model`, or a function without arguments that builds and "
            "compiles one",
        )
    check_data(data)  # its kind and lengths
    budget_s = check_time_budget(time_budget_s)
    factory: Callable[[], Any] | None = None
    if not isinstance(model, keras.Model):
        factory = model
        model = factory()
    data = check_model_and_data(model, data, from_factory=factory is not None).dataset
    global_batch, static, per_epoch, remainder = _batches(data)

    progress = Progress(verbose, title="tune", budget_s=budget_s, clock=lambda: timing.now())
    budget = timing.Budget(budget_s, MEASURE_SHARE)
    verify_budget = timing.Budget(budget_s, VERIFY_SHARE, start=budget.start)
    progress.phase("reading the model and the data")
    arguments = pipeline_arguments(data)
    facts = Facts(
        steps_per_execution=max(1, int(model.steps_per_execution or 1)),
        jit_compile=bool(model.jit_compile),
        xla_supported=supports_xla(model),
        batches_per_epoch=per_epoch,
        global_batch=global_batch,
        remainder=remainder,
        static_shape=static,
        pipeline=arguments,
        cached=has_step(data, "cache"),
        prefetched=has_step(data, "prefetch"),
        has_factory=factory is not None,
        policy=str(getattr(getattr(model, "dtype_policy", None), "name", "float32")),
        gpu_ccs=tuple(g.compute_capability for g in tf_gpus() if g.compute_capability),
        cpu_native_bf16=_cpu_native_bf16(),
        cpu_count=os.cpu_count() or 1,
        augment_on_batches=_augment_on_batches(arguments),
        all_reduce=describe_all_reduce(model.distribute_strategy),
    )
    work = Workload(model, factory, data, arguments, global_batch)
    if arguments is None:  # another dataset: would caching its output change anything?
        facts = dataclasses.replace(facts, cache_untried=_cache_untried(data, work, per_epoch))
    tuner = _Tuner(work, facts, budget, verify_budget, progress, change_batch_size, steps)
    result = tuner.run()
    return finish(result, budget, log_path, progress, len(result.settings))


class _Tuner:
    """The greedy search and the verification, on one `Workload`."""

    def __init__(
        self,
        work: Workload,
        facts: Facts,
        budget: timing.Budget,
        verify_budget: timing.Budget,
        progress: Progress,
        change_batch_size: bool,
        steps: int | None = None,
    ):
        self.work, self.facts, self.steps = work, facts, steps
        self.model, self.data = work.model, work.dataset
        self.budget, self.verify_budget = budget, verify_budget
        self.progress = progress
        self.change_batch_size = change_batch_size
        self.trials: list[Trial] = []
        self.kept: list[cands.Kept] = []
        self.best: dict[str, Any] = {}
        self.notes: list[str] = []
        self.halted = ""  # why the search stopped: the data or the model raised

    # The search.
    def run(self) -> TuneResult:
        work = self.work
        with preserved(self.model, work.first_inputs()):
            self.progress.phase("timing the baseline")
            with preserved(self.model):
                step_s = work.probe(self.budget.deadline)
            if step_s is None:
                return self._finish(self.facts, untried_all=True)
            input_s = work.input_time(self.budget.deadline)
            facts = self.facts = dataclasses.replace(self.facts, step_s=step_s, input_s=input_s)
            plan = cands.candidates(facts)
            self._shape(facts, [c for c in plan if not c.untried])
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
                    now_s = step_s / math.prod(k.trial.gain or 1.0 for k in self.kept)
                    reason = cands.spe_fits(cand.change["steps_per_execution"], now_s)
                todo = [c for c in plan[i:] if not c.untried and c.group not in stopped]
                # Until a setting is kept there is nothing to verify: its share is the search's.
                self.budget.measure_share = MEASURE_SHARE if self.kept else VERIFY_SHARE
                budget = self._budget_for(cand, todo)
                if not reason and budget is None:
                    reason = cands.BUDGET_SPENT
                if reason or budget is None:
                    self.trials.append(Trial(cand.name, cand.change, reason=reason, line=cand.line))
                    continue
                self.progress.phase(f"trying {cand.name} ({i} of {len(plan)})")
                trial = self._try(cand, budget)
                if cand.group and trial.status != cands.KEPT:
                    stopped[cand.group] = cand.name
            if not self.halted:
                self._batch_size(facts, work.global_batch, step_s)
            for name, _env, line in cands.process_settings(bool(facts.gpu_ccs)):
                self.trials.append(Trial(name, {}, reason=cands.FRESH_PROCESS, line=line))
            self.progress.phase("verifying the kept settings together")
            return self._finish(facts)

    def _shape(self, facts: Facts, todo: list[Candidate]) -> None:
        """Sets the timed fits' shape from the measured step: about the measuring budget over
        the fits that every candidate's rounds and the verification need (or `steps`)."""
        step_s, per_epoch = float(facts.step_s or 0.0), facts.batches_per_epoch
        spe = [int(c.change.get("steps_per_execution", 1)) for c in todo]
        unit = max([facts.steps_per_execution] + [v for v in spe if not cands.spe_fits(v, step_s)])
        if self.steps is not None:
            target = self.steps * step_s
        elif math.isinf(self.budget.left()):
            target = FIT_S[0]
        else:
            fits = (len(todo) + 1) * (2 * timing.MIN_ROUNDS + 1)
            target = min(max(self.budget.left() / fits, FIT_S[1]), FIT_S[2])
        epochs, steps = cands.fit_shape(max(step_s, 1e-9), per_epoch, target, unit)
        self.work.epochs, self.work.steps_per_epoch = epochs, steps
        what = (
            f"{epochs} whole epoch(s) of {per_epoch} batches"
            if steps is None
            else f"the first {steps} steps of an epoch"
        )
        self.notes.append(
            f"each timed fit ran {what}, from the epoch's start, once the step was traced "
            f"(steps of {step_s * 1e3:,.1f} ms as measured first; no validation)"
        )

    def _min_cost(self, cand: Candidate) -> float:
        """About how long `cand` takes at least: three rounds of two timed fits (their steps,
        or as long as such fits took so far), and an untimed fit that traces where it
        changes the step (settings of the pipeline alone share the baseline's)."""
        w, step_s = self.work, float(self.facts.step_s or 0.0)
        steps = w.epochs * (w.steps_per_epoch or self.facts.batches_per_epoch or 1)
        fit_s = max(steps * step_s, stats.median(w.fit_walls) if w.fit_walls else 0.0)
        warm_s = max(fit_s, stats.median(w.warm_walls) if w.warm_walls else 0.0)
        traces = bool(set(cand.change) & set(cands.STEP_KEYS))
        return (warm_s if traces else 0.0) + 2 * timing.MIN_ROUNDS * fit_s

    def _budget_for(self, cand: Candidate, after: list[Candidate]) -> timing.Budget | None:
        """When `cand` should stop taking rounds beyond the first three: what is left, less
        the least the candidates `after` it need, so that each of them is tried; None when
        what is left cannot measure it."""
        left, cost = self.budget.left(), self._min_cost(cand)
        if math.isinf(left):
            return self.budget
        if left < cost:
            return None
        return timing.Budget(max(left - sum(self._min_cost(c) for c in after), cost))

    def _try(self, cand: Candidate, budget: timing.Budget) -> Trial:
        changes = {**self.best, **cand.change}
        work = self.work
        rounds: list[tuple[float, float]] = []
        with recorded() as failure:
            c = self._compare(self.best, changes, self.budget, until=budget)
            rounds = c.rounds
            status, reason = cands.verdict(rounds, c.stopped)
            if status == cands.KEPT and cand.numerics:  # faster: is the loss still right?
                self.progress.phase(f"checking the loss with {cand.name}")
                with preserved(self.model):
                    base_loss = work.mean_loss(self.best)
                    loss = work.mean_loss(changes)
                unsafe = cands.numerics_verdict(base_loss, loss)
                if unsafe:
                    status, reason = cands.UNSAFE, unsafe
        if failure.text is not None:  # a setting that breaks the model or the pipeline ...
            with recorded() as again, preserved(self.model):  # ... or the data itself?
                self.work.run_for(self.best)(self.budget.deadline, None)
            if again.text is not None:
                self.halted = (
                    f"{cands.HALTED}: the training raised without any new setting too "
                    f"({again.text}): the data or the model, not a setting"
                )
                self.notes.append(self.halted)
                return self._add(Trial(cand.name, cand.change, reason=self.halted, line=cand.line))
            return self._add(
                Trial(
                    cand.name, cand.change, status=cands.FAILED, reason=failure.text, line=cand.line
                )
            )
        if status == cands.KEPT and cand.note:
            reason = f"{reason}; {cand.note}"
        g, low, high = timing.gain(rounds)
        trial = Trial(cand.name, cand.change, g, low, high, status, reason, cand.line)
        if status == cands.KEPT:
            self.kept.append(cands.Kept(trial, cand.change, rounds, against_baseline=not self.best))
            self.best = changes
        return self._add(trial)

    def _add(self, trial: Trial) -> Trial:
        self.trials.append(trial)
        return trial

    # The batch size.
    def _batch_size(self, facts: Facts, global_batch: int | None, step_s: float) -> None:
        name = "batch size"
        replicas = int(getattr(self.model.distribute_strategy, "num_replicas_in_sync", 1) or 1)
        if not global_batch:
            self.trials.append(Trial(name, reason="the batch size of the data is unknown"))
            return
        per_replica = max(1, global_batch // replicas)
        sizes = [per_replica * 2**i for i in range(int(math.log2(BATCH_GROWTH)) + 1)]
        # Each size traces its step once and runs a few steps, longer as the batch grows.
        trace_s = stats.median(self.work.warm_walls) if self.work.warm_walls else 0.0
        estimate = sum(trace_s + 4 * step_s * size / per_replica for size in sizes)
        if self.budget.left() <= estimate:
            self.trials.append(Trial(name, reason=cands.BUDGET_SPENT))
            return
        self.progress.phase("finding the batch size")
        from tfgpu import batch_size as batch_size_module

        find = batch_size_module.find_batch_size
        kwargs: dict[str, Any] = dict(
            start=per_replica,
            max_batch_size=per_replica * BATCH_GROWTH,
            max_trials=5,
            steps=3,
            verbose=0,
        )
        with recorded() as failure, preserved(self.model):
            found = find(self.work.model_for(self.best), self.data, **kwargs)
        if failure.text is not None:
            self.trials.append(Trial(name, status=cands.FAILED, reason=failure.text))
            return
        speeds = {t.global_batch_size: t.examples_per_s for t in found.trials if t.fits}
        fastest = found.fastest_global
        if not fastest or fastest == global_batch or fastest not in speeds:
            self.trials.append(
                Trial(
                    name,
                    status=cands.NO_GAIN,
                    reason=f"find_batch_size found no faster batch than {global_batch}",
                )
            )
            return
        lr_note = self._learning_rate_note(global_batch, fastest)
        here = speeds.get(global_batch)
        figures = f"{speeds[fastest]:,.0f} examples/s at {fastest}" + (
            f" vs {here:,.0f} at {global_batch}" if here else ""
        )
        change = {"batch_size": fastest}
        line = cands.line_for(change, facts) + (f"  # {lr_note}" if lr_note else "")
        if not self.change_batch_size:
            self.trials.append(
                Trial(
                    f"{name} {fastest}",
                    change,
                    reason=(
                        f"changes the optimization; find_batch_size: {figures}"
                        + (f", {lr_note}" if lr_note else "")
                        + "; pass change_batch_size=True to try it"
                    ),
                    line=line,
                )
            )
            return
        cand = Candidate(f"{name} {fastest}", change, line)
        budget = self._budget_for(cand, [])
        if budget is None:
            self.trials.append(
                Trial(f"{name} {fastest}", change, reason=cands.BUDGET_SPENT, line=line)
            )
            return
        self._try(cand, budget)

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
    def _finish(self, facts: Facts, untried_all: bool = False) -> TuneResult:
        if untried_all:
            self.trials = [
                Trial(c.name, c.change, reason=c.untried or cands.BUDGET_SPENT, line=c.line)
                for c in cands.candidates(facts)
            ]
            self.notes.append("the baseline could not be timed within the time budget")
            return TuneResult(trials=self.trials, notes=self.notes, dataset=self.data)
        speedup = cands.verify(self.kept, self._together, self.notes)
        settings: dict[str, Any] = {}
        for k in self.kept:
            settings.update(k.change)
        lines = cands.combined_lines([(k.change, k.trial.line) for k in self.kept], facts)
        base = stats.median(self.work.base_times)
        base_eps = 1.0 / base if base and math.isfinite(base) and base > 0 else math.nan
        dataset = self.data
        if any(k in settings for k in cands.PIPELINE_KEYS):
            dataset = self.work.dataset_for(settings)[0]
        return TuneResult(
            trials=self.trials,
            baseline_examples_per_s=base_eps,
            tuned_examples_per_s=base_eps * speedup[0],
            speedup=speedup[0],
            speedup_low=speedup[1],
            speedup_high=speedup[2],
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
        """`changes` against `base` in interleaved rounds until `cands.decided`, the model put
        back afterwards; past `until`, no round beyond the first three."""
        w = self.work

        def done(rounds: list[tuple[float, float]]) -> bool:
            return cands.decided(rounds) or (until is not None and until.left() <= 0)

        steps = w.epochs * (w.steps_per_epoch or self.facts.batches_per_epoch or 1)
        with preserved(self.model):
            return timing.compare(
                w.run_for(base),
                {"variant": w.run_for(changes)},
                threshold=cands.MARGIN,
                budget=budget,
                max_rounds=MAX_ROUNDS,
                timed_units=steps * int(w.global_batch or 1),
                done=done,
                clearly_slower=CLEARLY_SLOWER,
            )["variant"]
