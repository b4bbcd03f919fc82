"""tfgpu._internal.measure.timing: the one timing engine, on scripted runs and a scripted clock.

No test here times anything real: each run returns a scripted number of seconds and
advances a scripted clock, so the rounds, their order and every stop are deterministic.
"""

from __future__ import annotations

import math

import pytest

from tests.conftest import ScriptedTiming
from tfgpu._internal.measure import rules, timing


class _Runs:
    """Runs that return scripted seconds and log the order they ran in, on the clock of the
    suite's scripted engine (`tests.conftest.ScriptedTiming`)."""

    def __init__(self, monkeypatch, seconds_per_run: float = 10.0):
        self.engine = ScriptedTiming(monkeypatch)
        self.engine.clock = 0.0
        self.limits: list[tuple[str, float | None]] = []  # (name, limit) of each call
        self.seconds_per_run = seconds_per_run

    @property
    def clock(self) -> float:
        return self.engine.clock

    @property
    def log(self) -> list[str]:
        return [name for name, _ in self.limits]

    def run(self, name: str, times):
        return self.engine.runs(name, times, self.limits, self.seconds_per_run)


def test_the_order_rotates_from_round_to_round(monkeypatch):
    runs = _Runs(monkeypatch)
    out = timing.compare(
        runs.run("base", 1.0),
        {"a": runs.run("a", 0.5), "b": runs.run("b", 0.5)},
        margin=1.05,
        max_rounds=3,
    )
    assert runs.log == ["a", "b", "base", "b", "base", "a", "base", "a", "b"]
    assert out["a"].rounds == [(1.0, 0.5)] * 3 and out["a"].stopped is None


def test_a_variant_closes_once_settled_and_the_others_go_on(monkeypatch):
    runs = _Runs(monkeypatch)
    noisy = [0.5, 1.5, 0.5, 0.5, 1.5, 0.5, 0.5]  # x2 or x0.67: the interval straddles x1.05
    out = timing.compare(
        runs.run("base", 1.0),
        {"fast": runs.run("fast", 0.5), "noisy": runs.run("noisy", lambda n: noisy[n])},
        margin=1.05,
        max_rounds=7,
        clearly_slower=None,
    )
    assert len(out["fast"].rounds) == rules.MIN_ROUNDS  # settled: x2 in every round
    assert len(out["noisy"].rounds) == 7 and out["noisy"].stopped is None
    assert runs.log.count("fast") == rules.MIN_ROUNDS


def test_clearly_slower_stops_after_one_round_unless_disabled(monkeypatch):
    runs = _Runs(monkeypatch)
    slow = 1.01 * rules.CLEARLY
    out = timing.compare(runs.run("base", 1.0), {"slow": runs.run("slow", slow)}, max_rounds=5)
    assert out["slow"].stopped == "slower" and len(out["slow"].rounds) == 1
    runs = _Runs(monkeypatch)
    out = timing.compare(
        runs.run("base", 1.0), {"slow": runs.run("slow", slow)}, max_rounds=5, clearly_slower=None
    )
    assert out["slow"].stopped is None and len(out["slow"].rounds) == rules.MIN_ROUNDS


def test_a_failure_of_the_listed_kinds_closes_that_variant_only(monkeypatch):
    runs = _Runs(monkeypatch)
    out = timing.compare(
        runs.run("base", 1.0),
        {"broken": runs.run("broken", ValueError("bad setting")), "ok": runs.run("ok", 0.5)},
        margin=1.05,
        failures=(ValueError,),
    )
    assert out["broken"].error == "ValueError: bad setting" and out["broken"].rounds == []
    assert len(out["ok"].rounds) == rules.MIN_ROUNDS
    assert runs.log.count("broken") == 1
    with pytest.raises(KeyError):  # not listed: the caller's boundary decides
        timing.compare(runs.run("base", 1.0), {"x": runs.run("x", KeyError("k"))})


def test_the_budget_stops_every_open_variant(monkeypatch):
    runs = _Runs(monkeypatch, seconds_per_run=10.0)
    budget = timing.Budget(45.0, start=0.0)
    out = timing.compare(
        runs.run("base", 1.0),
        {"a": runs.run("a", lambda n: [0.5, 1.5][n % 2])},
        margin=1.05,
        budget=budget,
        max_rounds=7,
        clearly_slower=None,
    )
    assert out["a"].stopped == "budget"
    assert len(out["a"].rounds) == 3 and runs.clock == 60.0  # rounds start before 45 s only


def test_a_run_cut_before_one_timed_step_is_the_budget(monkeypatch):
    runs = _Runs(monkeypatch)
    out = timing.compare(runs.run("base", lambda n: [1.0, None][n]), {"a": runs.run("a", 0.9)})
    assert out["a"].stopped == "budget" and len(out["a"].rounds) == 1


def test_first_base_is_round_one_s_baseline_and_done_replaces_the_interval(monkeypatch):
    runs = _Runs(monkeypatch)
    out = timing.compare(
        runs.run("base", 1.0),
        {"real": runs.run("real", 3.0)},
        first_base=2.0,
        clearly_slower=None,
        done=lambda rounds: len(rounds) >= 4,
        max_rounds=9,
    )
    assert out["real"].rounds == [(2.0, 3.0), (1.0, 3.0), (1.0, 3.0), (1.0, 3.0)]
    assert runs.log.count("base") == 3


def test_variants_are_limited_to_a_multiple_of_the_baseline_s_timed_part(monkeypatch):
    runs = _Runs(monkeypatch)
    timing.compare(runs.run("base", 2.0), {"a": runs.run("a", 1.0)}, timed_units=10, margin=1.05)
    limits = [limit for name, limit in runs.limits if name == "a"]
    assert limits[0] is None  # round one: the baseline's time is not known yet
    assert all(math.isclose(x, timing.FIT_LIMIT_FACTOR * (2.0 * 10 + 1.0)) for x in limits[1:])
    assert all(limit is None for name, limit in runs.limits if name == "base")


@pytest.mark.slow
def test_a_timed_fit_runs_free_of_garbage_collection_and_restores_the_setting():
    import gc

    import keras
    import numpy as np
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    ds = tf.data.Dataset.from_tensors((np.zeros((8, 4), "f4"), np.zeros((8, 1), "f4"))).repeat()
    seen: list[tuple[str, int]] = []

    def plant_cycles_in_every_step(batch, logs=None):
        for _ in range(3000):  # enough to pass every generation's threshold many times
            a: list = []
            a.append(a)

    def record(phase, info):
        seen.append((phase, info["generation"]))

    planter = keras.callbacks.LambdaCallback(on_train_batch_end=plant_cycles_in_every_step)
    original = timing.Timer

    during: list[int] = []  # collections seen so far, at each step's end

    class Planting(original):  # the timed fit's own callback, planting garbage as it runs
        def on_train_batch_end(self, batch, logs=None):
            planter.on_train_batch_end(batch, logs)
            during.append(len(seen))
            super().on_train_batch_end(batch, logs)

    gc.callbacks.append(record)
    try:
        timing.Timer = Planting
        for _ in range(1000):  # garbage planted beforehand too
            b: list = []
            b.append(b)
        seen.clear()
        assert gc.isenabled()
        assert timing.fit_step_time(model, ds, steps=6, warmup=2) is not None
    finally:
        timing.Timer = original
        gc.callbacks.remove(record)
    # One collection of the young generations (what the last window allocated is young), the
    # one before the window; none while the steps ran.
    assert seen[:2] == [("start", 1), ("stop", 1)]
    assert len(during) >= 8 and set(during) == {2}
    assert gc.isenabled()  # the setting put back
    gc.disable()
    try:
        timing.fit_step_time(model, ds, steps=6, warmup=2)
        assert not gc.isenabled()  # a user's disabled gc stays disabled
    finally:
        gc.enable()


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_an_epoch_is_timed_whole_and_its_steps_counted_as_they_ran(monkeypatch):
    import keras
    import numpy as np
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=4)
    x, y = np.zeros((40, 4), "f4"), np.zeros((40, 1), "f4")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # 10 batches: calls of 4, 4, 2
    seen: list[int] = []
    original = timing._EpochTimer.on_epoch_end

    def record(self, epoch, logs=None):
        original(self, epoch, logs)
        seen.append(self.steps)

    monkeypatch.setattr(timing._EpochTimer, "on_epoch_end", record)
    assert timing.epoch_time(model, ds, epochs=2, steps_in_epoch=10) > 0
    assert seen == [10, 20]  # the last call's 2 steps, not Keras's 4
    seen.clear()
    assert timing.epoch_time(model, ds.repeat(), 1, steps_per_epoch=8) > 0
    assert seen == [8]
    monkeypatch.setattr(timing, "now", lambda: 10.0)
    assert timing.epoch_time(model, ds, deadline=5.0) is None  # cut by the deadline
