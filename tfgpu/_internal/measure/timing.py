"""The one timing engine of the measuring core: the timed fits, the `Budget`, and `compare`
(docs/architecture.md, "The measuring core"). `now` and the timed fits are module attributes:
the tests' scripted engine (tests/conftest.py, `ScriptedTiming`) replaces them."""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import keras

from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.warn import one_line
from tfgpu._internal.measure.reader import read_alone
from tfgpu._internal.measure.rules import CLEARLY, MARGIN, MAX_ROUNDS, MIN_ROUNDS, decided

# A variant's timed steps run at most this many times as long as the baseline's.
FIT_LIMIT_FACTOR = 3.0

now = time.perf_counter


class Timer(keras.callbacks.Callback):
    """Times each call of the train function; stops `fit` at `deadline` (on `now`'s clock), or
    `timed_limit_s` after the warm-up calls."""

    def __init__(self, calls_warm: int = 0, deadline=None, timed_limit_s=None):
        super().__init__()
        self.times: list[float] = []
        self.calls_warm, self.deadline, self.timed_limit_s = calls_warm, deadline, timed_limit_s
        self.warm_at: float | None = None

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())
        if self.deadline is None and self.timed_limit_s is None:
            return
        t = now()
        if len(self.times) == self.calls_warm:
            self.warm_at = t
        late = self.deadline is not None and t >= self.deadline
        if self.timed_limit_s is not None and self.warm_at is not None:
            late = late or t - self.warm_at >= self.timed_limit_s
        if late:
            self.model.stop_training = True

    def step_time(self, spe: int) -> float | None:
        """Seconds per step: the median timed call over its `spe` steps (None: no call timed)."""
        gaps = [b - a for a, b in itertools.pairwise(self.times[self.calls_warm - 1 :])]
        return stats.median(gaps) / spe if gaps else None


def call_counts(spe: int, steps: int, warmup: int) -> tuple[int, int]:
    """(warm-up calls, timed calls) of a train function that runs `spe` steps per call, for
    `warmup` and `steps` steps: at least 2 and 6."""
    return max(2, math.ceil(warmup / spe)), max(6, math.ceil(steps / spe))


@contextlib.contextmanager
def collected_before() -> Iterator[None]:
    """The young generations collected now and no collection inside the body; the user's
    setting put back. Earlier fits leave cycles (distributed iterators: tens of thousands of
    objects) whose collection takes seconds: inside a timed window that noise can flip a
    decision. Everything a body allocates stays young (the collector is off), so collecting
    generations 0 and 1 frees the last fit's cycles; a full collection would also walk every
    object of the process, each time (0.3 s a call in a long-lived process, measured in the
    test suite's workers)."""
    gc.collect(1)
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def fit_once(
    model: Any, dataset: Any, timer: Any, epochs: int = 1, steps: int | None = None
) -> None:
    """One `fit` with `timer` its only callback, garbage collected before; Keras's warning
    that an epoch ran out of data is about our fit, not the user's: not shown."""
    with collected_before(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        model.fit(
            dataset,
            epochs=epochs,
            steps_per_epoch=steps,
            verbose=0,
            shuffle=False,
            callbacks=[timer],
        )
    model.stop_training = False


def fit_step_time(
    model, dataset, steps: int, warmup: int, deadline=None, timed_limit_s=None
) -> float | None:
    """Seconds per step from `fit`: the median timed call after warm-up; None if cut before one."""
    spe = max(1, int(model.steps_per_execution))
    calls_warm, calls_timed = call_counts(spe, steps, warmup)
    timer = Timer(calls_warm, deadline, timed_limit_s)
    fit_once(model, dataset, timer, steps=(calls_warm + calls_timed) * spe)
    return timer.step_time(spe)


class _EpochTimer(keras.callbacks.Callback):
    """Seconds and steps of each epoch, from its start (before its iterator is made) to its
    end; stops `fit` at `deadline` (on `now`'s clock), or `timed_limit_s` into the fit."""

    def __init__(self, deadline, timed_limit_s, steps_in_epoch):
        super().__init__()
        self.deadline, self.timed_limit_s = deadline, timed_limit_s
        self.steps_in_epoch = steps_in_epoch
        self.seconds, self.steps, self.cut = 0.0, 0, False
        self.begin, self.started, self.epoch_steps = 0.0, 0.0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.begin = time.perf_counter()
        self.started = self.started or now()
        self.epoch_steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.epoch_steps = batch + 1  # the last step of the call (Keras passes its index)
        t = now()
        late = self.deadline is not None and t >= self.deadline
        if late or (self.timed_limit_s is not None and t - self.started >= self.timed_limit_s):
            self.cut = self.cut or late
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.seconds += time.perf_counter() - self.begin
        steps = self.epoch_steps
        if self.steps_in_epoch:  # a last call that ran out of data ran fewer steps
            steps = min(steps, self.steps_in_epoch)
        self.steps += steps


def epoch_time(
    model,
    dataset,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    steps_in_epoch: int | None = None,
    deadline=None,
    timed_limit_s=None,
) -> float | None:
    """Seconds per step over `epochs` epochs of `fit` (or their first `steps_per_epoch`
    steps), each timed from its start (the iterator made, a last partial call included), as
    the user's `fit` sees them; `steps_in_epoch`: a whole epoch's batches, when known. None
    when the deadline cut it."""
    timer = _EpochTimer(deadline, timed_limit_s, steps_in_epoch)
    fit_once(model, dataset, timer, epochs, steps_per_epoch)
    if timer.cut or not timer.steps:
        return None
    return timer.seconds / timer.steps


def probe_step_time(model, dataset, deadline=None, timed_limit_s=None) -> float | None:
    """Seconds per step of a short `fit`: the median of the (at most two) calls after the one
    that traces, those past `timed_limit_s` after it not run; None when cut before one."""
    spe = max(1, int(model.steps_per_execution))
    timer = Timer(1, deadline, timed_limit_s)
    fit_once(model, dataset, timer, steps=3 * spe)
    return timer.step_time(spe)


def call_time(fn: Callable[[], Any], calls: int) -> float:
    """Seconds per call of `fn` (which must return once its work is done, as `train_on_batch`
    does), the median over `calls` calls after one untimed call; garbage collected before."""
    fn()  # trace and warm up
    times = []
    with collected_before():
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return stats.median(times)


@dataclass
class Budget:
    """A time budget on `now`'s clock (`seconds` None: no limit); measuring stops at
    `measure_share` of it (`deadline`), the rest is the caller's."""

    seconds: float | None
    measure_share: float = 1.0
    start: float = field(default_factory=lambda: now())

    @property
    def deadline(self) -> float | None:
        """When measuring stops, on `now`'s clock (None: never)."""
        if self.seconds is None:
            return None
        return self.start + self.measure_share * self.seconds

    def elapsed(self) -> float:
        """Seconds since the budget started."""
        return now() - self.start

    def left(self) -> float:
        """Seconds of measuring left (inf without a limit; <= 0 when spent)."""
        deadline = self.deadline
        return math.inf if deadline is None else deadline - now()


# One variant's timed run: (deadline, timed_limit_s) -> seconds per unit, or None when the
# deadline came before a timed step.
Run = Callable[[float | None, float | None], float | None]


@dataclass
class Comparison:
    """One variant against the baseline: its rounds (baseline s, variant s), why it stopped
    early (`"slower"` after round one, `"budget"`: spent, or a run cut before one timed step;
    None: settled or out of rounds), and its run's `error` (one of `compare`'s `failures`)."""

    rounds: list[tuple[float, float]] = field(default_factory=list)
    stopped: str | None = None
    error: str = ""


def compare(
    base: Run,
    variants: dict[str, Run],
    *,
    margin: float = MARGIN,
    budget: Budget | None = None,
    max_rounds: int = MAX_ROUNDS,
    timed_units: int = 6,
    first_base: float | None = None,
    done: Callable[[list[tuple[float, float]]], bool] | None = None,
    clearly_slower: float | None = CLEARLY,
    clearly_faster: float | None = None,
    failures: tuple[type[BaseException], ...] = (),
    describe: Callable[[BaseException], str] = one_line,
) -> dict[str, Comparison]:
    """The baseline and each open variant in interleaved rounds, in a rotating order; returns a
    `Comparison` per variant.

    A variant closes after `MIN_ROUNDS` once `done` (default: `rules.decided` on `margin`), after
    round one when it is `clearly_slower` or `clearly_faster` (None: never; its `stopped` says
    which), when the budget is spent, or when its run
    raises one of `failures` (its `error`). Its timed part is limited to `FIT_LIMIT_FACTOR`
    times the baseline's (`timed_units` of it, plus a second). `first_base`: the baseline's
    time of round one, already measured.
    """
    budget = budget or Budget(None)
    settled = done or functools.partial(decided, margin=margin)
    out = {name: Comparison() for name in variants}
    limit: float | None = None
    for i in range(max_rounds):
        active = [
            name
            for name, c in out.items()
            if c.stopped is None and not c.error and not (i >= MIN_ROUNDS and settled(c.rounds))
        ]
        if not active:
            break
        if i > 0 and budget.left() <= 0:
            for stopped in active:
                out[stopped].stopped = "budget"
            break
        order: list[str | None] = [*active, None]  # None: the baseline
        order = order[i % len(order) :] + order[: i % len(order)]
        times: dict[str | None, float | None] = {}
        for name in order:
            if name is None:
                given = first_base if i == 0 else None
                times[None] = base(budget.deadline, None) if given is None else given
                continue
            try:
                times[name] = variants[name](budget.deadline, limit)
            except failures as e:
                out[name].error = describe(e)
        b = times.get(None)
        for name in active:
            v = times.get(name)
            if out[name].error:
                continue
            if b is None or v is None:
                out[name].stopped = "budget"
                continue
            out[name].rounds.append((b, v))
            if i == 0 and clearly_slower is not None and v > clearly_slower * b:
                out[name].stopped = "slower"
            elif i == 0 and clearly_faster is not None and b > clearly_faster * v:
                out[name].stopped = "faster"
        if limit is None and b is not None:
            limit = FIT_LIMIT_FACTOR * (b * timed_units + 1.0)
    return out


def input_time(dataset: Any, batches: int = 10) -> float | None:
    """Seconds per batch of `dataset` read alone (the bounded reader); None if it is unreadable."""
    try:
        result = read_alone(dataset, batches, 1)
    except ValueError:  # no batch at all
        return None
    return 1.0 / result.batches_per_s if result.batches_per_s > 0 else None
